"""vLLM's router (the real `vllm-router`) in front of fake OpenAI workers, and `server.cluster.router`.

What the router passes through, rewrites and retries, how `consistent_hash` keeps a session on one worker,
and how fast a killed worker's sessions move; the wrapper's command line, validation and start/stop.
The workers are fakes on purpose: the test isolates the router.

Run as a script (`python tests/test_router.py NAME FD`), this file is one fake worker serving on the
listening socket FD, so a test can SIGKILL a worker like a crashed replica.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from server.cluster.router import RouterProcess, RouterSpec, router_command, router_executable
from server.cluster.server_process import free_port

REPO = Path(__file__).resolve().parent.parent
STREAM_CHUNKS = 4
STREAM_DELAY_S = 0.15
RETRIED = 6  # RouterSpec.retry_max_retries: attempts in all


# --- the fake worker --------------------------------------------------------------------------------


def sse_events(worker: str) -> list[bytes]:
    """The exact bytes a fake worker streams, one event per chunk, OpenAI's chunk shape."""
    chunks = [{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": worker,
               "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}]}
              for i in range(STREAM_CHUNKS)]
    return [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks] + [b"data: [DONE]\n\n"]


def openai_error(status: int) -> dict:
    return {"error": {"message": f"fake failure {status}", "type": "invalid_request_error", "param": "fail",
                      "code": "fake"}}


def worker_app(name: str) -> Starlette:
    """/health, /v1/models, and a chat route that echoes what it received (its name, the body as parsed and
    as bytes, the headers), streams when asked (`stream`, `pause_s` between events), fails when asked
    (`fail`, `status`), and counts the attempts of each `probe` id (GET /attempts), so retries can be seen."""
    attempts: Counter[str] = Counter()

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": name}]})

    async def attempts_route(request: Request) -> JSONResponse:
        return JSONResponse(dict(attempts))

    async def chat(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        if "probe" in body:
            attempts[body["probe"]] += 1
        headers = {"X-Worker": name}
        if "x-session-id" in request.headers:
            headers["X-Session-ID"] = request.headers["x-session-id"]
        if body.get("fail"):
            status = body.get("status", 400)
            return JSONResponse(openai_error(status), status_code=status, headers=headers)
        if body.get("stream"):
            async def events() -> AsyncIterator[bytes]:
                for event in sse_events(name):
                    yield event
                    await asyncio.sleep(body.get("pause_s", STREAM_DELAY_S))

            return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
        echo = {"worker": name, "body": body, "raw": raw.decode(), "headers": dict(request.headers)}
        return JSONResponse(echo, headers=headers)

    return Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                             Route("/attempts", attempts_route),
                             Route("/v1/chat/completions", chat, methods=["POST"])])


@dataclass
class FakeWorker:
    name: str
    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeWorker:
        # The parent binds and hands the listening socket over, so the port is ours before the child runs,
        # then closes its copy: a dead child must leave a closed port (refused), not a silent backlog.
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.port))
            sock.listen(128)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
            self.process = subprocess.Popen([sys.executable, __file__, self.name, str(sock.fileno())],
                                            pass_fds=(sock.fileno(),), env=env, stdin=subprocess.DEVNULL)
        return self

    def wait_healthy(self, timeout: float = 30) -> FakeWorker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"fake worker {self.name} not healthy after {timeout} s")

    def attempts(self) -> Counter[str]:
        return Counter(httpx.get(f"{self.url}/attempts").json())

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def start_workers(*names: str) -> dict[str, FakeWorker]:
    workers = {name: FakeWorker(name, free_port()).start() for name in names}  # start all, then wait
    for worker in workers.values():
        worker.wait_healthy()
    return workers


def spec_for(workers: dict[str, FakeWorker], **kwargs: Any) -> RouterSpec:
    return RouterSpec(tuple(w.url for w in workers.values()), port=free_port(), metrics_port=free_port(), **kwargs)


# --- fixtures ---------------------------------------------------------------------------------------


@dataclass
class Cluster:
    workers: dict[str, FakeWorker]
    hashed: RouterProcess  # consistent_hash
    round_robin: RouterProcess
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def chat(self, body: dict, session: str | None = None, router: RouterProcess | None = None,
             headers: dict[str, str] | None = None) -> httpx.Response:
        sent = {**({"X-Session-ID": session} if session is not None else {}), **(headers or {})}
        return self.http.post(f"{(router or self.hashed).url}/v1/chat/completions", json=body, headers=sent)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("router")
    workers = start_workers("A", "B")
    try:
        with RouterProcess(spec_for(workers), logs / "hashed.log") as hashed, \
                RouterProcess(spec_for(workers, policy="round_robin"), logs / "rr.log") as rr:
            yield Cluster(workers, hashed, rr)
    finally:
        for worker in workers.values():
            worker.kill()


MESSAGES = [{"role": "user", "content": "hi"}]


# --- what passes through ----------------------------------------------------------------------------


@pytest.mark.process
def test_unknown_top_level_field_reaches_the_worker_unchanged(cluster: Cluster) -> None:
    context = {"session_id": "s1", "z_first": 1, "a_second": [True, None, 0.5, "é ☃ \"q\" \n"],
               "codex": [{"id": "doc-1", "text": "Thé codex", "nested": {"b": 2, "a": [1, {"c": "d"}]}}]}
    response = cluster.chat({"model": "m", "messages": MESSAGES, "context": context, "ahc_extra": {"k": "v"}}, "s1")
    assert response.status_code == 200, response.text
    echo = response.json()
    assert echo["body"]["context"] == context
    assert echo["body"]["ahc_extra"] == {"k": "v"}
    # Byte for byte: the router re-serialises the body compactly, keeping key order and UTF-8 as is.
    assert json.dumps(context, ensure_ascii=False, separators=(",", ":")) in echo["raw"]


def test_the_router_rewrites_known_fields(cluster: Cluster) -> None:
    """The router parses the body into its typed request and writes it again: defaults added, messages
    normalised, huge integers turned into floats. Pinned here so an upgrade that changes it is seen."""
    messages = [{"role": "user", "content": "hi", "x_note": 1},
                {"role": "assistant", "content": None, "reasoning_content": "why",
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    body = {"messages": messages, "context": {"big": 2**70, "small": 2**62}}
    echo = cluster.chat(body, "rewrites").json()["body"]
    assert "model" not in echo  # not required, not added
    added = {k: v for k, v in echo.items() if k not in body}
    assert added == {"stream": False, "logprobs": False, "no_stop_trim": False, "ignore_eos": False,
                     "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
                     "stream_reasoning": True, "return_hidden_states": False, "include_reasoning": True}
    assert echo["messages"][0] == {"role": "user", "content": "hi"}  # unknown message field dropped
    assert "content" not in echo["messages"][1] and echo["messages"][1]["reasoning"] == "why"
    assert echo["context"] == {"big": float(2**70), "small": 2**62}


def test_sse_stream_arrives_chunk_by_chunk_unchanged(cluster: Cluster) -> None:
    arrivals: list[tuple[float, bytes]] = []
    with cluster.http.stream("POST", f"{cluster.hashed.url}/v1/chat/completions", headers={"X-Session-ID": "sse"},
                             json={"messages": MESSAGES, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        worker = response.headers["x-worker"]
        for chunk in response.iter_raw():
            arrivals.append((time.monotonic(), chunk))
    received = b"".join(chunk for _, chunk in arrivals)
    assert received == b"".join(sse_events(worker))
    assert received.endswith(b"data: [DONE]\n\n")
    # Not buffered: the events came over the worker's pauses, not all at the end.
    assert len(arrivals) >= STREAM_CHUNKS
    assert arrivals[-1][0] - arrivals[0][0] > (STREAM_CHUNKS - 1) * STREAM_DELAY_S * 0.7


def test_openai_client_streams_through_the_router(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=f"{cluster.hashed.url}/v1", api_key="key", max_retries=0, timeout=30)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True,  # type: ignore[arg-type]
                                            extra_headers={"X-Session-ID": "openai-stream"},
                                            extra_body={"context": {"session_id": "openai-stream"}})
    times, texts, workers = [], [], set()
    for chunk in stream:
        times.append(time.monotonic())
        texts.append(chunk.choices[0].delta.content)
        workers.add(chunk.model)
    assert texts == [f"tok{i} " for i in range(STREAM_CHUNKS)]
    assert len(workers) == 1
    assert times[-1] - times[0] > (STREAM_CHUNKS - 1) * STREAM_DELAY_S * 0.7


@pytest.mark.parametrize(("status", "attempts"), [(400, 1), (429, RETRIED), (500, RETRIED), (501, 1), (503, RETRIED)])
def test_errors_pass_through_and_which_are_retried(cluster: Cluster, status: int, attempts: int) -> None:
    probe = uuid.uuid4().hex
    response = cluster.chat({"messages": MESSAGES, "fail": True, "status": status, "probe": probe}, f"err-{status}")
    assert response.status_code == status
    assert response.json() == openai_error(status)
    assert response.headers["content-type"] == "application/json"
    # Retried on the same worker: the session's; a 5xx is a generation replayed.
    seen = {name: w.attempts()[probe] for name, w in cluster.workers.items()}
    assert sorted(seen.values()) == [0, attempts], seen


@pytest.mark.process
def test_request_timeout_cuts_a_long_stream(cluster: Cluster, tmp_path: Path) -> None:
    spec = spec_for(cluster.workers, request_timeout_s=1, retry_max_retries=1)
    with RouterProcess(spec, tmp_path / "router.log") as router:
        received = b""
        started = time.monotonic()
        with pytest.raises(httpx.HTTPError):  # the body ends mid-stream
            with cluster.http.stream("POST", f"{router.url}/v1/chat/completions", headers={"X-Session-ID": "long"},
                                     json={"messages": MESSAGES, "stream": True, "pause_s": 0.4}) as response:
                for chunk in response.iter_raw():
                    received += chunk
        assert 0.9 < time.monotonic() - started < 3
        assert 0 < received.count(b"data: ") < STREAM_CHUNKS and not received.endswith(b"data: [DONE]\n\n")


def test_headers_both_ways(cluster: Cluster) -> None:
    sent = {"Authorization": "Bearer key-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "X-Request-ID": "req-1", "X-Custom": "c"}
    response = cluster.chat({"messages": MESSAGES}, "headers", headers=sent)
    assert response.status_code == 200
    received = response.json()["headers"]
    for name, value in sent.items():
        assert received[name.lower()] == value
    assert received["x-session-id"] == "headers"
    assert received["host"] == cluster.workers[response.json()["worker"]].url.removeprefix("http://")
    # The worker's own response headers reach the client; the router adds CORS and a request id.
    assert response.headers["x-session-id"] == "headers"
    assert response.headers["x-worker"] == response.json()["worker"]
    assert response.headers["access-control-allow-origin"] == "*"
    assert response.headers["x-request-id"]


def test_router_refuses_what_it_cannot_parse_itself(cluster: Cluster) -> None:
    """Not OpenAI's error shape: these never reach a worker."""
    no_messages = cluster.chat({"model": "m"}, "bad")
    assert no_messages.status_code == 422 and no_messages.headers["content-type"].startswith("text/plain")
    assert "missing field `messages`" in no_messages.text
    not_json = cluster.http.post(f"{cluster.hashed.url}/v1/chat/completions", content=b"{nope",
                                 headers={"content-type": "application/json", "X-Session-ID": "bad"})
    assert not_json.status_code == 400 and not_json.headers["content-type"].startswith("text/plain")


# --- routing ----------------------------------------------------------------------------------------


def test_consistent_hash_keeps_each_session_on_one_worker(cluster: Cluster) -> None:
    sessions = [f"session-{i}" for i in range(20)]
    placed: dict[str, set[str]] = {s: set() for s in sessions}
    for _ in range(5):  # interleaved: every session once per round
        for session in sessions:
            response = cluster.chat({"messages": MESSAGES, "context": {"session_id": session}}, session)
            assert response.status_code == 200
            echo = response.json()
            assert response.headers["x-session-id"] == session
            assert echo["headers"]["x-session-id"] == session
            placed[session].add(echo["worker"])
    assert all(len(workers) == 1 for workers in placed.values()), placed
    assert {next(iter(w)) for w in placed.values()} == {"A", "B"}


def test_round_robin_spreads_one_session(cluster: Cluster) -> None:
    workers = {cluster.chat({"messages": MESSAGES}, "rr", cluster.round_robin).json()["worker"] for _ in range(4)}
    assert workers == {"A", "B"}


def test_without_a_session_header_everything_goes_to_one_worker(cluster: Cluster) -> None:
    """consistent_hash reads headers only: without one the key is `request:` for every request, whatever
    the body names (`user`, `context.session_id`)."""
    workers = {cluster.chat({"messages": [{"role": "user", "content": f"turn {i}"}], "user": f"u{i}",
                             "context": {"session_id": f"s{i}"}}).json()["worker"] for i in range(12)}
    assert len(workers) == 1
    # Any of the other headers it knows keys the request instead, X-User-ID for one.
    by_user = {cluster.chat({"messages": MESSAGES}, headers={"X-User-ID": f"u{i}"}).json()["worker"]
               for i in range(12)}
    assert by_user == {"A", "B"}


def test_router_reports_its_workers(cluster: Cluster) -> None:
    assert cluster.http.get(f"{cluster.hashed.url}/liveness").status_code == 200
    ready = cluster.http.get(f"{cluster.hashed.url}/readiness").json()
    assert ready["status"] == "ready" and ready["healthy_workers"] == 2
    listed = cluster.http.get(f"{cluster.hashed.url}/workers").json()["workers"]
    expected = sorted((w.url, True) for w in cluster.workers.values())
    assert sorted((w["url"], w["is_healthy"]) for w in listed) == expected


# --- failover -----------------------------------------------------------------------------------------


@pytest.mark.process
def test_failover_moves_a_dead_workers_sessions_and_brings_them_back(tmp_path: Path) -> None:
    workers = start_workers("A", "B", "C")
    http = httpx.Client(timeout=30)
    try:
        with RouterProcess(spec_for(workers), tmp_path / "router.log") as router:
            def send(session: str) -> tuple[int, str | None]:
                response = http.post(f"{router.url}/v1/chat/completions", json={"messages": MESSAGES},
                                     headers={"X-Session-ID": session})
                return response.status_code, response.headers.get("x-worker")

            sessions = [f"fo-{i}" for i in range(30)]
            home = {s: send(s)[1] for s in sessions}
            moved = [s for s in sessions if home[s] == "B"]
            assert moved and len(moved) < len(sessions)

            cut: list[bytes] = []
            in_flight = threading.Thread(target=_read_stream, args=(http, router.url, moved[0], cut))
            in_flight.start()
            deadline = time.monotonic() + 10
            while not cut:  # the stream is under way: its first event has arrived
                assert time.monotonic() < deadline, "the stream never started"
                time.sleep(0.01)

            killed = time.monotonic()
            workers["B"].kill()
            failures, first_ok, placed = [], None, {s: set() for s in sessions}
            i = 0
            while time.monotonic() - killed < 3.0:
                for session in (moved[i % len(moved)], sessions[i % len(sessions)]):  # a moved one, then any
                    status, worker = send(session)
                    if status != 200:
                        failures.append((round(time.monotonic() - killed, 3), session, status))
                        continue
                    placed[session].add(worker)
                    if session in moved and first_ok is None:
                        first_ok = time.monotonic() - killed
                i += 1
            in_flight.join()
            print(f"failover: first moved-session success {first_ok:.3f} s after SIGKILL, failures {failures}")
            assert b"".join(cut).count(b"data: ") < STREAM_CHUNKS + 1  # the stream in flight was cut
            assert not b"".join(cut).endswith(b"data: [DONE]\n\n")
            assert failures == []  # retries outlast the health check's detection
            assert first_ok is not None and first_ok < 2.5
            assert all(len(placed[s]) == 1 and placed[s] <= {"A", "C"} for s in moved), placed
            assert all(placed[s] <= {home[s]} for s in sessions if s not in moved), placed

            # A restarted worker gets its sessions back once two health checks pass.
            workers["B"].start().wait_healthy()
            restarted = time.monotonic()
            while any(send(s)[1] != "B" for s in moved):
                assert time.monotonic() - restarted < 10, "sessions never returned to the restarted worker"
                time.sleep(0.2)
            print(f"failover: sessions back on the restarted worker after {time.monotonic() - restarted:.3f} s")
            assert all(send(s) == (200, home[s]) for s in sessions)
    finally:
        for worker in workers.values():
            worker.kill()


def _read_stream(http: httpx.Client, url: str, session: str, out: list[bytes]) -> None:
    try:
        with http.stream("POST", f"{url}/v1/chat/completions", json={"messages": MESSAGES, "stream": True},
                         headers={"X-Session-ID": session}) as response:
            for chunk in response.iter_raw():
                out.append(chunk)
    except httpx.HTTPError:
        pass  # what a client of a killed worker gets: the body ends mid-stream


# --- the wrapper --------------------------------------------------------------------------------------

URL = "http://127.0.0.1:9001"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"worker_urls": ()}, "non-empty"),
    ({"worker_urls": URL}, "non-empty tuple"),
    ({"worker_urls": ("127.0.0.1:9001",)}, "http://host:port"),
    ({"worker_urls": ("ftp://h:1",)}, "http://host:port"),
    ({"worker_urls": ("http://:9001",)}, "http://host:port"),
    ({"worker_urls": ("http://h:99999",)}, "bad port"),
    ({"worker_urls": ("http://h:9001/",)}, "only scheme://host:port"),
    ({"worker_urls": ("http://h:9001/v1",)}, "only scheme://host:port"),
    ({"worker_urls": (URL, URL)}, "duplicates"),
    ({"port": 0}, "port must be"),
    ({"port": 70000}, "port must be"),
    ({"metrics_port": "29000"}, "metrics_port must be"),
    ({"port": 29000}, "must differ"),
    ({"policy": "cache_aware"}, "policy must be"),
    ({"health_check_interval_s": 0}, "health_check_interval_s"),
    ({"health_check_interval_s": 0.5}, "health_check_interval_s"),
    ({"health_failure_threshold": 0}, "health_failure_threshold"),
    ({"retry_max_retries": 0}, "retry_max_retries"),
    ({"retry_backoff_multiplier": 0.5}, "retry_backoff_multiplier"),
    ({"log_level": "verbose"}, "log_level"),
    ({"extra_args": "--foo"}, "extra_args"),
])
def test_bad_spec_is_a_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouterSpec(**{"worker_urls": (URL,), **kwargs})


@pytest.mark.process
def test_router_command() -> None:
    spec = RouterSpec((URL, "https://replica-2:8443"), port=8100, metrics_port=8101, extra_args=("--queue-size", "5"))
    cmd = router_command(spec, "vllm-router")
    assert cmd[:4] == ["vllm-router", "--worker-urls", URL, "https://replica-2:8443"]
    flags = dict(zip(cmd[4::2], cmd[5::2], strict=False))
    assert flags["--policy"] == "consistent_hash"
    assert (flags["--host"], flags["--port"], flags["--prometheus-port"]) == ("127.0.0.1", "8100", "8101")
    assert flags["--health-check-interval-secs"] == "1" and flags["--health-failure-threshold"] == "1"
    assert flags["--worker-startup-check-interval"] == "1" and flags["--retry-max-retries"] == str(RETRIED)
    assert "--disable-circuit-breaker" in cmd
    assert cmd[-2:] == ["--queue-size", "5"]
    assert "--disable-circuit-breaker" not in router_command(RouterSpec((URL,), circuit_breaker=True), "x")
    assert spec.url == "http://127.0.0.1:8100"
    assert RouterSpec([URL], extra_args=["-x"]) == RouterSpec((URL,), extra_args=("-x",))  # lists become tuples
    assert RouterSpec((URL,), host="0.0.0.0", port=8100).url == "http://127.0.0.1:8100"
    assert RouterSpec((URL,), host="::1", port=8100).url == "http://[::1]:8100"
    # Every flag we pass is one the installed router knows: it would exit on an unknown one.
    known = subprocess.run([router_executable(), "--help"], capture_output=True, text=True, timeout=60).stdout
    assert all(arg in known for arg in router_command(RouterSpec((URL,))) if arg.startswith("--"))


def test_router_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = Path(router_executable())
    assert found == Path(sys.executable).with_name("vllm-router") and found.is_file()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip install vllm-router"):
        router_executable()


@pytest.mark.process
def test_router_that_exits_early_names_its_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "router.log"
    spec = RouterSpec((f"http://127.0.0.1:{free_port()}",), port=free_port(), metrics_port=free_port(),
                      worker_startup_timeout_s=1)  # no worker: the router gives up after 1 s
    router = RouterProcess(spec, log, startup_timeout_s=30)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=str(log)) as raised:
        router.start()
    assert time.monotonic() - started < 15
    assert "exited with 1" in str(raised.value) and "to become healthy" in str(raised.value)
    assert "\x1b[" not in str(raised.value)  # the log's colour codes are left out
    assert router.process is not None and router.process.poll() == 1
    assert router.stop() == 1


@pytest.mark.process
def test_router_process_start_and_stop(tmp_path: Path) -> None:
    workers = start_workers("solo")
    try:
        router = RouterProcess(spec_for(workers), tmp_path / "router.log")
        with router:
            assert httpx.get(f"{router.url}/readiness").status_code == 200
            with pytest.raises(RuntimeError, match="already started"):
                router.start()
        assert router.process is not None and router.process.poll() is not None
        assert router.stop() == router.process.returncode  # stopping twice is harmless
    finally:
        workers["solo"].kill()


if __name__ == "__main__":
    listening = socket.socket(fileno=int(sys.argv[2]))
    uvicorn.Server(uvicorn.Config(worker_app(sys.argv[1]), log_level="warning", lifespan="off")).run(
        sockets=[listening])
