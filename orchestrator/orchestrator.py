"""The orchestrator on one chat request: blocks from the request (and session), compaction, the
CAG/RAG decision, the CTC governor, assembly, and the cache report (SPEC §4.1)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Protocol, Sequence

from ahc.config import OrchestratorConfig
from orchestrator.assembler import AssembledPrompt, AssemblyInput, RenderCache, assemble
from orchestrator.blocks import first_changed
from orchestrator.compaction import compact
from orchestrator.context_spec import CodexDoc, ContextSpec
from orchestrator.ctc_governor import CTCLimits, govern
from orchestrator.formatters import Excerpt, Formatter, FormatterRegistry
from orchestrator.karma import KarmaPlan, commit as commit_karma, plan_karma
from orchestrator.retrieval.limits import RagLimits
from orchestrator.session import Session, SessionStore
from orchestrator.token_counter import TokenCounter
from orchestrator.turn import Turn

TURN_DROPS = ("ctc_depth", "ctc_prune_turns")  # governor actions that drop State turns

Summarize = Callable[[list[dict[str, Any]]], Awaitable[str]]


class Retriever(Protocol):
    async def retrieve(self, docs: Sequence[CodexDoc], query: str, k: int, scope: str | None) -> list[Excerpt]: ...
    def tool(self) -> dict[str, Any]: ...


@dataclass
class Prepared:
    """What the server sends to vLLM, and what it reports and records afterwards."""

    messages: list[dict[str, Any]]
    report: dict[str, Any]
    session_id: str
    session: Session | None
    new_turns: list[Turn]
    extra_tools: list[dict[str, Any]] = field(default_factory=list)
    prompt: AssembledPrompt | None = None
    query: str | None = None
    prior_turns: int = 0
    spec: ContextSpec | None = None
    raw_messages: list[dict[str, Any]] = field(default_factory=list)
    on_complete: list[Callable[[], None]] = field(default_factory=list)
    karma: KarmaPlan | None = None
    stored_query: str | None = None  # the user turn as it joins the State (with the karma it staged)

    @property
    def actions(self) -> list[str]:
        return self.report["governor"]


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
        report = {
            "mode": mode,
            "blocks": [block.report() for block in prompt.blocks],
            "prefix_sha256": prompt.prefix_sha256,
            "first_changed_block": first_changed(prompt.blocks, session.last_hashes if session else None),
            "governor": actions,
        }
        prior = len(session.turns) if session else 0
        if session is not None:
            session.turns.extend(new_turns)
            session.last_hashes = prompt.hashes()
        session_id = spec.session_id or new_session_id()
        stored_query = formatter.query(query, (), karma.fresh) if query is not None else None
        return Prepared(prompt.messages, report, session_id, session, list(new_turns), extra_tools, prompt,
                        query=query, prior_turns=prior, spec=spec, raw_messages=messages, karma=karma,
                        stored_query=stored_query)

    async def shrink(self, prepared: Prepared) -> Prepared | None:
        """The same request with its session's State compacted now (the VRAM governor's second resort);
        None when there is nothing to compact."""
        session = prepared.session
        if session is None or self.summarize is None:
            return None
        del session.turns[prepared.prior_turns:]
        before = len(session.turns)
        again = await self.prepare(prepared.spec, prepared.raw_messages, force_compaction=True)
        if "compaction" not in again.actions and len(session.turns) >= before:
            return None
        return again

    def _govern(self, inp: AssemblyInput, formatter: Formatter) -> tuple[AssemblyInput, list[str]]:
        limits = CTCLimits(self.config.max_chars, self.config.max_turns)
        return govern(inp, limits, lambda i: assemble(i, formatter, self.counter, self.render_cache).chars)

    def _mode(self, spec: ContextSpec, inp: AssemblyInput, formatter) -> str:
        if spec.mode != "auto":
            return spec.mode
        tokens = assemble(inp, formatter, self.counter, self.render_cache).tokens
        return "cag" if tokens < self.config.cag_threshold * self.max_model_len else "rag"

    def _passthrough(self, messages: list[dict[str, Any]]) -> Prepared:
        """No `context`: the request goes to vLLM as sent; only the report is added."""
        identity, turns, query = split_messages(messages, strict=False)
        inp = AssemblyInput(identity=identity, codex=(), karma=(), summary=None, state=tuple(turns), query=query)
        prompt = assemble(inp, self.formatters.get("default"), self.counter, self.render_cache)
        report = {"mode": "passthrough", "blocks": [b.report() for b in prompt.blocks],
                  "prefix_sha256": prompt.prefix_sha256, "first_changed_block": None, "governor": []}
        return Prepared(messages, report, new_session_id(), None, list(turns), prompt=prompt)

    def complete(self, prepared: Prepared, reply: dict[str, Any] | None) -> Any:
        """After the response: the query and the reply join the session's State, which is persisted.
        A failed request (no reply) leaves the State as it was before it."""
        for callback in prepared.on_complete:
            callback()
        prepared.on_complete.clear()
        session = prepared.session
        if session is None:
            return
        if reply is None:
            del session.turns[prepared.prior_turns:]
            session.last_hashes = None
            return
        if prepared.stored_query is not None:
            session.turns.append(Turn(role="user", content=prepared.stored_query))
        session.turns.append(Turn.from_message(reply))
        if prepared.karma is not None:
            commit_karma(session, prepared.karma)
        return self.sessions.save(session)  # the store's receipt (a future when saved in the background)


def split_messages(messages: list[dict[str, Any]], strict: bool = True) -> tuple[str, list[Turn], str | None]:
    """(identity from the system messages, the turns before the query, the query or None)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages: must be a list of message objects")
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
        except (ValueError, KeyError, TypeError):
            if strict:
                raise ValueError(f"messages: cannot use a {message.get('role')!r} message as State") from None
    return identity, turns, query


def new_session_id() -> str:
    return f"sess-{uuid.uuid4().hex[:16]}"
