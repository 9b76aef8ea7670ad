"""One real `ahc serve` (vLLM CPU engine, tiny model) per test session, reached over real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from bench.server_process import free_port

REPO = Path(__file__).resolve().parents[1]
AHC = str(Path(sys.executable).with_name("ahc"))
TINY_MODEL = REPO / ".cache" / "models" / "tiny"
API_KEY = "test-key"


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    data_dir: Path
    log: Path
    api_key: str | None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key or "none",
                             max_retries=0, timeout=120, **kwargs)

    def http(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=120)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def start_server(data_dir: Path, port: int | None = None, api_key: str | None = API_KEY,
                 extra: list[str] | None = None, timeout: float = 300, config: Path | None = None) -> Server:
    port = port or free_port()
    log = data_dir.parent / f"server-{port}.log"
    cmd = [AHC, "serve", "--config", str(config or REPO / "configs" / "cpu-tiny.yaml"), "--port", str(port),
           "--model", str(TINY_MODEL), "--data-dir", str(data_dir), *(extra or [])]
    if api_key:
        cmd += ["--api-key", api_key]
    with log.open("w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                   env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    server = Server(process, port, data_dir, log, api_key)
    wait_ready(server, timeout)
    return server


def wait_ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"ahc serve exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"ahc serve not ready after {timeout} s:\n{server.log_tail()}")


def stop_server(server: Server, timeout: float = 60) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


def recall(server, **params) -> list[dict]:
    with server.http() as http:
        response = http.get("/v1/xdb/recall", params={"limit": 1000, **params})
    assert response.status_code == 200, response.text
    return response.json()["data"]


def recall_until(server, count: int, timeout: float = 1.0, **params) -> list[dict]:
    """Rows must be queryable within 1 s of the response (SPEC §5)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = recall(server, **params)
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    if not (TINY_MODEL / "config.json").exists():
        raise RuntimeError("the tiny model is missing: run `make setup` first")
    srv = start_server(tmp_path_factory.mktemp("serve") / "xdb")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="session")
def model_name(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def no_whitespace_bias() -> dict[str, int]:
    """logit_bias banning whitespace-only tokens. A random model pads tool-call JSON with every space
    the grammar allows (vLLM's tool structural tags allow any); the tests check plumbing, not style."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    return {str(i): -100 for i in range(len(tokenizer))
            if (text := tokenizer.decode([i])) and not text.strip()}
