"""The composition root: every part of a running server, built once, in order, from the config, the
engine and the experience database. The launcher starts, serves and stops; routes read the Runtime."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from core.config import AHCConfig, resolve_path
from orchestrator.compaction import SummaryCall, SummaryReply
from orchestrator.orchestrator import Orchestrator
from orchestrator.retrieval import CodexRetriever, ScopedIndexes
from orchestrator.session import SessionStore, SharedSessions
from orchestrator.shared_conversations import ConversationTable, SharedConversations
from orchestrator.token_counter import TokenCounter
from server.admission.cache_events import CacheEvents
from server.admission.hidden import HiddenAdmission, TenantBudget
from server.admission.session_admission import Costs, SessionAdmission, offload_blocks
from server.admission.vram_governor import VramGovernor
from server.api_servers.group import ApiGroup
from server.api_servers.session_lease import SessionLeases
from server.api_servers.shared_board import SharedBoard
from server.capture.capture_setup import CaptureSetup
from server.codex.codex_condenser import CodexCondenser
from server.codex.codex_resolver import CodexResolver
from server.identity.identity_condenser import IdentityCondenser, Limits
from server.karma.karma_review import KarmaReview
from server.kv_order.session_returns import SessionReturns
from server.metrics import AHCMetrics
from server.model.hidden_calls import HiddenCaller
from server.model.token_process import TokenProcess
from server.recording.quota_loop import model_summarizer
from server.recording.recorder import Recorder, RecordingEngine
from server.recording.steering import Steering, load_hook
from server.tenancy.tenants import TenantKeys
from xdb import XDBClient
from xdb.lake.lake import LakeUnavailable

log = logging.getLogger("ahc.server")

if TYPE_CHECKING:  # vLLM is imported when the engine starts, not with this module
    from vllm.renderers.chat_utils import ChatCompletionMessageParam
    from vllm.tokenizers.protocol import TokenizerLike
    from vllm.v1.engine.async_llm import AsyncLLM


@dataclass(frozen=True)
class Runtime:
    config: AHCConfig
    engine: RecordingEngine  # what vLLM's OpenAI layer and our routes talk to
    tokenizer: TokenizerLike
    xdb: XDBClient
    metrics: AHCMetrics
    orchestrator: Orchestrator
    retriever: CodexRetriever
    governor: VramGovernor
    session_admission: SessionAdmission | None  # None: first come, first served
    returns: SessionReturns | None  # each session's place in line and return hint (None: the engine gets neither)
    recorder: Recorder
    summarize_records: Callable[[str], str]  # XDB compression summaries, by the served model
    capture: CaptureSetup | None
    background: ThreadPoolExecutor  # one ordered worker for small synchronous XDB writes
    rag_indexes: ScopedIndexes
    keys: TenantKeys  # empty: no key, one local tenant
    codex: CodexResolver  # Codex entries by reference, and stored condensed renditions
    condenser: CodexCondenser  # makes the renditions (requests ask only when codex_condense is on)
    hidden: HiddenCaller  # the server's own calls to the model (compaction summaries, renditions)
    identity: IdentityCondenser  # condensed Identities, checked against the caller's tests
    karma: KarmaReview  # the review step: proposals for Karma, their verdicts, the Karma it holds per session
    token_process: TokenProcess | None = None

    def close(self) -> None:
        """Stop what the runtime started (the engine and XDB belong to the launcher)."""
        self.condenser.cancel()
        if self.token_process is not None:
            self.token_process.close()
        self.background.shutdown(wait=True)
        self.rag_indexes.close()



def build_session_admission(config: AHCConfig, metrics: AHCMetrics,
                            observed: CacheEvents | None = None) -> SessionAdmission | None:
    """Session-aware admission on the engine's measured cache, prefill rate and offload tier (what the
    metrics read from the engine), and what it holds per session (`observed`: its KV events, when read);
    None when the config turns it off (first come, first served)."""
    oc, stats = config.orchestrator, metrics.kv_stats
    if not oc.session_admission:
        return None
    offload_gib = config.engine.kv_offloading_size
    costs = Costs(capacity_blocks=lambda: stats.total_blocks,
                  prefill_s_per_block=lambda: metrics.prefill.s_per_block(stats.block_size),
                  offload_blocks=lambda: offload_blocks(offload_gib, stats.bytes_per_block),
                  load_s_per_block=lambda: metrics.host_load.s_per_block(stats.bytes_per_block))
    return SessionAdmission(costs, oc.session_hot_s, oc.session_max_wait_s, oc.session_wait_per_prefill,
                            first_wait_s=oc.session_first_wait_s, observed=observed)


def build_runtime(config: AHCConfig, engine: AsyncLLM, xdb: XDBClient, metrics: AHCMetrics,
                  capture: CaptureSetup | None = None, loop: asyncio.AbstractEventLoop | None = None,
                  chat_template: str | None = None, keys: TenantKeys | None = None,
                  cache_events: CacheEvents | None = None, group: ApiGroup | None = None) -> Runtime:
    """`engine`: vLLM's AsyncLLM (or a stand-in with its interface); `loop`: the serving event loop;
    `chat_template`: the template vLLM was given (`--chat-template`, loaded), None for the model's;
    `keys`: the API keys already read (else read from the config); `cache_events`: the engine's KV events,
    as read (None: none are); `group`: the API processes this one serves among (None: it is alone)."""
    tokenizer = engine.get_tokenizer()
    oc = config.orchestrator
    max_model_len = config.engine.max_model_len
    background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ahc-xdb-state")
    keys = keys if keys is not None else TenantKeys.build(config.api_key, config.api_keys_file)
    hidden = HiddenCaller(engine, tokenizer, max_model_len, chat_template, keys=keys)
    # One per session's Codex, and per API process: an index file is open in one process at a time.
    rag_dir = "rag" if group is None or group.index == 0 else f"rag.api-{group.index}"
    rag_indexes = ScopedIndexes(Path(resolve_path(config.data_dir)) / rag_dir, max_files=oc.rag_max_index_files)
    retriever = CodexRetriever(rag_indexes)
    # A session dropped from memory keeps its State in XDB, but its RAG index is only a cache of the
    # Codex the client sends with every request: it is deleted (off the event loop) rather than kept
    # on disk for a session that may never return, and rebuilt if the session does.
    def load_state(session_id: str) -> str | None:
        state, corrupt = xdb.load_session_state_verified(session_id)
        if corrupt:
            metrics.one(metrics.corrupt_session_states).inc(len(corrupt))
        return state

    sessions = SessionStore(load_state,
                            lambda sid, state: background.submit(save_state, xdb, metrics, sid, state),
                            oc.max_sessions, on_evict=lambda sid: background.submit(rag_indexes.drop, sid),
                            # In a cluster a session may come back on another replica: its State says so.
                            replica=config.xdb.lake.replica_id if config.xdb.backend == "ducklake" else None,
                            shared=shared_sessions(group, xdb) if group is not None else None)

    async def summarize_state(call: SummaryCall) -> SummaryReply:
        reply = await hidden.complete(call.messages, oc.compaction_max_tokens, call.tools)
        metrics.record_compaction_call(reply.prompt_tokens, reply.cached_tokens, call.continued)
        return reply

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    token_process = TokenProcess.for_tokenizer(tokenizer, encode)  # very long texts: tokenized apart
    counter = TokenCounter(encode, max_chars=oc.cache_max_chars,
                           count_long=token_process.count if token_process is not None else None)

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        # The prompt the engine will see, so the orchestrator's budget counts the template's tokens too.
        # The messages are OpenAI chat dicts, which vLLM's signature names by its TypedDicts.
        chat = cast("list[ChatCompletionMessageParam]", messages)
        return str(tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True,
                                                 chat_template=chat_template))

    orchestrator = Orchestrator(oc, max_model_len, counter, sessions, retriever, summarize_state, render,
                                conversations=shared_conversations(group, oc.max_sessions) if group else None)
    board = SharedBoard(group.files.board, group.index) if group is not None else None
    governor = VramGovernor(metrics.kv_stats, oc.vram_queue_timeout_s, oc.retry_after_s, shared=board)
    session_admission = build_session_admission(config, metrics, cache_events)
    hook = config.lens.steering_hook
    steering = Steering(hook, load_hook(hook), xdb) if hook is not None else None
    recorder = Recorder(xdb, tokenizer, background, capture, config.engine_label, steering)
    codex = CodexResolver(xdb, config.model_name, oc.cache_max_chars)
    hidden_admission = HiddenAdmission(governor, TenantBudget(int(oc.codex_condense_windows_per_hour * max_model_len)))
    condenser = CodexCondenser(hidden.summarize, lambda text: len(encode(text)), xdb, codex,
                               oc.codex_condense_ratio, max_model_len, hidden_admission)
    # Its calls share the renditions' admission and per-tenant budget: both are the server's own calls.
    identity = IdentityCondenser(hidden.summarize, lambda text: len(encode(text)), Limits(
        oc.identity_condense_ratio, oc.identity_condense_max_tokens, oc.identity_test_max_tokens, max_model_len,
        config.xdb.max_document_bytes), hidden_admission)
    summarize_records = model_summarizer(hidden, loop or asyncio.get_running_loop(), config.xdb.summary_max_tokens)
    ec = config.engine
    # A hint only where something reads it: the scheduler class, or the native CPU tier's policy.
    hinted = ec.return_order in ("gpu", "both") or (
        ec.return_order == "cpu" and ec.kv_offloading_size is not None and ec.kv_offloading_backend == "native")
    returns = SessionReturns(ec.session_priority, hinted) if ec.session_priority or hinted else None
    recording = RecordingEngine(engine, recorder, keys.cache_salt, returns)  # every route's requests, salted by tenant
    return Runtime(config=config, engine=recording, tokenizer=tokenizer, xdb=xdb,
                   metrics=metrics, orchestrator=orchestrator, retriever=retriever, governor=governor,
                   session_admission=session_admission, returns=returns,
                   recorder=recorder, summarize_records=summarize_records, capture=capture,
                   background=background, rag_indexes=rag_indexes,
                   keys=keys,
                   codex=codex, condenser=condenser, hidden=hidden, identity=identity,
                   karma=KarmaReview(xdb, partial(review_call, hidden), config.model_name,
                                     admission=hidden_admission, count=lambda text: len(encode(text))),
                   token_process=token_process)


async def review_call(hidden: HiddenCaller, messages: list[dict[str, Any]], max_tokens: int, regex: str) -> str:
    """The review step's question to the served model, its answer held to `regex`."""
    return (await hidden.complete(messages, max_tokens, regex=regex)).text


def shared_sessions(group: ApiGroup, xdb: XDBClient) -> SharedSessions:
    """Sessions served by several API processes: leased across them, and a session another process
    served since is read again (its State from XDB, its next tick from what XDB committed). A lease
    goes once this process's rows are committed, so the next holder's ticks continue after them."""
    writer = xdb.writer
    assert writer is not None

    async def settle() -> None:
        await asyncio.to_thread(writer.flush)

    return SharedSessions(SessionLeases(group.files.leases), on_moved=xdb.forget_ticks,
                          unsettled=lambda: writer.queue_depth() > 0, settle=settle)


def shared_conversations(group: ApiGroup, capacity: int) -> tuple[ConversationTable, ConversationTable]:
    """The sessions inferred from messages, and those clients name, in tables every API process reads."""
    return (SharedConversations(group.files.conversations, capacity, name="inferred"),
            SharedConversations(group.files.conversations, capacity, name="named"))


def save_state(xdb: XDBClient, metrics: AHCMetrics, session_id: str, state: str) -> None:
    """A session's new State, stored before its reply completes. With the experience lake down it is
    stored locally all the same, and the reply stands: failing it (a 503) made the router and the
    client retry, and each retry appended the turn to the State again. The lake's shipper takes the
    State there once the lake is back; until then another replica would resume an older one."""
    try:
        xdb.save_session_state(session_id, state)
    except LakeUnavailable as exc:
        metrics.one(metrics.lake_deferred_states).inc()
        log.warning("session %r: its State is stored here but not yet in the lake (%s); it is shipped once the "
                    "lake is back", session_id, exc)
