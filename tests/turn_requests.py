"""Turn requests as the orchestrator tests write them: one user message."""

from __future__ import annotations

from typing import Any

from orchestrator.context_spec import ContextSpec
from orchestrator.turn_request import TurnRequest


def asking(spec: ContextSpec | None, content: str, **fields: Any) -> TurnRequest:
    """One user message's turn request."""
    return TurnRequest(spec, [{"role": "user", "content": content}], **fields)
