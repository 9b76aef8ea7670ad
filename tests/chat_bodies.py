"""The body of a chat completion as the app tests send it: one user message to the tiny model and, for a
session, AHC's context naming it."""

from __future__ import annotations

from typing import Any

IDENTITY = "You are a careful physicist."


def chat(session: str | None = None, question: str = "What moves?", max_tokens: int | None = 8,
         context: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """With `session`, a context of that session and the physicist's identity, `context` over them;
    `max_tokens` None leaves the budget out (the rest of the window); `extra`: more body fields."""
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": question}], **extra}
    if max_tokens is not None:
        body.setdefault("max_tokens", max_tokens)
    if session is not None:
        body.setdefault("context", {"session_id": session, "identity": IDENTITY, **(context or {})})
    return body
