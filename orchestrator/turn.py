"""One State message in canonical form, hashed and counted once when it is created.

The server keeps a session's State as these, so an unchanged history costs nothing to re-hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ahc.errors import InvalidRequest
from orchestrator.blocks import canonical_json, sha256_hex

ROLES = ("user", "assistant", "tool")
FILLER = {"ok", "okay", "thanks", "thank you", "sure", "got it", "yes", "no", "great", "done", "k", "noted"}


@dataclass(frozen=True)
class Turn:
    role: str
    content: str
    tool_calls: tuple[tuple[str, str, str], ...] = ()  # (id, name, arguments JSON)
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Turn:
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"messages: role {role!r} cannot be part of the State (use {', '.join(ROLES)})",
                                 param="messages")
        calls = tuple((str(c.get("id", "")), str(c["function"]["name"]), _arguments(c["function"].get("arguments")))
                      for c in message.get("tool_calls") or [])
        return cls(role=role, content=_text(message.get("content")), tool_calls=calls,
                   tool_call_id=message.get("tool_call_id"), name=message.get("name"))

    def to_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                     for i, n, a in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message

    @cached_property
    def message(self) -> dict[str, Any]:
        """The message, built once; callers must not mutate it."""
        return self.to_message()

    @cached_property
    def canonical(self) -> str:
        return canonical_json(self.to_message())

    @cached_property
    def sha256(self) -> str:
        return sha256_hex(self.canonical)

    @property
    def chars(self) -> int:
        return len(self.content) + sum(len(a) for _, _, a in self.tool_calls)

    @property
    def is_filler(self) -> bool:
        """Small talk that carries no fact: the first thing the CTC governor prunes."""
        return not self.tool_calls and self.role != "tool" and \
            self.content.strip().lower().rstrip(".!") in FILLER | {""}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts, in order
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise InvalidRequest("messages: content must be a string or a list of content parts", param="messages")


def _arguments(arguments: Any) -> str:
    if arguments is None:
        return "{}"
    return arguments if isinstance(arguments, str) else canonical_json(arguments)
