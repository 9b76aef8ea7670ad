"""A child HTTP server process (`ahc serve`, or any other): started on a free port with its log in a file,
ready once GET /health answers 200, stopped with SIGTERM then SIGKILL. The cluster starts its replicas
with it; the benchmarks and the tests start theirs through bench/servers.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import openai

from core.config import CHECKOUT
from server.cluster import fork_server
from server.cluster.fork_server import ForkedProcess

AHC = str(Path(sys.executable).with_name("ahc"))
# The server speaks plain HTTP on the loopback: a client made for it needs no TLS context, whose default
# loads the system's CA bundle (~25 ms of CPU for each client made).
VERIFY_TLS = False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """A running server: its process, where it listens, where it logs."""

    process: subprocess.Popen[bytes] | ForkedProcess
    port: int
    log: Path
    api_key: str | None = None
    data_dir: Path | None = None  # the XDB directory of an `ahc serve`

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 120, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("http_client", openai.DefaultHttpxClient(verify=VERIFY_TLS))
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key or "none",
                             max_retries=0, timeout=timeout, **kwargs)

    def http(self, timeout: float = 120) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, verify=VERIFY_TLS)

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
        return self.process.wait()


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ plus `env`, with this checkout (when running from one) first on PYTHONPATH: the installed
    `ahc` may be an editable install of another checkout (git worktrees sharing one virtualenv), and the
    server must run the code under test."""
    merged = {**os.environ, **(env or {})}
    if CHECKOUT is not None:
        paths = [p for p in merged.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(CHECKOUT)]
        merged["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *paths])
    return merged


def start_process(cmd: Sequence[str], out: IO[Any], env: Mapping[str, str] | None = None,
                  err: IO[Any] | None = None, session: bool = False) -> subprocess.Popen[bytes] | ForkedProcess:
    """`cmd` in this checkout with its stdout to `out` and its stderr to `err` (else `out` too), in a session of
    its own with `session`: forked by the fork server AHC_FORK_SERVER names where there is one and it takes
    the command, started afresh otherwise."""
    merged = child_env(env)
    path = os.environ.get(fork_server.ENV)
    forked = fork_server.start(path, cmd, out, CHECKOUT, merged, err=err, session=session) if path else None
    if forked is not None:
        return forked
    return subprocess.Popen(list(cmd), stdout=out, stderr=err if err is not None else subprocess.STDOUT,
                            cwd=CHECKOUT, env=merged, start_new_session=session)


def launch(cmd: Sequence[str], port: int, log: Path, *, env: Mapping[str, str] | None = None,
           api_key: str | None = None, data_dir: Path | None = None, timeout: float = 600) -> ServerProcess:
    """Run any HTTP server command (ours, or vLLM's own for comparison) and wait until it is healthy."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = start_process(cmd, out, env)
    return wait_healthy(ServerProcess(process, port, log, api_key, data_dir), timeout)


def wait_healthy(server: ServerProcess, timeout: float) -> ServerProcess:
    """Wait for GET /health to answer 200; a server that exits or never gets there is an error."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=server.base_url, timeout=2, verify=VERIFY_TLS) as http:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log_tail()}")
            try:
                if http.get("/health").status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"server not ready after {timeout} s:\n{server.log_tail()}")
