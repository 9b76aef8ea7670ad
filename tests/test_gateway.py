"""The gateway (server/http/gateway.py), AHC's one ASGI layer: its checks in order, each refusal in the
API's shape, and a streamed response's chunks handed to the server's `send` as they come."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from server.http.body_limit import BodyLimit
from server.http.gateway import Gateway
from server.tenancy.auth import ApiKeyCheck
from server.tenancy.tenants import TenantKeys

CHUNKS = [b"data: 1\n\n", b"data: 2\n\n"]


async def stream(scope: Scope, receive: Receive, send: Send) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            yield chunk

    await StreamingResponse(chunks(), media_type="text/event-stream")(scope, receive, send)


def run(gateway: Gateway, path: str, headers: list[tuple[bytes, bytes]],
        body: list[bytes] | None = None) -> list[Message]:
    """One request through `gateway`; what it sent. `body`: the request's pieces, framed by no length."""
    pieces = list(body or [b""])
    sent: list[Message] = []

    async def receive() -> Message:
        if not pieces:
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": pieces.pop(0), "more_body": bool(pieces)}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": headers,
                             "asgi": {"spec_version": "2.3"}}
    asyncio.run(gateway(scope, receive, send))
    return sent


def test_a_streamed_chunk_reaches_the_servers_send_as_the_app_sent_it() -> None:
    keyed = Gateway(stream, label="emulated:h100", auth=ApiKeyCheck(TenantKeys.build(["k"])), json_bodies=True,
                    body_limit=BodyLimit(100))
    sent = run(keyed, "/v1/completions", [(b"authorization", b"Bearer k"), (b"content-type", b"application/json"),
                                          (b"content-length", b"2")])
    assert sent[0]["status"] == 200 and (b"x-ahc-engine", b"emulated:h100") in sent[0]["headers"]
    assert [m.get("body") for m in sent[1:]] == [*CHUNKS, b""]


def test_a_refusal_on_the_messages_api_is_in_anthropics_shape_and_labelled() -> None:
    keyed = Gateway(stream, label="emulated:h100", auth=ApiKeyCheck(TenantKeys.build(["k"])))
    sent = run(keyed, "/v1/messages", [(b"content-type", b"application/json")])
    assert sent[0]["status"] == 401 and (b"x-ahc-engine", b"emulated:h100") in sent[0]["headers"]
    assert json.loads(sent[1]["body"]) == {"type": "error", "error": {
        "type": "authentication_error",
        "message": "Incorrect or missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'."}}


def test_the_key_comes_before_the_body_checks() -> None:
    keyed = Gateway(stream, auth=ApiKeyCheck(TenantKeys.build(["k"])), json_bodies=True, body_limit=BodyLimit(100))
    sent = run(keyed, "/v1/completions", [(b"content-type", b"text/plain"), (b"content-length", b"1000")])
    assert sent[0]["status"] == 401


def test_a_declared_length_over_the_limit_is_refused_before_the_content_type() -> None:
    limited = Gateway(stream, json_bodies=True, body_limit=BodyLimit(100))
    sent = run(limited, "/v1/completions", [(b"content-type", b"text/plain"), (b"content-length", b"1000")])
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]


def test_a_body_without_a_length_is_counted_and_the_apps_answer_replaced() -> None:
    async def reader(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            while (await receive()).get("more_body"):
                pass
        except Exception:  # the read over the limit: an app answers the failure its own way
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b"bad body"})
            return
        await stream(scope, receive, send)

    limited = Gateway(reader, body_limit=BodyLimit(100))
    refused = run(limited, "/v1/messages", [(b"content-type", b"application/json")], [b"x" * 60] * 3)
    assert refused[0]["status"] == 413 and len(refused) == 2
    assert json.loads(refused[1]["body"])["error"]["type"] == "request_too_large"
    served = run(limited, "/v1/completions", [(b"content-type", b"application/json")], [b"x" * 40] * 2)
    assert served[0]["status"] == 200 and [m.get("body") for m in served[1:]] == [*CHUNKS, b""]
