"""The orchestrator on one chat request: blocks from the request (and session), compaction, the
CAG/RAG decision, the CTC governor, assembly, and the cache report.

`prepare` decides; it never adds to the session's State. `commit` (with the reply) and `rollback`
settle it. The server drives them through a `ChatTurn` (`Orchestrator.turn`), which guarantees one
of the two happens, exactly once, whatever becomes of the request."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ahc.config import OrchestratorConfig
from ahc.errors import InvalidRequest
from orchestrator.assembler import AssemblyInput, RenderCache, assemble
from orchestrator.blocks import first_changed
from orchestrator.cache_report import PASSTHROUGH, CacheReport
from orchestrator.chat_turn import ChatTurn
from orchestrator.compaction import compact
from orchestrator.context_spec import CodexDoc, ContextSpec
from orchestrator.ctc_governor import CTCLimits, govern
from orchestrator.formatters import Excerpt, Formatter, FormatterRegistry
from orchestrator.karma import commit as commit_karma
from orchestrator.karma import plan_karma
from orchestrator.prepared import Prepared
from orchestrator.retrieval.limits import RagLimits
from orchestrator.session import SessionStore
from orchestrator.token_counter import TokenCounter
from orchestrator.turn import Turn

TURN_DROPS = ("ctc_depth", "ctc_prune_turns")  # governor actions that drop State turns

Summarize = Callable[[list[dict[str, Any]]], Awaitable[str]]


class Retriever(Protocol):
    async def retrieve(self, docs: Sequence[CodexDoc], query: str, k: int, scope: str | None) -> list[Excerpt]: ...
    def tool(self) -> dict[str, Any]: ...


class Orchestrator:
    def __init__(self, config: OrchestratorConfig, max_model_len: int, counter: TokenCounter,
                 sessions: SessionStore, retriever: Retriever | None = None,
                 summarize: Summarize | None = None) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.counter = counter
        self.sessions = sessions
        self.retriever = retriever
        self.summarize = summarize
        self.formatters = FormatterRegistry()
        self.render_cache = RenderCache()
        self.limits = RagLimits(config.rag_max_documents, config.rag_max_document_chars, config.rag_max_total_chars)

    async def prepare(self, spec: ContextSpec | None, messages: list[dict[str, Any]],
                      force_compaction: bool = False) -> Prepared:
        if spec is None:
            return self._passthrough(messages)
        self.limits.check([(doc.id, doc.text) for doc in spec.codex])
        identity, new_turns, query = split_messages(messages)
        formatter = self.formatters.get(spec.formatter or self.config.formatter)
        session = self.sessions.get(spec.session_id) if spec.session_id else None
        actions: list[str] = []
        if session is not None and self.summarize is not None:
            if await compact(session, new_turns, self.config, self.config.compaction_tokens(self.max_model_len),
                             self.counter, self.summarize, force_compaction):
                actions.append("compaction")
        karma = plan_karma(spec.karma, session, self.config.karma_staging)
        if karma.fresh and query is None:  # no Query block to carry them this time
            karma = karma.all_in_block()
        state = tuple(session.turns if session else ()) + tuple(new_turns)
        inp = AssemblyInput(identity=spec.identity if spec.identity is not None else identity,
                            codex=tuple(spec.codex), karma=karma.block, staged_karma=karma.fresh,
                            summary=session.summary if session else None, state=state, query=query)
        mode = self._mode(spec, inp, formatter)
        extra_tools: list[dict[str, Any]] = []
        if mode == "rag":
            inp = replace(inp, include_codex=False)
            if self.retriever is not None and spec.codex:
                excerpts = await self.retriever.retrieve(spec.codex, query or "", self.config.rag_top_k,
                                                         spec.session_id)
                inp = replace(inp, excerpts=tuple(excerpts))
                extra_tools.append(self.retriever.tool())
        governed, ctc_actions = self._govern(inp, formatter)
        if karma.block != karma.entries and any(a.startswith(TURN_DROPS) for a in ctc_actions):
            # The dropped turns may carry staged karma: every entry goes back in the Karma block.
            karma = karma.all_in_block()
            governed, ctc_actions = self._govern(replace(inp, karma=karma.block, staged_karma=()), formatter)
        inp = governed
        actions += ctc_actions
        prompt = assemble(inp, formatter, self.counter, self.render_cache)
        report = CacheReport(mode, tuple(prompt.blocks), prompt.prefix_sha256,
                             first_changed(prompt.blocks, session.last_hashes if session else None), actions)
        session_id = spec.session_id or new_session_id()
        stored_query = formatter.query(query, (), karma.fresh) if query is not None else None
        return Prepared(prompt.messages, report, session_id, session, list(new_turns), prompt, extra_tools,
                        query=query, spec=spec, raw_messages=messages, karma=karma, stored_query=stored_query)

    def turn(self, spec: ContextSpec | None, messages: list[dict[str, Any]]) -> ChatTurn:
        """One request's life: `async with orchestrator.turn(spec, messages) as turn: ...`, then
        `await turn.commit(reply)`; anything else rolls the session back."""
        lock = self.sessions.lock(spec.session_id) if spec is not None and spec.session_id else None
        return ChatTurn(self, spec, messages, lock)

    async def shrink(self, prepared: Prepared) -> Prepared | None:
        """The same request with its session's State compacted now (the VRAM governor's second resort);
        None when there is nothing to compact. The new report keeps the actions already taken."""
        session = prepared.session
        if session is None or self.summarize is None:
            return None
        before = len(session.turns)
        again = await self.prepare(prepared.spec, prepared.raw_messages, force_compaction=True)
        if "compaction" not in again.actions and len(session.turns) >= before:
            return None
        taken = prepared.actions
        again.report.governor = taken + [a for a in again.actions if a not in taken]
        return again

    def _govern(self, inp: AssemblyInput, formatter: Formatter) -> tuple[AssemblyInput, list[str]]:
        limits = CTCLimits(self.config.max_chars, self.config.max_turns)
        return govern(inp, limits, lambda i: assemble(i, formatter, self.counter, self.render_cache).chars)

    def _mode(self, spec: ContextSpec, inp: AssemblyInput, formatter: Formatter) -> str:
        if spec.mode != "auto":
            return spec.mode
        tokens = assemble(inp, formatter, self.counter, self.render_cache).tokens
        return "cag" if tokens < self.config.cag_threshold * self.max_model_len else "rag"

    def _passthrough(self, messages: list[dict[str, Any]]) -> Prepared:
        """No `context`: the request goes to vLLM as sent; only the report is added."""
        identity, turns, query = split_messages(messages, strict=False)
        inp = AssemblyInput(identity=identity, codex=(), karma=(), summary=None, state=tuple(turns), query=query)
        prompt = assemble(inp, self.formatters.get("default"), self.counter, self.render_cache)
        report = CacheReport(PASSTHROUGH, tuple(prompt.blocks), prompt.prefix_sha256, None)
        return Prepared(messages, report, new_session_id(), None, list(turns), prompt)

    def rollback(self, prepared: Prepared) -> None:
        """The request failed or was cut off: the State stays as it was before it (a compaction it
        triggered stays: that is a State of its own). What the cache holds is no longer known."""
        if prepared.session is not None:
            prepared.session.last_hashes = None

    def commit(self, prepared: Prepared, reply: dict[str, Any]) -> Any:
        """After the response: the request's turns, the query and the reply join the session's State,
        which is persisted; returns the store's receipt (a future when it saves in the background)."""
        session = prepared.session
        if session is None:
            return None
        session.turns.extend(prepared.new_turns)
        session.last_hashes = prepared.prompt.hashes()
        if prepared.stored_query is not None:
            session.turns.append(Turn(role="user", content=prepared.stored_query))
        session.turns.append(Turn.from_message(reply))
        if prepared.karma is not None:
            commit_karma(session, prepared.karma)
        return self.sessions.save(session)


def split_messages(messages: list[dict[str, Any]], strict: bool = True) -> tuple[str, list[Turn], str | None]:
    """(identity from the system messages, the turns before the query, the query or None)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages: must be a list of message objects", param="messages")
    system = [m for m in messages if m.get("role") in ("system", "developer")]
    rest = [m for m in messages if m.get("role") not in ("system", "developer")]
    identity = "\n\n".join(str(m.get("content") or "") for m in system)
    query = None
    if rest and rest[-1].get("role") == "user":
        last = Turn.from_message(rest[-1])
        query, rest = last.content, rest[:-1]
    turns = []
    for message in rest:
        try:
            turns.append(Turn.from_message(message))
        except (InvalidRequest, KeyError, TypeError):
            if strict:
                raise InvalidRequest(f"messages: cannot use a {message.get('role')!r} message as State",
                                     param="messages") from None
    return identity, turns, query


def new_session_id() -> str:
    return f"sess-{uuid.uuid4().hex[:16]}"
