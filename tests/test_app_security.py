"""Who may reach what on AHC's whole app (fake engine, TestClient): with an API key every route wants
it except the probes, the routes AHC does not serve are not mounted, and a body must be JSON.

The key test walks the built app's routes rather than a list of known paths, so a route a later vLLM
adds is guarded or the test fails."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from fake_app import ahc_app
from fake_engine import FakeEngine
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.testclient import WebSocketDisconnect

from core.config import AHCConfig
from server.app import REMOVED_PATHS
from server.engine_args import build_vllm_namespace
from server.http.gateway import Gateway
from server.tenancy.auth import OPEN_PATHS, UI_PREFIX, ApiKeyCheck
from server.tenancy.tenants import TenantKeys
from xdb import XDB

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}


def client_for(config: AHCConfig, vllm_config, tmp_path: Path) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    xdb = XDB.open(tmp_path / "xdb")
    app, runtime = asyncio.run(ahc_app(config.with_overrides(data_dir=str(tmp_path / "xdb")),
                                       FakeEngine(vllm_config), xdb))
    try:
        with TestClient(app) as client:
            yield client
    finally:
        runtime.close()
        xdb.close()


@pytest.fixture
def keyed(config: AHCConfig, vllm_config, tmp_path: Path) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    yield from client_for(config.with_overrides(api_key=KEY), vllm_config, tmp_path)


@pytest.fixture
def keyless(config: AHCConfig, vllm_config, tmp_path: Path) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    yield from client_for(config, vllm_config, tmp_path)


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def endpoints(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every HTTP route the app has, path parameters filled in."""
    found = []
    for route in app.routes:
        if isinstance(route, Mount):
            found.append(("GET", concrete(route.path)))
        elif isinstance(route, Route):
            found += [(method, concrete(route.path)) for method in sorted(route.methods or ())]
    return found


def test_every_route_but_the_probes_wants_the_key(keyed: TestClient) -> None:
    app = keyed.app
    assert isinstance(app, FastAPI)
    routes = endpoints(app)
    assert ("POST", "/v1/chat/completions") in routes and ("POST", "/tokenize") in routes  # the walk sees them
    for method, path in routes:
        if path in OPEN_PATHS or (method in ("GET", "HEAD") and path.startswith(UI_PREFIX)):
            continue  # the experience browser's shell: no data (its own test below)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
            response = keyed.request(method, path, json={}, headers=headers)
            assert response.status_code == 401, (method, path, response.status_code)
            if method != "HEAD":  # a HEAD answer has no body
                assert response.json()["error"]["type"] == "authentication_error", (method, path)
    for route in app.routes:
        if isinstance(route, WebSocketRoute):
            with pytest.raises(WebSocketDisconnect):
                with keyed.websocket_connect(concrete(route.path)):
                    pass


def test_the_probes_answer_without_the_key(keyed: TestClient) -> None:
    open_routes = [(method, path) for method, path in endpoints(keyed.app) if path in OPEN_PATHS]  # type: ignore[arg-type]
    assert {path for _, path in open_routes} == set(OPEN_PATHS)
    for method, path in open_routes:
        assert keyed.request(method, path).status_code == 200, (method, path)


def test_with_the_key_the_routes_answer(keyed: TestClient) -> None:
    for path in ("/tokenize", "/v1/completions"):
        response = keyed.post(path, json={"model": "tiny", "prompt": "What moves?", "max_tokens": 4}, headers=AUTH)
        assert response.status_code == 200, (path, response.text)
    assert keyed.get("/openapi.json", headers=AUTH).status_code == 200
    client = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=keyed, max_retries=0)
    reply = client.chat.completions.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    wrong = openai.OpenAI(base_url="http://testserver/v1", api_key="wrong", http_client=keyed, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_routes_ahc_does_not_serve_are_not_mounted(keyed: TestClient) -> None:
    assert not {getattr(route, "path", None) for route in keyed.app.routes} & set(REMOVED_PATHS)  # type: ignore[attr-defined]
    for path in REMOVED_PATHS:
        response = keyed.post(concrete(path), json={}, headers=AUTH)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"]["type"] == "not_found_error"


def test_only_a_cors_preflight_passes_without_the_key(keyed: TestClient) -> None:
    preflight = {"Origin": "https://example.com", "Access-Control-Request-Method": "POST"}
    # Answered by the CORS middleware, which allows no origin by default; no route runs.
    assert keyed.options("/v1/chat/completions", headers=preflight).status_code == 400
    assert keyed.options("/v1/chat/completions").status_code == 401


def test_a_websocket_without_the_key_is_closed() -> None:
    from starlette.applications import Starlette
    from starlette.websockets import WebSocket

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("in")
        await websocket.close()

    app = Starlette(routes=[WebSocketRoute("/v1/realtime", echo)])
    client = TestClient(Gateway(app, auth=ApiKeyCheck(TenantKeys.build([KEY]))))
    with pytest.raises(WebSocketDisconnect) as closed:
        with client.websocket_connect("/v1/realtime") as ws:
            ws.receive_text()
    assert closed.value.code == 1008
    with client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        assert ws.receive_text() == "in"


def chat_body() -> bytes:
    return b'{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}'


# What a web page can send cross-site without a preflight, and a body that declares nothing.
@pytest.mark.parametrize("content_type", ["text/plain", "text/plain; charset=utf-8",
                                          "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None])
def test_a_body_that_is_not_declared_json_is_415(keyless: TestClient, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/v1/chat/completions", "/v1/xdb/tag", "/v1/completions", "/tokenize"):
        response = keyless.post(path, content=chat_body(), headers=headers)
        assert response.status_code == 415, (path, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "unsupported_media_type"
    assert keyless.request("DELETE", "/v1/xdb/runs/r1", content=b"{}", headers=headers).status_code == 415


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_a_json_body_passes(keyless: TestClient, content_type: str) -> None:
    response = keyless.post("/v1/chat/completions", content=chat_body(), headers={"Content-Type": content_type})
    assert response.status_code == 200, response.text


def test_requests_without_a_body_pass(keyless: TestClient) -> None:
    response = keyless.delete("/v1/xdb/runs/r1")
    assert response.status_code == 200, response.text
    assert response.json()["run_id"] == "r1"
    assert keyless.post("/ping").status_code == 200


def test_the_openai_client_sends_json(keyless: TestClient) -> None:
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=keyless, max_retries=0)
    reply = client.chat.completions.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=4).usage is not None


def test_engine_hooks_vllm_mounts_on_request_are_removed(config: AHCConfig, vllm_config, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's dev mode and runtime LoRA loading mount more hooks; the removal must know their paths."""
    from fake_engine import vllm_app

    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    args = build_vllm_namespace(config)
    vllm_paths = {getattr(r, "path", None) for r in asyncio.run(vllm_app(args, FakeEngine(vllm_config))).routes}
    assert {"/sleep", "/collective_rpc", "/update_weights", "/v1/load_lora_adapter", "/invocations"} <= vllm_paths
    for client in client_for(config, vllm_config, tmp_path):
        ahc_paths = {getattr(r, "path", None) for r in client.app.routes}  # type: ignore[attr-defined]
        assert not ahc_paths & set(REMOVED_PATHS)
        assert client.post("/sleep", json={}).status_code == 404


def test_the_experience_browser_shell_loads_without_the_key_and_reads_nothing_without_it(keyed: TestClient) -> None:
    """A browser cannot put a Bearer header on a navigation: the page's HTML, script and style load bare
    and hold no data; every read the page makes needs the key, and a write to /ui is refused."""
    page = keyed.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert 'data-auth-required="true"' in page.text
    assert keyed.get("/ui").status_code == 200  # redirected to /ui/
    assert keyed.get("/ui/static/app.js").status_code == 200
    for escape in ("/ui/static/../../app.py", "/ui/static/..%2f..%2fapp.py", "/ui/static/nothing.js"):
        assert keyed.get(escape).status_code in (401, 404), escape  # nothing outside server/ui/static
    for path in ("/v1/xdb/sessions", "/v1/xdb/audit", "/v1/xdb/runs", "/v1/xdb/recall"):
        assert keyed.get(path).status_code == 401, path
    assert keyed.post("/ui/", json={}).status_code == 401
    assert keyed.get("/v1/xdb/sessions", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
