"""What the orchestrator decided for one chat request: the messages vLLM gets, the cache report, and
what joins the session's State if the request completes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.assembler import AssembledPrompt
from orchestrator.cache_report import CacheReport
from orchestrator.codex_placement import Placement
from orchestrator.compaction import Compaction
from orchestrator.context_spec import CodexDoc
from orchestrator.karma import KarmaPlan
from orchestrator.message import Message
from orchestrator.session import Session
from orchestrator.turn_request import TurnRequest
from orchestrator.turn_retry import TurnMark


@dataclass
class Prepared:
    """What the server sends to vLLM, and what it reports and records afterwards."""

    messages: list[dict[str, Any]]
    report: CacheReport
    session_id: str
    session: Session | None
    new_messages: list[Message]
    prompt: AssembledPrompt
    request: TurnRequest  # what the request asked, for a re-prepare (shrink)
    extra_tools: list[dict[str, Any]] = field(default_factory=list)
    query: str | None = None
    karma: KarmaPlan | None = None
    stored_query: str | None = None  # the user turn as it joins the State (with the karma it staged)
    prompt_tokens: int = 0  # the prompt as the engine counts it: blocks plus chat template and tools
    # Codex documents without a condensed rendition that would have kept the Codex in the prompt.
    condense_wanted: tuple[CodexDoc, ...] = ()
    compactions: tuple[Compaction, ...] = ()  # of the session's State, made while preparing
    compaction_requested: bool = False  # the first of them asked for (a client or the model), not forced by size
    named: bool = False  # session_id named by the client (header, prompt_cache_key), its State not kept
    placement: Placement | None = None  # where the Codex sits; the session keeps it when the turn commits
    # A request sent as written: the head of its messages' chain (orchestrator/conversations.py),
    # which its reply extends into its session's latest head when the turn commits.
    conversation: str | None = None
    # A request sent as written whose messages continue its session's conversation: how many of its messages
    # (new_messages) the session has had already; None when that is not known.
    seen_messages: int | None = None
    thread: str | None = None  # sent as written: the tool set it offers (orchestrator/named_sessions.py)
    brought: str = ""  # a digest of the messages and query it brings to the State (orchestrator/turn_retry.py)
    mark: TurnMark | None = None  # the one its commit left on the session, which its delivery completes

    @property
    def actions(self) -> list[str]:
        return self.report.governor
