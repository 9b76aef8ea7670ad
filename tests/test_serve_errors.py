"""Every client mistake gets a 4xx in OpenAI's error shape, and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from server.http.errors import normalise

pytestmark = pytest.mark.engine


def assert_openai_error(response: httpx.Response, status: int, type_: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == type_
    assert isinstance(error["message"], str) and error["message"]
    assert "code" in error
    return error


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404
    assert info.value.body["type"] == "not_found_error"


def test_malformed_json_is_400(server) -> None:
    with server.http() as http:
        response = http.post("/v1/chat/completions", content=b"{not json",
                             headers={"content-type": "application/json"})
    assert_openai_error(response, 400, "invalid_request_error")


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"},
    {"model": "tiny"},
    {"messages": "not a list"},
    {"messages": [{"role": "user", "content": "hi"}], "temperature": -3},
])
def test_malformed_body_is_400(server, model_name: str, body: dict) -> None:
    with server.http() as http:
        response = http.post("/v1/chat/completions", json={"model": model_name, **body})
    assert_openai_error(response, 400, "invalid_request_error")


def test_prompt_over_the_window_is_400(client: openai.OpenAI, model_name: str) -> None:
    long_prompt = "cells collide " * 3000
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt=long_prompt, max_tokens=4)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, max_tokens=4,
                                       messages=[{"role": "user", "content": long_prompt}])


def test_unknown_route_is_404_in_openai_shape(server) -> None:
    with server.http() as http:
        assert_openai_error(http.get("/v1/no-such-route"), 404, "not_found_error")
        assert_openai_error(http.get("/v1/chat/completions"), 405, "invalid_request_error")


def test_api_key_guards_v1_and_leaves_health_and_metrics_open(server) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic test-key"}):
        response = httpx.get(f"{server.base_url}/v1/models", headers=headers)
        assert_openai_error(response, 401, "authentication_error")
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/metrics").status_code == 200
    wrong = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_server_keeps_serving_after_bad_requests(server, client: openai.OpenAI, model_name: str) -> None:
    with server.http() as http:
        for _ in range(3):
            http.post("/v1/chat/completions", content=b"]]")
            http.post("/v1/completions", json={"model": model_name, "prompt": "x", "max_tokens": 10**6})
    reply = client.chat.completions.create(model=model_name, max_tokens=4,
                                           messages=[{"role": "user", "content": "still there?"}])
    assert reply.usage.completion_tokens > 0


def test_normalise_rewrites_foreign_error_bodies() -> None:
    import json

    detail = json.loads(normalise(404, b'{"detail": "Not Found"}'))["error"]
    assert detail == {"message": "Not Found", "type": "not_found_error", "param": None, "code": 404}
    vllm = json.loads(normalise(
        400, b'{"error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": 400}}'))
    assert vllm["error"]["type"] == "invalid_request_error" and vllm["error"]["param"] == "n"
    text = json.loads(normalise(502, b"upstream <html>"))["error"]
    assert text["type"] == "server_error" and text["message"] == "upstream <html>"


def test_the_error_layer_labels_every_response_and_passes_a_streams_chunks_untouched() -> None:
    """One wrapper over `send`: a refusal is reshaped and labelled, a stream's start labelled and its chunks
    sent as they come."""
    import asyncio

    from starlette.responses import PlainTextResponse, StreamingResponse

    from server.http.gateway import Gateway

    async def chunks():  # type: ignore[no-untyped-def]
        yield b"data: 1\n\n"
        yield b"data: 2\n\n"

    def run(app, path: str) -> list[dict]:  # type: ignore[no-untyped-def]
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b""}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "headers": [], "asgi": {"spec_version": "2.4"}}
        asyncio.run(Gateway(app, label="emulated:h100")(scope, receive, send))
        return sent

    refused = run(PlainTextResponse("nope", status_code=404), "/v1/x")
    assert (b"x-ahc-engine", b"emulated:h100") in refused[0]["headers"]
    assert json.loads(refused[1]["body"])["error"]["message"] == "nope"
    streamed = run(StreamingResponse(chunks(), media_type="text/event-stream"), "/v1/chat/completions")
    assert (b"x-ahc-engine", b"emulated:h100") in streamed[0]["headers"]
    assert [m.get("body") for m in streamed[1:]] == [b"data: 1\n\n", b"data: 2\n\n", b""]
