"""One streamed chat request as an agent client sees it: time to first token, usage, AHC's cache report
(first chunk) and the assistant message rebuilt from the deltas, tool calls included."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from server.chat.stream_reply import ReplyAccumulator


@dataclass(frozen=True)
class StreamedReply:
    """`ttft_s`: from sending to the first chunk carrying a token (content or a tool call's delta);
    `report`: the response's `context` (AHC's cache report), None from a server without one."""

    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    message: dict[str, Any]
    report: dict[str, Any] | None

    def tool_call_id(self) -> str:
        calls = self.message.get("tool_calls") or []
        if not calls or not calls[0].get("id"):
            raise RuntimeError(f"a turn forced to call a tool came back without a call: {self.message}")
        return str(calls[0]["id"])


def carries_token(chunk: dict[str, Any]) -> bool:
    return any((c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("tool_calls")
               for c in chunk.get("choices") or [])


def stream_chat(http: httpx.Client, body: dict[str, Any]) -> StreamedReply:
    """POST /v1/chat/completions with `stream` and usage on; an error status is a RuntimeError with
    the server's message."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    reply, report, usage, first = ReplyAccumulator(), None, None, None
    sent = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{http.base_url} answered {response.status_code}: {response.read()[:600]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and carries_token(chunk):
                first = time.perf_counter()
            report = report or chunk.get("context")
            usage = chunk.get("usage") or usage
            reply.add(chunk)
    if usage is None:
        raise RuntimeError(f"{http.base_url}: a streamed reply without usage")
    details = usage.get("prompt_tokens_details") or {}
    ttft = (first if first is not None else time.perf_counter()) - sent
    return StreamedReply(ttft, usage["prompt_tokens"], details.get("cached_tokens") or 0, usage["completion_tokens"],
                         reply.message(), report)
