"""The guard `ahc cluster` puts in front of vLLM's router (real router, fake workers): the API's routes pass
through unchanged, JSON and streamed, while the router's own routes (add_worker, remove_worker,
list_workers, flush_cache, ...) answer 404 and nothing carries a CORS grant."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_router import FakeWorker

from server.cluster.router import RouterProcess, RouterSpec
from server.cluster.router_guard import GuardServer
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
