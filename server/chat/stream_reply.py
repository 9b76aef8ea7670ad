"""Rebuild the assistant message from streamed chat chunks (content, reasoning and tool-call deltas)."""

from __future__ import annotations

from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]  # typeshed leaves it out
from typing import Any

# How vLLM writes a chunk of content alone (index 0, no other key in the delta): its text is read from
# the payload as it stands, without parsing the whole chunk.
CONTENT_ONLY = '{"index":0,"delta":{"content":"'


@dataclass
class ReplyAccumulator:
    """`text=False`: the reply's text is not kept (nothing will need it), so only the chunks that may
    carry a tool call or the finish need parsing; with text, a chunk of content alone has its text taken
    as it stands. See `take`."""

    text: bool = True
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)  # with a reasoning parser: the reply's thinking
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None

    def take(self, payload: str) -> bool:
        """Whether a chunk's text (one event's JSON, or a whole chunk of events) need not be parsed: it
        provably changes nothing the reply keeps, or it is one event of content alone, whose text is
        taken here. False: parse it and `add` it.

        The tests read the raw text. A key is written with its quotes, so `"tool_calls"` is in every
        chunk that has one (anywhere else it costs only a needless parse). When every `"finish_reason"`
        in the text is followed by `:null`, no choice finishes, since the real keys are among them;
        other spacing fails the count and is merely parsed. Content is taken only where the delta holds
        nothing else and the text has one delta (a quoted `"delta":` inside the content fails that)."""
        if '"tool_calls"' in payload or "[DONE]" in payload:
            return False
        if payload.count('"finish_reason"') != payload.count('"finish_reason":null'):
            return False
        if not self.text or '"delta"' not in payload:  # nothing kept, or no delta (the usage chunk)
            return True
        start = payload.find(CONTENT_ONLY)
        if start < 0 or payload.count('"delta":') != 1:
            return False
        try:
            text, end = scanstring(payload, start + len(CONTENT_ONLY))
        except ValueError:
            return False
        if payload[end:end + 1] != "}":
            return False
        self.content.append(text)
        return True

    def add(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if self.text and delta.get("content"):
                self.content.append(delta["content"])
            if self.text and (thought := delta.get("reasoning") or delta.get("reasoning_content")):
                self.reasoning.append(thought)
            for call in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(call.get("index", 0), {
                    "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            message["reasoning"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message
