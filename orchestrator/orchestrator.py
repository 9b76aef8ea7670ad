"""The orchestrator on one chat request: blocks from the request (and session), compaction, the
CAG/RAG decision, the CTC governor, assembly, and the cache report.

`prepare` decides; it never adds to the session's State. `commit` (with the reply) and `rollback`
settle it. The server drives them through a `Turn` (`Orchestrator.turn`), which guarantees one
of the two happens, exactly once, whatever becomes of the request."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from opentelemetry import trace

from core.config import OrchestratorConfig
from core.errors import InvalidRequest
from core.spans import CONTEXT_MODE, FIRST_CHANGED_BLOCK, GOVERNOR_ACTIONS, PROMPT_TOKENS, SESSION_ID
from orchestrator.assembler import AssembledPrompt, AssemblyInput, RenderCache, assemble, message_texts, prefetch
from orchestrator.blocks import Block, first_changed
from orchestrator.budget import BOUNDARY_SLACK, PromptMeter, RenderChat
from orchestrator.cache_report import PASSTHROUGH, REPLICA, SIDE_CALL, CacheReport
from orchestrator.codex_placement import RAG, Placement, codex_key, decide, moved
from orchestrator.codex_renditions import (
    CONDENSE_ACTION,
    CONDENSED,
    FULL,
    condensed_codex,
    report_entries,
    wanting_rendition,
)
from orchestrator.compaction import CONTINUED_INSTRUCTION, Compaction, CompactionCall, Summarize, compact
from orchestrator.context_spec import CodexDoc, ContextSpec
from orchestrator.conversations import Conversations, chain, extend
from orchestrator.ctc_governor import ctc_limits, govern
from orchestrator.formatters import Excerpt, Formatter, FormatterRegistry
from orchestrator.injectors import Injectors
from orchestrator.karma import KarmaPlan, plan_karma, with_held_karma
from orchestrator.karma import commit as commit_karma
from orchestrator.memory_tools import offered
from orchestrator.message import Message
from orchestrator.named_sessions import NamedSessions, tools_key
from orchestrator.prepared import Prepared
from orchestrator.retrieval.limits import RagLimits
from orchestrator.session import Session, SessionStore
from orchestrator.shared_conversations import ConversationTable
from orchestrator.token_counter import TokenCounter
from orchestrator.turn import Turn
from orchestrator.turn_request import TurnRequest
from orchestrator.turn_retry import TurnMark, brought

TURN_DROPS = ("ctc_depth", "ctc_prune_turns")  # governor actions that drop State turns

tracer = trace.get_tracer(__name__)  # the API's no-op until a tracer provider is installed


class Retriever(Protocol):
    async def retrieve(self, docs: Sequence[CodexDoc], query: str, k: int, scope: str | None,
                       tenant_prefix: str = "") -> list[Excerpt]: ...
    def tool(self) -> dict[str, Any]: ...


@dataclass
class _Request:
    """What one request brings to `prepare`, fixed across its compaction retries."""

    spec: ContextSpec
    identity: str
    new_messages: list[Message]
    query: str | None
    session: Session | None
    formatter: Formatter
    budget: int
    tools: tuple[dict[str, Any], ...]
    codex: tuple[CodexDoc, ...] = ()
    tenant_prefix: str = ""
    retrieved: tuple[Excerpt, ...] | None = None
    placement: Placement | None = None  # where the Codex sits in this request's prompt
    compacts: bool = False  # the State can be compacted: room is kept for the summary call


@dataclass
class _Plan:
    """One assembled try: the prompt, its tokens as the engine counts them, and whether it fits."""

    mode: str
    prompt: AssembledPrompt
    tokens: int
    fits: bool
    starved: bool  # the best excerpt left out for want of room the State takes
    karma: KarmaPlan
    extra_tools: list[dict[str, Any]]
    actions: list[str] = field(default_factory=list)
    overhead: int = 0
    rendition: str = FULL  # of the Codex documents that have a condensed one
    wanted: tuple[CodexDoc, ...] = ()  # documents a condensed rendition would have helped
    excerpts: tuple[Excerpt, ...] = ()  # in the Query block (RAG), kept in State with the turn
    passing: int = 0  # tokens of excerpts in the Query that do not join the State


class Orchestrator:
    def __init__(self, config: OrchestratorConfig, max_model_len: int, counter: TokenCounter,
                 sessions: SessionStore, retriever: Retriever | None = None,
                 summarize: Summarize | None = None, render: RenderChat | None = None,
                 conversations: tuple[ConversationTable, ConversationTable] | None = None) -> None:
        """`render`: the served chat template, (messages, tools) -> text, so prompt budgets count its
        tokens; without it they are estimated (orchestrator/budget.py). `conversations`: the tables of
        sessions inferred from messages and of sessions clients name, when other processes share them
        (None: kept in this process)."""
        self.config = config
        self.max_model_len = max_model_len
        self.counter = counter
        self.sessions = sessions
        self.retriever = retriever
        self.summarize = summarize
        self.formatters = FormatterRegistry()
        self.formatters.get(config.formatter, param="orchestrator.formatter")  # a bad one stops the start here
        self.injectors = Injectors(config.injectors)
        self.named = NamedSessions(config.max_sessions)
        # The sessions clients name, apart: a request naming none never joins one by its messages.
        self.conversations, self.named_conversations = conversations or (
            Conversations(config.max_sessions), Conversations(config.max_sessions))
        self.render_cache = RenderCache(max_chars=config.cache_max_chars)
        self.meter = PromptMeter(counter, render)
        self.limits = RagLimits(config.rag_max_documents, config.rag_max_document_chars, config.rag_max_total_chars)

    async def prepare(self, request: TurnRequest, force_compaction: bool = False) -> Prepared:
        """The prompt for one request (orchestrator/turn_request.py says what it brings); the session's
        State is compacted first when `force_compaction` (the VRAM governor's second resort)."""
        with tracer.start_as_current_span("ahc.prompt.assemble") as span:
            prepared = await self._prepare(request, force_compaction)
            if span.is_recording():
                span.set_attributes(prompt_attributes(prepared))
            return prepared

    async def _prepare(self, turn: TurnRequest, force_compaction: bool) -> Prepared:
        spec, messages, tenant_prefix, label = turn.spec, turn.messages, turn.tenant_prefix, turn.label
        if spec is None:
            identity, state, query = split_messages(messages, strict=False)
            await self.counter.prefetch([identity, *message_texts(state), query or ""])
            return self._passthrough(turn)
        spec = with_held_karma(spec, turn.held_karma)
        if spec.session_id is not None:
            label = None  # a session the server keeps: its own State and hashes
        spec = await self.injectors.apply(spec, spec.session_id or label, tenant_prefix)
        naming = "explicit" if spec.session_id is not None or label is not None else "new"
        codex = tuple(spec.documents())
        self.limits.check([(doc.id, doc.text) for doc in codex])
        budget = self.prompt_budget(turn.completion_tokens)
        identity, new_messages, query = split_messages(messages)
        formatter = self.formatters.get(spec.formatter or self.config.formatter)
        session = await self.sessions.aget(spec.session_id) if spec.session_id else None
        brings = brought(new_messages, query)
        if session is not None and session.last_turn is not None and session.last_turn.retried_by(brings, turn.retry):
            session = session.without_last_turn()
        # Compaction counts the State's tokens first: long messages are counted off the event loop.
        await self.counter.prefetch(message_texts([*(session.messages if session else ()), *new_messages]))
        can_compact = session is not None and self.summarize is not None
        request = _Request(spec, identity or "", new_messages, query, session, formatter, budget, turn.tools,
                           codex, tenant_prefix, compacts=can_compact)
        request.placement = await self._placement(request)
        decided = request.placement
        actions: list[str] = []
        compactions: list[Compaction] = []
        requested = False

        async def compacted(threshold: int, force: bool, keep: int | None = None) -> None:
            assert session is not None and self.summarize is not None
            done = await compact(session, new_messages, self.config, threshold, self.counter, self.summarize, force,
                                 keep, partial(self._compaction_call, request))
            if done is not None:
                actions.append("compaction")
                compactions.append(done)

        if can_compact:
            assert session is not None
            requested = session.compaction_requested
            await compacted(self.config.compaction_tokens(self.max_model_len), force_compaction or requested)
            if requested:
                session.compaction_requested = False  # done, or nothing old enough to condense
        # Over the budget, crowding out the excerpts, or leaving no room for the next compaction's call,
        # the State is compacted, then compacted again down to no verbatim turns; a prompt that still
        # does not fit moves its Codex (condensed, then RAG); only one that fits no way is refused.
        keeps = [self.config.compaction_keep_turns, 0] if can_compact else []
        while True:
            plan = await self._plan(request)
            if plan.fits and not plan.starved and not (keeps and self._crowded(plan, request)):
                break
            if keeps:
                await compacted(0, True, keeps.pop(0))
                continue
            if plan.fits:  # served without excerpts (the model still has `query_archive`), or crowded
                break
            assert request.placement is not None
            step = moved(request.placement.rendition, codex, spec.mode)
            if step is None:
                raise self._too_large(plan, budget, self.max_model_len - budget)
            request.placement = replace(request.placement, rendition=step)
        actions += plan.actions
        placement = request.placement
        assert placement is not None
        # Against the placement the session's last turn had (its first turn: the one decided for it).
        before = session.placement if session is not None and session.placement is not None else decided.rendition
        switched = (before, placement.rendition) if before != placement.rendition else None
        switches = (session.mode_switches if session is not None else 0) + (switched is not None)
        report = CacheReport(plan.mode, tuple(plan.prompt.blocks), plan.prompt.prefix_sha256,
                             changed_since(plan.prompt.blocks, session, self.named.last_hashes(label)), actions,
                             report_entries(codex, plan.rendition, plan.mode == "cag"), switches, switched, naming)
        session_id = spec.session_id or label or tenant_prefix + new_session_id()
        karma = plan.karma
        # A RAG turn's excerpts stay in State with its question: from the next turn on they are part of
        # the cached prefix (and counted, and condensed, by compaction like any turn).
        stored_query = formatter.query(query, plan.excerpts, karma.fresh) if query is not None else None
        return Prepared(plan.prompt.messages, report, session_id, session, list(new_messages), plan.prompt, turn,
                        plan.extra_tools, query=query, karma=karma, stored_query=stored_query,
                        prompt_tokens=plan.tokens, condense_wanted=plan.wanted, compactions=tuple(compactions),
                        named=label is not None, placement=placement, brought=brings,
                        compaction_requested=requested and bool(compactions))

    def prompt_budget(self, completion_tokens: int | None) -> int:
        """The most tokens a prompt may take: the window less the reply's room."""
        reserve = self.config.completion_reserve(self.max_model_len, completion_tokens)
        if reserve >= self.max_model_len:
            raise InvalidRequest(f"max_tokens: {reserve:,} leaves no room for a prompt in the "
                                 f"{self.max_model_len:,}-token window", param="max_tokens",
                                 code="context_length_exceeded")
        return self.max_model_len - reserve

    async def _plan(self, r: _Request) -> _Plan:
        """One try at the prompt with the session's State as it is now."""
        spec, formatter, placement = r.spec, r.formatter, r.placement
        assert placement is not None
        inp, karma = self._input(r, query=r.query, new_messages=r.new_messages)
        await prefetch(inp, formatter, self.counter, self.render_cache)
        condense_actions = [CONDENSE_ACTION] if placement.rendition == CONDENSED else []
        wanted = wanting_rendition(r.codex) if placement.rendition == RAG and spec.mode == "auto" else ()
        extra_tools = self._extra_tools(r)
        starved, kept = False, False
        if placement.mode == "rag" and extra_tools:
            inp, starved, kept = await self._excerpts(inp, formatter, r, (*r.tools, *extra_tools))
        governed, ctc_actions = self._govern(inp, formatter)
        if karma.block != karma.entries and any(a.startswith(TURN_DROPS) for a in ctc_actions):
            # The dropped turns may carry staged karma: every entry goes back in the Karma block.
            karma = karma.all_in_block()
            governed, ctc_actions = self._govern(replace(inp, karma=karma.block, staged_karma=()), formatter)
        prompt = assemble(governed, formatter, self.counter, self.render_cache)
        tokens = self.meter.tokens(prompt, (*r.tools, *extra_tools))
        return _Plan(placement.mode, prompt, tokens, tokens <= r.budget, starved, karma, extra_tools,
                     condense_actions + ctc_actions, self.meter.overhead(prompt, (*r.tools, *extra_tools)),
                     CONDENSED if placement.rendition == CONDENSED else FULL, wanted,
                     governed.excerpts if kept else (), self._passing_tokens(governed, kept, formatter))

    def _input(self, r: _Request, query: str | None,
               new_messages: Sequence[Message]) -> tuple[AssemblyInput, KarmaPlan]:
        """The blocks of the request's prompt with its placement of the Codex and the State as it is now
        (`new_messages` and `query`: the request's own, or none for the prompt its session last sent)."""
        session, spec, placement = r.session, r.spec, r.placement
        assert placement is not None
        karma = plan_karma(spec.karma, session, self.config.karma_staging)
        if karma.fresh and query is None:  # no Query block to carry them this time
            karma = karma.all_in_block()
        codex = condensed_codex(r.codex) if placement.rendition == CONDENSED else r.codex
        inp = AssemblyInput(identity=spec.identity if spec.identity is not None else r.identity,
                            codex=codex, karma=karma.block, staged_karma=karma.fresh,
                            summary=session.summary if session else None,
                            state=tuple(session.messages if session else ()) + tuple(new_messages), query=query,
                            include_codex=placement.mode == "cag")
        return inp, karma

    def _extra_tools(self, r: _Request) -> list[dict[str, Any]]:
        """`query_archive` for a RAG prompt with a Codex to search, and the memory verbs the request names."""
        assert r.placement is not None
        tools = offered(r.spec.memory_tools)
        if r.placement.mode == "rag" and self.retriever is not None and r.codex:
            return [self.retriever.tool(), *tools]
        return tools

    async def _placement(self, r: _Request) -> Placement:
        """The session's placement while its Codex is the one it was decided for, else decided anew."""
        spec, formatter = r.spec, r.formatter
        threshold = spec.cag_threshold if spec.cag_threshold is not None else self.config.cag_threshold
        key = codex_key(r.codex, spec.mode, threshold, formatter.name)
        session = r.session
        if session is not None and session.placement is not None and session.placement_key == key:
            return Placement(session.placement, key)
        for docs in (r.codex, condensed_codex(r.codex)):  # long ones counted off the event loop
            await self.render_cache.prefetch_text_block((formatter.name, "codex", docs), partial(formatter.codex, docs),
                                                        self.counter, "codex", sum(len(doc.text) for doc in docs))

        def tokens(docs: tuple[CodexDoc, ...]) -> int:
            return self.render_cache.text_block((formatter.name, "codex", docs), lambda: formatter.codex(docs),
                                                self.counter, "codex").tokens

        return Placement(decide(r.codex, spec.mode, threshold * self.max_model_len, tokens), key)

    def _summary_room(self) -> int:
        """What a compaction's call adds to the session's prompt: its instruction and its summary."""
        cost = self.meter.cost
        return (self.counter.count(CONTINUED_INSTRUCTION) + cost.per_message + BOUNDARY_SLACK
                + self.config.compaction_max_tokens)

    def _passing_tokens(self, inp: AssemblyInput, kept: bool, formatter: Formatter) -> int:
        """Tokens the excerpts add to the Query, when they do not join the State."""
        if kept or not inp.excerpts or inp.query is None:
            return 0
        return (self.counter.count(formatter.query(inp.query, inp.excerpts, inp.staged_karma))
                - self.counter.count(formatter.query(inp.query, (), inp.staged_karma)))

    def _state_room(self, r: _Request) -> int:
        """The tokens the State may take in this request's prompt, with room left for the reply and the
        next compaction's call. A compaction keeps at most `compaction_keep_share` of it verbatim, and a
        RAG turn's excerpts (which join the State) take at most a quarter, so several turns fit between
        compactions."""
        inp, _ = self._input(r, query=r.query, new_messages=())
        bare = assemble(replace(inp, state=()), r.formatter, self.counter, self.render_cache)
        return max(r.budget - self.meter.tokens(bare, (*r.tools, *self._extra_tools(r))) - self._summary_room(), 0)

    def _crowded(self, plan: _Plan, r: _Request) -> bool:
        """This prompt, its reply and the next compaction's call would not fit the window together: the
        State is compacted now, while that call can still continue the cached prompt."""
        reserve = self.max_model_len - r.budget
        return plan.tokens - plan.passing + reserve + self._summary_room() > self.max_model_len

    async def _compaction_call(self, r: _Request) -> CompactionCall:
        """The session's prompt as its last request sent it, with this request's tools (an agent's
        tools do not change between turns): the summary call continues it, so it is read from the
        prefix cache. A transcript instead when that prompt and the call's room exceed the window."""
        session = r.session
        keep_tokens = int(self._state_room(r) * self.config.compaction_keep_share)
        if session is None or not session.messages:
            return CompactionCall(keep_tokens=keep_tokens)
        inp, _ = self._input(r, query=None, new_messages=())
        await prefetch(inp, r.formatter, self.counter, self.render_cache)
        governed, _ = self._govern(inp, r.formatter)
        prompt = assemble(governed, r.formatter, self.counter, self.render_cache)
        tools = (*r.tools, *self._extra_tools(r))
        if self.meter.tokens(prompt, tools) + self._summary_room() > self.max_model_len:
            return CompactionCall(keep_tokens=keep_tokens)
        return CompactionCall(prompt.messages, tuple(tools), keep_tokens)

    async def _excerpts(self, inp: AssemblyInput, formatter: Formatter, r: _Request,
                        tools: Sequence[dict[str, Any]]) -> tuple[AssemblyInput, bool, bool]:
        """The retrieved excerpts that fit what the budget leaves, best first, and never more tokens
        than the Codex they stand for (else CAG would have been the smaller prompt). Excerpts an earlier
        turn still in State delivered are not sent again. Then: whether the best excerpt was left out
        for want of room that compacting the State would give, and whether the excerpts join the State
        with their turn (a session's, when one takes at most a quarter of the State's room: a window
        too small for that would compact every turn, so its excerpts stay in the Query alone)."""
        if r.retrieved is None:  # retrieval depends on the query alone: once per request
            assert self.retriever is not None
            # Without a session, the index of the tenant's requests without one.
            scope = r.spec.session_id or r.tenant_prefix or None
            r.retrieved = tuple(await self.retriever.retrieve(r.codex, r.query or "", self.config.rag_top_k,
                                                              scope, r.tenant_prefix))
        if not r.retrieved or r.query is None:
            return inp, False, False
        delivered = "\n".join(m.content for m in inp.state if m.role == "user")
        fresh = [excerpt for excerpt in r.retrieved if excerpt.text.strip() not in delivered]
        if not fresh:
            return inp, False, False
        bare = assemble(inp, formatter, self.counter, self.render_cache)
        query_tokens = self.counter.count(formatter.query(r.query, (), inp.staged_karma))

        def cost(excerpts: Sequence[Excerpt]) -> int:
            return self.counter.count(formatter.query(r.query or "", excerpts, inp.staged_karma)) - query_tokens

        best = cost(fresh[:1])
        limit = self.counter.count(formatter.codex(r.codex))
        room = r.budget - self.meter.tokens(bare, tools)
        share = self._state_room(r) // 4 if r.compacts else 0
        kept = r.compacts and best <= share
        if kept:  # the excerpts join the State: a share of its room, so several turns fit between compactions
            limit = min(limit, share)
            room -= self._summary_room()
        chosen: list[Excerpt] = []
        for excerpt in fresh:
            if cost([*chosen, excerpt]) <= min(limit, room):
                chosen.append(excerpt)
        state_tokens = next(b.tokens for b in bare.blocks if b.name == "state")
        starved = fresh[0] not in chosen and best <= min(limit, room + state_tokens)
        return replace(inp, excerpts=tuple(chosen)), starved, kept

    def _too_large(self, plan: _Plan, budget: int, reserve: int) -> InvalidRequest:
        sizes = ", ".join(f"{b.name} {b.tokens:,}" for b in plan.prompt.blocks)
        return InvalidRequest(
            f"context: the prompt cannot fit the window even with the State compacted: {plan.tokens:,} prompt "
            f"tokens ({sizes}, chat template and tools {plan.overhead:,}) + {reserve:,} for the reply > "
            f"max_model_len {self.max_model_len:,}; shorten the largest block or ask for fewer max_tokens",
            param="context", code="context_length_exceeded")

    def turn(self, request: TurnRequest) -> Turn:
        """One request's life: `async with orchestrator.turn(request) as turn: ...`, then
        `await turn.commit(reply)`; anything else rolls the session back."""
        spec = request.spec
        lock = self.sessions.lock(spec.session_id) if spec is not None and spec.session_id else None
        return Turn(self, request, lock, self.sessions.holds)

    async def shrink(self, prepared: Prepared) -> Prepared | None:
        """The same request with its session's State compacted now (the VRAM governor's second resort);
        None when there is nothing to compact. The new report keeps the actions already taken."""
        session = prepared.session
        if session is None or self.summarize is None:
            return None
        before = len(session.messages)
        again = await self.prepare(prepared.request, force_compaction=True)
        if "compaction" not in again.actions and len(session.messages) >= before:
            return None
        taken = prepared.actions
        again.report.governor = taken + [a for a in again.actions if a not in taken]
        return again

    def _govern(self, inp: AssemblyInput, formatter: Formatter) -> tuple[AssemblyInput, list[str]]:
        limits = ctc_limits(self.config, self.max_model_len)
        return govern(inp, limits, lambda i: assemble(i, formatter, self.counter, self.render_cache).chars)

    def _passthrough(self, turn: TurnRequest) -> Prepared:
        """No `context`: the request goes to vLLM as sent; only the report is added. Its new messages and
        query are recorded as a sessionless request's with `context` are; under `label` when the client
        named its session."""
        messages, label, naming = turn.messages, turn.label, "explicit"
        heads = chain(turn.tenant_prefix, messages)
        if label is None:  # named by no one: the conversation its messages continue, if any
            found = self.conversations.find(heads, turn.tenant_prefix)
            label, seen = found if found is not None else (None, None)
            naming = "new" if label is None else "inferred"
        identity, state, query = split_messages(messages, strict=False)
        inp = AssemblyInput(identity=identity, codex=(), karma=(), summary=None, state=tuple(state), query=query)
        prompt = assemble(inp, self.formatters.get("default"), self.counter, self.render_cache)
        thread = tools_key(turn.tools)
        if label is not None and naming == "explicit":
            seen = self.named_conversations.seen(label, heads, turn.tenant_prefix)
            if self.named.side(label, thread, seen is not None, prompt.hashes().get("identity")):
                naming, seen = SIDE_CALL, None  # a title, summary or quota call beside the session's turns
        last = self.named.last_hashes(label, thread if naming in ("explicit", SIDE_CALL) else None,
                                      side=naming == SIDE_CALL)
        report = CacheReport(PASSTHROUGH, tuple(prompt.blocks), prompt.prefix_sha256,
                             first_changed(prompt.blocks, last), session_naming=naming)
        seen_messages = None if seen is None else sum(m.get("role") not in INSTRUCTIONS for m in messages[:seen])
        return Prepared(messages, report, label or turn.tenant_prefix + new_session_id(), None, list(state), prompt,
                        turn, query=query, named=label is not None, conversation=heads[-1] if heads else None,
                        seen_messages=seen_messages, thread=thread)

    def rollback(self, prepared: Prepared) -> None:
        """The request failed or was cut off: the State stays as it was before it (a compaction it
        triggered stays: that is a State of its own). What the cache holds is no longer known."""
        if prepared.session is not None:
            prepared.session.last_hashes = None
        elif prepared.named:
            self.named.forget(prepared.session_id)

    def abandon(self, prepared: Prepared) -> None:
        """The commit's save failed: the turn is not in the State the next request reads (a client's
        retry of it joins the State once, not twice), or, stored after all, is read back undelivered."""
        if prepared.session is not None:
            self.sessions.reload(prepared.session_id, undelivered=prepared.mark)

    def delivered(self, prepared: Prepared) -> None:
        """The committed turn's reply reached the server's socket whole: no retry takes its place now."""
        if prepared.mark is not None:
            prepared.mark.delivered = True

    def commit(self, prepared: Prepared, reply: dict[str, Any]) -> Any:
        """After the response: the request's messages, the query and the reply join the session's State,
        which is persisted; returns the store's receipt (a future when it saves in the background)."""
        session = prepared.session
        if session is None:
            side = prepared.report.session_naming == SIDE_CALL
            if prepared.named or prepared.report.session_naming == "new":
                self.named.remember(prepared.session_id, prepared.prompt.hashes(), prepared.thread, side)
            if prepared.conversation is not None and not side:
                conversations = self.named_conversations if prepared.report.session_naming == "explicit" \
                    else self.conversations
                conversations.advance(prepared.session_id, extend(prepared.conversation, reply), prepared.conversation,
                                      prepared.request.tenant_prefix)
            return None
        session.last_turn = prepared.mark = TurnMark(prepared.brought, prepared.request.retry.key,
                                                     len(session.messages), list(session.karma),
                                                     list(session.staged_karma), delivered=False)
        session.messages.extend(prepared.new_messages)
        session.last_hashes = prepared.prompt.hashes()
        session.moved_from = None
        if prepared.stored_query is not None:
            session.messages.append(Message(role="user", content=prepared.stored_query))
        session.messages.append(Message.from_message(reply))
        if prepared.karma is not None:
            commit_karma(session, prepared.karma)
        if prepared.placement is not None:
            session.placement, session.placement_key = prepared.placement.rendition, prepared.placement.key
            session.mode_switches = prepared.report.mode_switches
        return self.sessions.save(session)


# The roles whose messages make the Identity, not the State.
INSTRUCTIONS = ("system", "developer")


def split_messages(messages: list[dict[str, Any]], strict: bool = True) -> tuple[str, list[Message], str | None]:
    """(identity from the system messages, the messages before the query, the query or None)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages: must be a list of message objects", param="messages")
    system = [m for m in messages if m.get("role") in INSTRUCTIONS]
    rest = [m for m in messages if m.get("role") not in INSTRUCTIONS]
    identity = "\n\n".join(str(m.get("content") or "") for m in system)
    query = None
    if rest and rest[-1].get("role") == "user":
        last = Message.from_message(rest[-1])
        query, rest = last.content, rest[:-1]
    state = []
    for message in rest:
        try:
            state.append(Message.from_message(message))
        except (InvalidRequest, KeyError, TypeError):
            if strict:
                raise InvalidRequest(f"messages: cannot use a {message.get('role')!r} message as State",
                                     param="messages") from None
    return identity, state, query


def prompt_attributes(prepared: Prepared) -> dict[str, Any]:
    """What a trace shows of a prepared prompt; its tokens as the orchestrator counted them (none for a
    request sent as written)."""
    report = prepared.report
    attributes: dict[str, Any] = {SESSION_ID: prepared.session_id, CONTEXT_MODE: report.mode}
    if prepared.prompt_tokens:
        attributes[PROMPT_TOKENS] = prepared.prompt_tokens
    if report.first_changed_block is not None:
        attributes[FIRST_CHANGED_BLOCK] = report.first_changed_block
    if report.governor:
        attributes[GOVERNOR_ACTIONS] = list(report.governor)
    return attributes


def changed_since(blocks: list[Block], session: Session | None, named: dict[str, str] | None) -> str | None:
    """`first_changed_block` against the session's last request (a kept session's, else a named one's);
    `replica` when the session's last request was served by another server."""
    if session is not None and session.moved_from is not None:
        return REPLICA
    return first_changed(blocks, session.last_hashes if session else named)


def new_session_id() -> str:
    return f"sess-{uuid.uuid4().hex[:16]}"
