"""Start and stop a real `ahc serve` process (the server a user runs), for the tests and the benchmarks.

One launcher for both, so a test and a benchmark start the server the same way: a free port, the log
in a file beside the data directory, GET /health polled until it answers 200.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from ahc.core.config import CHECKOUT, cache_dir

AHC = str(Path(sys.executable).with_name("ahc"))
TINY_MODEL = cache_dir() / "models" / "tiny"
DEFAULT_CONFIG = "cpu-tiny"  # the bundled example
# The real model `ahc model pull smollm2-135m` sets up, and its bundled config (lens included).
REAL_MODEL = cache_dir() / "models" / "smollm2-135m"
REAL_CONFIG = "cpu-small"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """A running server: its process, where it listens, where it logs."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    api_key: str | None = None
    data_dir: Path | None = None  # the XDB directory of an `ahc serve`

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 120, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key or "none",
                             max_retries=0, timeout=timeout, **kwargs)

    def http(self, timeout: float = 120) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (the server drains), SIGKILL after `timeout`; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ plus `env`, with this checkout (when running from one) first on PYTHONPATH: the installed
    `ahc` may be an editable install of another checkout (git worktrees sharing one virtualenv), and the
    server must run the code under test."""
    merged = {**os.environ, **(env or {})}
    if CHECKOUT is not None:
        paths = [p for p in merged.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(CHECKOUT)]
        merged["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *paths])
    return merged


def launch(cmd: Sequence[str], port: int, log: Path, *, env: Mapping[str, str] | None = None,
           api_key: str | None = None, data_dir: Path | None = None, timeout: float = 600) -> ServerProcess:
    """Run any HTTP server command (ours, or vLLM's own for comparison) and wait until it is healthy."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=CHECKOUT, env=child_env(env))
    return wait_healthy(ServerProcess(process, port, log, api_key, data_dir), timeout)


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


def wait_healthy(server: ServerProcess, timeout: float) -> ServerProcess:
    """Wait for GET /health to answer 200; a server that exits or never gets there is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"server not ready after {timeout} s:\n{server.log_tail()}")


def ensure_model(path: Path, *size_flags: str) -> Path:
    """Build a random model with `ahc tiny-model` once (cached under .cache/models)."""
    if not (path / "config.json").exists():
        subprocess.run([AHC, "tiny-model", str(path), *size_flags], check=True, capture_output=True,
                       env=child_env())
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
        for server in servers:
            server.stop()
        raise errors[0]
    return servers
