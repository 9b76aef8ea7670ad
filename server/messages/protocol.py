"""The Anthropic Messages request as AHC takes it: vLLM's request with AHC's `context`, and the session
Claude Code names in its metadata."""

from __future__ import annotations

import json
import re
from typing import Any

from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest

from orchestrator.context_spec import ContextSpec

# Claude Code's `metadata.user_id`: "user_<hash>_account_<uuid>_session_<uuid>", or the same as JSON.
_SESSION_SUFFIX = re.compile(r"_session_([0-9A-Za-z-]+)$")


class MessagesRequest(AnthropicMessagesRequest):
    """vLLM's Messages request with AHC's `context` (the `anthropic` client sends it in `extra_body`)."""

    context: ContextSpec | None = None


def metadata_session(metadata: dict[str, Any] | None) -> str | None:
    """The session part of `metadata.user_id`, None where it names no session (a plain user id)."""
    user_id = (metadata or {}).get("user_id")
    if not isinstance(user_id, str):
        return None
    if user_id.startswith("{"):
        try:
            parsed = json.loads(user_id)
        except ValueError:
            return None
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
        return session if isinstance(session, str) and session else None
    match = _SESSION_SUFFIX.search(user_id)
    return match.group(1) if match else None
