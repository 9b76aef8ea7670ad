"""What one chat request asks of the orchestrator, built once from the typed body and carried whole
through the turn, its preparation and a re-preparation (shrink)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.context_spec import ContextSpec, KarmaEntry
from orchestrator.turn_retry import Retry


@dataclass(frozen=True)
class TurnRequest:
    """`spec`: the request's `context` (None: passed through as sent). `completion_tokens`: its max_tokens
    (None: the configured default), the room the prompt leaves in the window. `tools`: the client's own,
    which the chat template renders into the prompt too. `tenant_prefix`: what the ids of the request's
    tenant are stored with (the server's `Tenant.prefix`; the server scopes `spec.session_id` itself); a
    request without a session gets its generated id and its Codex index under it. `label`: the (scoped)
    session a request without `context.session_id` was named by its client (a header, `prompt_cache_key`).
    `recorded_messages`: how many of the messages `messages` brings (after its system messages) are recorded
    already, where they were first said (a stored conversation seeding a session's State). `retry`: how the
    request marks itself as sent again (a retry of the session's last turn takes its place)."""

    spec: ContextSpec | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    completion_tokens: int | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tenant_prefix: str = ""
    label: str | None = None
    recorded_messages: int = 0
    retry: Retry = Retry()
    held_karma: tuple[KarmaEntry, ...] = ()
