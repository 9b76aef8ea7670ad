"""Start real `ahc serve` processes the way a user does, for the benchmarks and the tests: the models and
configs they serve, a server on a free port with its log beside its data directory, several started
together, and the reads of XDB and /metrics they check results with.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from core.config import cache_dir
from server.cluster.server_process import AHC, ServerProcess, child_env, free_port, launch

TINY_MODEL = cache_dir() / "models" / "tiny"
DEFAULT_CONFIG = "cpu-tiny"  # the bundled example
# The real model `ahc model pull smollm2-135m` sets up, and its bundled config (lens included).
REAL_MODEL = cache_dir() / "models" / "smollm2-135m"
REAL_CONFIG = "cpu-small"


def start_server(data_dir: Path, *, model: Path = TINY_MODEL, config: Path | str = DEFAULT_CONFIG,
                 port: int | None = None, api_key: str | None = None, lens: str | None = None,
                 extra: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, timeout: float = 600) -> ServerProcess:
    """`ahc serve` on `model` with `config`; `lens`: a lens pack directory for `model`, "off", or None
    for the config's own. The log is `server-PORT.log` beside `data_dir`, so a restart on the same data
    directory keeps it clean."""
    port = port or free_port()
    cmd = [AHC, "serve", "--config", str(config), "--port", str(port), "--model", str(model),
           "--data-dir", str(data_dir), *extra]
    if lens is not None:
        cmd += ["--lens", lens]
    if api_key:
        cmd += ["--api-key", api_key]
    return launch(cmd, port, data_dir.parent / f"server-{port}.log", env=env, api_key=api_key, data_dir=data_dir,
                  timeout=timeout)


def ensure_model(path: Path, *size_flags: str) -> Path:
    """Build a random model with `ahc tiny-model` once (cached under .cache/models)."""
    return build_once(path, lambda tmp: subprocess.run([AHC, "tiny-model", str(tmp), *size_flags], check=True,
                                                       capture_output=True, env=child_env()))


def build_once(path: Path, build: Callable[[Path], object]) -> Path:
    """`path`, built by `build` into a directory of its own and renamed into place: benchmarks and tests
    run side by side, and one must never see (or serve) another's half-written build."""
    if path.is_dir():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}-") as tmp:
        build(Path(tmp) / "out")
        try:
            os.rename(Path(tmp) / "out", path)
        except OSError:
            if not path.is_dir():  # not a build that finished first
                raise
    return path


def recall(server: ServerProcess, **params: Any) -> list[dict[str, Any]]:
    """GET /v1/xdb/recall (up to 1000 rows)."""
    with server.http() as http:
        response = http.get("/v1/xdb/recall", params={"limit": 1000, **params})
    if response.status_code != 200:
        raise RuntimeError(f"recall answered {response.status_code}: {response.text}")
    rows: list[dict[str, Any]] = response.json()["data"]
    return rows


def recall_until(server: ServerProcess, count: int, timeout: float = 1.0, **params: Any) -> list[dict[str, Any]]:
    """Recall until `count` rows are there or `timeout` passes: rows become queryable within 1 s of
    the response that produced them."""
    deadline = time.monotonic() + timeout
    while True:
        rows = recall(server, **params)
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def scrape_metrics(base_url: str, summed: tuple[str, ...] = ("ahc_",), **labels: str) -> dict[str, float]:
    """The server's /metrics: every unlabelled sample, and every one whose name starts with one of
    `summed` (vLLM's are labelled by engine and model, e.g. "vllm:prefix_cache_") summed over its
    series (those matching `labels` where given, e.g. kind="agent")."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics").text):
        for sample in family.samples:
            if sample.name.startswith(summed):
                if all(sample.labels.get(k, v) == v for k, v in labels.items()):
                    samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
            elif not sample.labels:
                samples[sample.name] = sample.value
    return samples


def start_together(starts: Sequence[Callable[[], ServerProcess]]) -> list[ServerProcess]:
    """Servers started at once (start-up is mostly waiting), in order; one failing stops the others and
    its error is raised."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = [pool.submit(start) for start in starts]
    servers, errors = [], []
    for future in futures:
        try:
            servers.append(future.result())
        except Exception as exc:  # noqa: BLE001 - re-raised once the others are stopped
            errors.append(exc)
    if errors:
        stop_together(servers)
        raise errors[0]
    return servers


def stop_together(servers: Sequence[ServerProcess]) -> None:
    """Servers stopped at once: a stop mostly waits for a drain (vLLM's own server takes ~3 s)."""
    if servers:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda server: server.stop(), servers))
