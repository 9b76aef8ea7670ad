"""The guard `ahc cluster` puts in front of vLLM's router (real router, fake workers): the API's routes pass
through unchanged, JSON and streamed, while the router's own routes (add_worker, remove_worker,
list_workers, flush_cache, ...) answer 404, reached by a dot segment or an encoded one too, and nothing
carries a CORS grant. With keys, a request without one is a 401; a body over the limit is a 413, declared
or counted as it streams."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_router import FakeWorker

from server.cluster.router import RouterProcess, RouterSpec
from server.cluster.router_guard import GuardServer, declared_length
from server.cluster.server_process import free_port

EVIL = {"Origin": "http://evil.example"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RouterProcess, FakeWorker]]:
    worker = FakeWorker("w1", free_port()).start().wait_healthy()
    spec = RouterSpec(worker_urls=(worker.url,), port=free_port(), metrics_port=free_port())
    log = Path(tmp_path_factory.mktemp("guard")) / "router.log"
    try:
        with RouterProcess(spec, log) as router:
            guard = GuardServer(router.url, "127.0.0.1", free_port()).start()
            try:
                yield f"http://127.0.0.1:{guard._server.config.port}", router, worker
            finally:
                guard.stop()
    finally:
        worker.kill()


@pytest.mark.process
def test_the_routers_own_routes_are_closed_to_clients(guarded: tuple[str, RouterProcess, FakeWorker]) -> None:
    url, router, worker = guarded
    intruder = FakeWorker("intruder", free_port())
    for method, path in (("POST", f"/add_worker?url={intruder.url}"), ("POST", f"/remove_worker?url={worker.url}"),
                         ("GET", "/list_workers"), ("GET", "/workers"), ("POST", "/flush_cache"),
                         ("GET", "/get_loads")):
        answer = httpx.request(method, url + path, headers=EVIL, timeout=30)
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["error"]["type"] == "not_found_error"
        assert not any(h.startswith("access-control-") for h in answer.headers), (path, answer.headers)
    # The router behind still has its one worker (confirmed on its private port).
    assert httpx.get(router.url + "/list_workers", timeout=30).json()["urls"] == [worker.url]
    preflight = httpx.options(url + "/v1/chat/completions", timeout=30,
                              headers={**EVIL, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 404 and "access-control-allow-origin" not in preflight.headers


def test_the_api_passes_through_unchanged(guarded: tuple[str, RouterProcess, FakeWorker]) -> None:
    url, _, _ = guarded
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "context": {"session_id": "s1"}}
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                       headers={**EVIL, "X-Session-ID": "s1", "Authorization": "Bearer k"})
    assert reply.status_code == 200, reply.text
    echo = reply.json()
    assert echo["worker"] == "w1" and echo["body"]["context"] == {"session_id": "s1"}
    assert echo["headers"]["authorization"] == "Bearer k" and echo["headers"]["x-session-id"] == "s1"
    assert reply.headers["x-session-id"] == "s1" and "access-control-allow-origin" not in reply.headers
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as stream:
        assert stream.status_code == 200
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "data: [DONE]"
    failed = httpx.post(url + "/v1/chat/completions", json={**body, "fail": True, "status": 400}, timeout=30)
    assert failed.status_code == 400 and "error" in failed.json()  # the worker's error, passed through
    assert httpx.get(url + "/health", timeout=30).status_code in (200, 503)


def raw_request(url: str, method: str, target: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """A request whose target goes out byte for byte (httpx would resolve its dot segments first)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            conn.putheader(name, value)
        try:
            conn.endheaders(body)
        except (BrokenPipeError, ConnectionResetError):  # refused while the body was still going out
            pass
        try:
            response = conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            return 0, {}  # closed without an answer: refused before anything was forwarded
        data = response.read()
        try:
            return response.status, json.loads(data or b"{}")
        except ValueError:  # the HTTP server's own answer (h11 refusing a malformed request)
            return response.status, {"text": data.decode("latin-1")}
    finally:
        conn.close()


def test_a_path_that_is_not_normal_never_reaches_the_router(guarded: tuple[str, RouterProcess, FakeWorker]) -> None:
    url, router, worker = guarded
    intruder = FakeWorker("intruder", free_port())
    for target in (f"/v1/../add_worker?url={intruder.url}", "/ui/../../flush_cache", "/v1/./../list_workers",
                   f"/v1/%2e%2e/add_worker?url={intruder.url}", f"/v1/..%2Fadd_worker?url={intruder.url}",
                   "/v1\\..\\flush_cache", "/v1//../get_loads", "/ui/%2E%2E"):
        status, answer = raw_request(url, "POST", target)
        assert status == 404 and answer["error"]["type"] == "not_found_error", (target, status, answer)
    assert httpx.get(router.url + "/list_workers", timeout=30).json()["urls"] == [worker.url]
    status, _ = raw_request(url, "GET", "/v1/models")  # a normal API path still passes
    assert status != 404


def test_keys_and_body_limits_are_enforced_before_the_router(guarded: tuple[str, RouterProcess, FakeWorker]) -> None:
    _, router, worker = guarded
    guard = GuardServer(router.url, "127.0.0.1", free_port(), api_keys=["k1", "k2"], max_body_bytes=1 << 20).start()
    url, key = f"http://127.0.0.1:{guard._server.config.port}", {"Authorization": "Bearer k2"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 401
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                          headers={"Authorization": "Bearer k3"}).status_code == 401
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=key, timeout=30).status_code == 200
        assert httpx.post(url + "/v1/chat/completions", json=body, headers={"x-api-key": "k1"},
                          timeout=30).status_code == 200
        assert httpx.get(url + "/health", timeout=30).status_code != 401  # probes stay open
        # A declared length over the limit: refused before a byte of the body is read.
        status, answer = raw_request(url, "POST", "/v1/chat/completions", b"{}",
                                     {**key, "Content-Length": str(1 << 30)})
        assert status == 413 and "limit" in answer["error"]["message"]
        # A chunked body is counted as it streams through.
        before = worker.attempts()
        chunks = (b"x" * (64 << 10) for _ in range(24))  # 1.5 MiB
        refused = httpx.post(url + "/v1/chat/completions", content=chunks, timeout=30,
                             headers={**key, "Content-Type": "application/json"})
        assert refused.status_code == 413, refused.text
        assert worker.attempts() == before  # nothing reached a worker
        # Content-Length is not trusted beside a transfer encoding: refused by the HTTP parser (httptools),
        # or counted as chunked (h11).
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in [b"x" * (64 << 10)] * 24) + b"0\r\n\r\n"
        status, _ = raw_request(url, "POST", "/v1/chat/completions", chunked,
                                {**key, "Content-Type": "application/json", "Content-Length": "10",
                                 "Transfer-Encoding": "chunked"})
        assert status in (0, 400, 413), status
        assert worker.attempts() == before
    finally:
        guard.stop()


def test_a_length_beside_a_transfer_encoding_is_not_trusted() -> None:
    length, chunked = (b"content-length", b"10"), (b"transfer-encoding", b"chunked")
    assert declared_length({"headers": [length]}) == 10
    assert declared_length({"headers": [length, chunked]}) is None
