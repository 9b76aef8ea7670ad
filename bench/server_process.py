"""Start and stop a real `ahc serve` process for a benchmark (the same server a user runs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from ahc.config import REPO_ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerProcess:
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 60) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def ensure_model(path: Path, *size_flags: str) -> Path:
    """Build a random model with `ahc tiny-model` once (cached under .cache/models)."""
    if not (path / "config.json").exists():
        ahc = str(Path(sys.executable).with_name("ahc"))
        subprocess.run([ahc, "tiny-model", str(path), *size_flags], check=True, capture_output=True)
    return path


def start(model: Path, data_dir: Path, *extra: str, timeout: float = 600, lens: str = "off") -> ServerProcess:
    """`lens`: a lens pack directory for `model`, or "off" (cpu-tiny.yaml's pack is the tiny model's)."""
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "server.log"
    cmd = [str(Path(sys.executable).with_name("ahc")), "serve", "--config", str(REPO_ROOT / "configs" / "cpu-tiny.yaml"),
           "--port", str(port), "--model", str(model), "--data-dir", str(data_dir), "--lens", lens, *extra]
    with log.open("w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=dict(os.environ))
    return wait_healthy(ServerProcess(process, port, log), timeout)


def wait_healthy(server: ServerProcess, timeout: float) -> ServerProcess:
    """Wait for GET /health to answer 200; a server that exits or never gets there is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited:\n{server.log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"server not ready after {timeout} s:\n{server.log.read_text()[-3000:]}")


def alternating_rounds(measure_on: list[Callable[[], float]], rounds: int) -> list[list[float]]:
    """A warm-up on each server, then `rounds` measured rounds of each, the order alternating round by
    round: servers measured in one run share the machine's drift, which is larger here than the
    effects measured."""
    for measure in measure_on:
        measure()
    results: list[list[float]] = [[] for _ in measure_on]
    order = list(range(len(measure_on)))
    for r in range(rounds):
        for side in (order if r % 2 == 0 else order[::-1]):
            results[side].append(measure_on[side]())
    return results
