"""What the server writes to XDB: a request's new input messages, every generated token, the reply's
tool calls and system events, as timestep rows on the writer's queue (never waiting on disk).

`RecordingEngine` is the engine client vLLM's OpenAI layer talks to: AsyncLLM, with every generated
token recorded. One interception point covers chat, completions, streaming and not: `generate`. The
request's session comes from the chat route (`current_session`); requests without one get a session
of their own."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

import numpy as np
from opentelemetry import trace

from core.spans import SESSION_ID
from lens.side_channel import completion_key
from orchestrator.cache_report import SIDE_CALL
from orchestrator.message import Message
from orchestrator.orchestrator import new_session_id
from orchestrator.prepared import Prepared
from server.capture.capture_setup import CaptureSetup
from server.recording.flush_group import FlushGroup
from server.recording.record_queue import RecordQueue
from server.recording.steering import Steering
from server.recording.token_text import TokenTexts
from server.telemetry.tracing import engine_trace_headers
from server.tenancy.request_context import EngineUsage, current_session, current_tenant, current_usage
from server.tenancy.tenants import Tenant
from xdb import XDBClient
from xdb.rows import DECODE_CONTEXT, TimestepRow, TokenBatch
from xdb.writer import FlushTimeout

if TYPE_CHECKING:  # vLLM is imported when the engine starts, not with this module
    from vllm.engine.protocol import EngineClient
    from vllm.tokenizers.protocol import TokenizerLike

    from server.kv_order.session_returns import SessionReturns

log = logging.getLogger("ahc.recorder")
tracer = trace.get_tracer(__name__)

EVENT_OF_ROLE = {"user": "input", "tool": "tool_result", "assistant": "input", "system": "system"}
# A row to record: (event type, role, content, metadata).
RowEvent = tuple[str, str | None, str, dict[str, Any] | None]


class Recorder:
    def __init__(self, xdb: XDBClient, tokenizer: TokenizerLike, background: Executor | None = None,
                 capture: CaptureSetup | None = None, engine_label: str | None = None,
                 steering: Steering | None = None) -> None:
        self.xdb = xdb
        self.steering = steering  # the steering hook, called after each reply (lens.steering_hook)
        self.engine_label = engine_label  # "emulated:PROFILE" on the emulated engine: on every turn record
        self.tokenizer = tokenizer
        # A fast tokenizer's texts are decoded where the rows are built (the XDB service), so this process,
        # whose CPU a token bounds throughput at GPU rates, ships token ids alone; a slow one's are made here.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.decodes_in_xdb = backend is not None
        if backend is not None:
            xdb.decode_tokens_with(backend.to_str())
        self.background = background  # one ordered worker for small synchronous XDB writes
        self.capture = capture  # activations from the engine's lens, when on (joined by the writer)
        # One tuple for every token batch: the writer groups batches by their names' identity.
        self.concept_names: tuple[str, ...] = capture.visible if capture else ()
        self.hidden_names: tuple[str, ...] = capture.hidden if capture else ()  # for the audit log alone
        writer = xdb.writer
        assert writer is not None  # the server opens its XDB for writing
        self.writer = writer
        self.queue = RecordQueue(writer, writer.max_queue_rows)
        self.flushes = FlushGroup(writer.flush)
        self._streams = itertools.count()  # numbers the token streams, for their chunk phases

    def submit(self, rows: list[TimestepRow] | TokenBatch) -> None:
        """Hand rows to the writer without waiting; a full writer queue delays them, never drops them."""
        self.queue.submit(rows)

    @property
    def alive(self) -> bool:
        return self.writer.alive

    def recording_state(self) -> tuple[str, str | None]:
        """("recording", None), ("paused", why) while XDB's disk fails, or ("stopped", why)."""
        return self.writer.recording_state()

    async def aflush(self, timeout: float = 10.0, session_id: str | None = None) -> None:
        """Wait, off the event loop, until every row accepted so far is committed. A disk that cannot keep
        up within `timeout` does not fail the reply: its rows stay queued, in order, and are written later.
        `session_id`: the session whose reply this makes durable, for the trace."""
        with tracer.start_as_current_span("ahc.record.flush") as span:
            if session_id is not None:
                span.set_attribute(SESSION_ID, session_id)
            deadline = asyncio.get_running_loop().time() + timeout
            try:
                await asyncio.wait_for(self.queue.drained(), timeout)
                remaining = max(deadline - asyncio.get_running_loop().time(), 0.0)
                await self.flushes.flush(remaining)
            except (TimeoutError, FlushTimeout):
                span.set_attribute("ahc.record.behind", True)
                log.warning("XDB is behind: %d rows waiting to be queued, %d queued but not committed",
                            self.queue.backlog_rows, self.writer.queue_depth())

    async def know_session(self, session_id: str) -> None:
        """Look a session's last tick up off the event loop, once, so recording its rows never waits
        on the database there (a session named by the client may have rows from before)."""
        if not self.xdb.ticks_known(session_id):
            await asyncio.to_thread(self.xdb.load_ticks, session_id)

    def rows(self, session_id: str, events: list[RowEvent],
             request_id: str | None = None) -> list[TimestepRow]:
        if not events:
            return []
        ticks = self.xdb.next_ticks(session_id, len(events))
        return [TimestepRow(session_id=session_id, tick=tick, event_type=event, role=role, content=content,
                            request_id=request_id, metadata=meta)
                for tick, (event, role, content, meta) in zip(ticks, events)]

    def record_inputs(self, prepared: Prepared) -> None:
        if prepared.session is None and not prepared.named:  # an id made for it: nothing stored to look up
            self.xdb.start_session(prepared.session_id)
        side = prepared.report.session_naming == SIDE_CALL  # its turn record holds what it was
        events: list[RowEvent] = [] if side else [
            event for message in new_input_messages(prepared) for event in input_events(message)]
        if prepared.query is not None and not side:
            events.append(("input", "user", prepared.query, None))
        for action in prepared.report.governor:
            events.append(("system", None, f"governor action {action}", {"action": action}))
        rows = self.rows(prepared.session_id, events)
        self.submit(rows)
        if prepared.compactions and rows and self.background is not None:
            # What this request's prompt no longer carries verbatim: the session's rows recorded before it.
            # One record per request, however many rounds it took (from the first's size to the last's).
            trigger = ("kv_cache_full" if "vram_compact" in prepared.actions else
                       "manual" if prepared.compaction_requested else "context_full")
            first, last = prepared.compactions[0], prepared.compactions[-1]
            future = self.background.submit(
                self.xdb.compact, prepared.session_id, up_to_tick=rows[0].tick - 1, summary=last.summary,
                trigger=trigger, tokens_before=first.tokens_before, tokens_after=last.tokens_after)
            future.add_done_callback(_log_compaction_failure)

    def record_reply(self, prepared: Prepared, reply: dict[str, Any] | None) -> None:
        if reply is None:
            return
        events: list[RowEvent] = [
            ("tool_call", "assistant", json.dumps(call, sort_keys=True), {"tool_call_id": call.get("id")})
            for call in reply.get("tool_calls") or []]
        self.submit(self.rows(prepared.session_id, events))

    def record_turn(self, prepared: Prepared, usage: EngineUsage | None) -> None:
        """A completed request's turn record: the cache report with the engine's usage, after its tokens,
        so a session's turns are the ranges of ticks between these rows (what the experience browser
        draws)."""
        report = prepared.report
        turn = {"mode": report.mode, "blocks": [b.report() for b in report.blocks],
                "first_changed_block": report.first_changed_block, "governor": list(report.governor),
                "prefix_sha256": report.prefix_sha256, "compactions": len(prepared.compactions),
                # The summary calls' own prefill, apart from the turn's (continued: read from the cache).
                "compaction_prompt_tokens": sum(c.prompt_tokens for c in prepared.compactions),
                "compaction_cached_tokens": sum(c.cached_tokens for c in prepared.compactions),
                "mode_switches": report.mode_switches, "session_naming": report.session_naming,
                "prompt_tokens": usage.prompt_tokens if usage else None,
                "cached_tokens": usage.cached_tokens if usage else None,
                "completion_tokens": usage.completion_tokens if usage else None,
                "request_id": usage.request_id if usage else None}
        if self.engine_label is not None:
            turn["engine"] = self.engine_label
        if prepared.thread is not None:  # the tools it offered: a side call's are not its session's turns'
            turn["thread"] = prepared.thread
        summary = (f"turn: {report.mode}, {turn['prompt_tokens']} prompt tokens, {turn['cached_tokens']} cached, "
                   f"first changed block {report.first_changed_block}")
        self.submit(self.rows(prepared.session_id, [("system", None, summary, {"turn": turn})]))

    def token_stream(self, session_id: str, request_id: str, n: int = 1, index: int = 0,
                     engine_id: str | None = None) -> TokenStream:
        """`engine_id`: the id the engine was given (the server's own), which keys the activations;
        `request_id` is what the rows show."""
        key = completion_key(engine_id or request_id, n, index) if self.capture is not None else None
        return TokenStream(self, session_id, request_id, key, phase=next(self._streams))


class TokenStream:
    """One completion's generated tokens, turned into `output` rows. Tokens are gathered and turned
    into rows CHUNK at a time: at GPU rates a reply's tokens come one engine step at a time, and the
    work a batch costs (ticks, validation, the hand-off to the writer) is paid once per chunk instead
    of once per token. A batch carries token ids, not texts: XDB decodes them (xdb/token_decoder.py),
    each batch after the reply's last DECODE_CONTEXT ids before it, so that it decodes on its own. A
    slow tokenizer (no fast one for XDB to load) has its texts made here (TokenTexts). With capture
    on, each batch names its engine request (`activation_key`) and the output position of its first
    token; the XDB writer joins the activations the engine sent it, so no activation passes through
    this process.

    Replies that start together (a batch of agents, a benchmark's clients) step in lockstep. Had every
    stream cut its chunks at the same counts, all of them would turn a chunk into rows in the same
    engine step: a burst on the event loop every CHUNK steps, stalling every stream's next token. A
    stream's first chunk is cut `phase` tokens short instead (modulo CHUNK); the recorder numbers its
    streams, so streams started together take different phases and each step does a few of them."""

    CHUNK = 32

    def __init__(self, recorder: Recorder, session_id: str, request_id: str,
                 activation_key: str | None = None, phase: int = 0) -> None:
        self.recorder = recorder
        self.session_id = session_id
        self.request_id = request_id
        self.texts = None if recorder.decodes_in_xdb else TokenTexts(recorder.tokenizer)
        self.activation_key = activation_key
        self._names = recorder.concept_names if activation_key is not None else ()
        self._hidden = recorder.hidden_names if activation_key is not None else ()
        self._ids: list[int] = []
        self._before: list[int] = []  # the reply's last DECODE_CONTEXT ids before the gathered ones
        self._times: list[float] = []  # when each gathered token arrived
        self._position = 0  # the output position of the first gathered token
        self.ticks: tuple[int, int] | None = None  # the first and last tick its rows took so far
        self._due = self.CHUNK - phase % self.CHUNK  # how many gathered tokens make the next chunk

    def add(self, token_ids: Sequence[int]) -> None:
        n = len(token_ids)
        if not n:
            return
        self._ids += token_ids
        if n == 1:  # an engine step's one token, the usual case: no list made for its stamp
            self._times.append(time.time())
        else:
            self._times += [time.time()] * n
        if len(self._ids) >= self._due:
            self._due = self.CHUNK
            self._turn_into_rows()

    def _turn_into_rows(self) -> None:
        token_ids, created_at, self._ids, self._times = self._ids, self._times, [], []
        if not token_ids:
            return
        ticks = self.recorder.xdb.next_ticks(self.session_id, len(token_ids))
        self.ticks = (ticks[0] if self.ticks is None else self.ticks[0], ticks[-1])
        texts, context = self._texts(token_ids)
        # Column-wise: no row object per token on the event loop.
        self.recorder.submit(TokenBatch(self.session_id, ticks, texts, token_ids=token_ids,
                                        request_id=self.request_id, created_at=np.array(created_at),
                                        concept_names=self._names, activation_key=self.activation_key,
                                        first_position=self._position, context_ids=context,
                                        hidden_names=self._hidden))
        self._position += len(token_ids)

    def _texts(self, token_ids: list[int]) -> tuple[list[str] | None, list[int]]:
        """The batch's texts made here (a slow tokenizer), or None and the ids XDB decodes them after."""
        if self.texts is not None:
            return [self.texts.step(t) for t in token_ids], []
        context, self._before = self._before, (self._before + token_ids)[-DECODE_CONTEXT:]
        return None, context

    def finish(self) -> None:
        """The reply is complete, or ended early (client gone): the gathered tokens go out now."""
        self._turn_into_rows()


def new_input_messages(prepared: Prepared) -> list[Message]:
    """The messages this request adds: with a session, all of them but those recorded already; a request
    continuing its conversation, what follows the messages the session has had; a new session's, all it
    brings (a history may start it); otherwise, only what follows the model's last message."""
    if prepared.session is not None:
        return prepared.new_messages[prepared.request.recorded_messages:]
    messages = prepared.new_messages
    if prepared.seen_messages is not None:
        return messages[prepared.seen_messages:]
    if prepared.report.session_naming == "new":
        return messages
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    return messages[last_assistant + 1:]


def input_events(message: Message) -> list[RowEvent]:
    """A message's rows as the client sent it: an assistant message's text (its reasoning in the metadata)
    and each tool call it made as the reply's would be; a tool result with the call it answers."""
    if message.role != "assistant":
        return [(EVENT_OF_ROLE[message.role], message.role, message.content,
                 {"tool_call_id": message.tool_call_id} if message.tool_call_id else None)]
    events: list[RowEvent] = []
    if message.content or message.reasoning:
        events.append(("input", "assistant", message.content,
                       {"reasoning": message.reasoning} if message.reasoning else None))
    events += [("tool_call", "assistant", json.dumps(call, sort_keys=True), {"tool_call_id": call["id"]})
               for call in message.message.get("tool_calls") or ()]
    return events


class RecordingEngine:
    """The engine every request of the API reaches: its outputs are recorded under the request's session,
    and its prompt carries the tenant's prefix-cache salt in place of any the client sent (`salt`: the
    tenant's salt, None with a single tenant), whichever route made it."""

    def __init__(self, engine: EngineClient, recorder: Recorder,
                 salt: Callable[[Tenant], str | None] | None = None, returns: SessionReturns | None = None) -> None:
        """`returns`: each call's session's place in line and return hint, for the engine's scheduler and
        KV tiers (None: the engine gets neither)."""
        self._engine = engine
        self._recorder = recorder
        self._salt = salt
        self._returns = returns
        self._serial = itertools.count(1)
        self._engine_ids: dict[str, list[str]] = {}  # a request's id as vLLM's route knows it -> the engine's

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt: Any, sampling_params: Any, request_id: str, *args: Any,
                 **kwargs: Any) -> AsyncGenerator[Any, None]:
        # Read the request's record now, in the caller's context, not when iteration starts.
        xdb_session = current_session.get()
        if xdb_session is None:  # a route other than AHC's chat: the request is a session of its own
            xdb_session = current_tenant.get().scope(new_session_id())
            self._recorder.xdb.start_session(xdb_session)
        # The engine tags the KV blocks the request stores with its session (session admission reads
        # them back from vLLM's KV events): the server's session, never one a client names in a body.
        kwargs["session_id"] = xdb_session
        trace_headers = engine_trace_headers(kwargs.get("trace_headers"))
        if trace_headers is not None:
            kwargs["trace_headers"] = trace_headers
        salt = self._salt(current_tenant.get()) if self._salt is not None else None
        if salt is not None:
            prompt = with_salt(prompt, salt)
        # The route's request id holds what the client chose (X-Request-Id, a body's request_id): the
        # engine gets one of the server's, so two clients' requests never share the key that joins their
        # tokens to their activations.
        engine_id = f"{request_id}~{next(self._serial):x}"
        if self._returns is not None:
            kwargs.update(self._returns.engine_kwargs(xdb_session, engine_id, kwargs.get("priority") or 0))
        return self._generate(xdb_session, current_usage.get(), request_id,
                              (prompt, sampling_params, engine_id, *args), kwargs)

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        """vLLM's routes abort by their own ids: the engine's ids for them (internal ids are the engine's)."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if internal:
            engine: Any = self._engine  # AsyncLLM's abort takes `internal`; the protocol's does not say so
            await engine.abort(ids, internal=True)
            return
        await self._engine.abort([e for i in ids for e in self._engine_ids.get(i, [i])])

    async def _generate(self, xdb_session: str, usage: EngineUsage | None, request_id: str, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> AsyncGenerator[Any, None]:
        from vllm.sampling_params import RequestOutputKind

        sampling_params, engine_id = args[1], args[2]
        self._engine_ids.setdefault(request_id, []).append(engine_id)
        delta = getattr(sampling_params, "output_kind", None) == RequestOutputKind.DELTA
        n = getattr(sampling_params, "n", 1) or 1
        streams: dict[int, TokenStream] = {}
        seen: dict[int, int] = {}
        finished = False
        if usage is not None:  # the route's id, as the rows show it (not the engine's)
            usage.request_id, usage.model = request_id, self._served_model(kwargs.get("lora_request"))
        try:
            async for output in self._engine.generate(*args, **kwargs):
                if usage is not None:
                    usage.saw(output, delta)
                for completion in output.outputs:
                    stream = streams.get(completion.index)
                    if stream is None:
                        stream = streams[completion.index] = self._recorder.token_stream(
                            xdb_session, request_id, n, completion.index, engine_id)
                    if delta:  # each output holds only its new tokens
                        new = completion.token_ids
                    else:  # only the new ones copied: a copy of all so far, every step, grows with the reply
                        new = list(completion.token_ids[seen.get(completion.index, 0):])
                        seen[completion.index] = seen.get(completion.index, 0) + len(new)
                    stream.add(new)
                    if usage is not None:
                        usage.completion_tokens += len(new)
                if output.finished:
                    finished = True
                    # A completed reply is durable before the client sees it complete (kill -9 safe);
                    # the tokens themselves were never held up by the disk. A route that holds the
                    # end of its reply commits the tokens with its turn's own rows, in one wait (so the
                    # last token is not held up either); for any other, the commit is waited for here.
                    for stream in streams.values():
                        stream.finish()
                    steering = self._recorder.steering
                    if steering is not None:
                        steering.after_reply(self._recorder, xdb_session, request_id,
                                             [s.ticks for s in streams.values() if s.ticks is not None])
                    if usage is None or not usage.route_holds_end:
                        # Committed once the writer has joined the last tokens' activations (a bounded wait).
                        await self._recorder.aflush(session_id=xdb_session)
                yield output
        finally:
            if self._returns is not None:
                self._returns.ended(xdb_session)
            ids = self._engine_ids.get(request_id, [])
            if engine_id in ids:
                ids.remove(engine_id)
            if not ids:
                self._engine_ids.pop(request_id, None)
            if not finished:  # aborted: the tokens gathered so far are written anyway
                for stream in streams.values():
                    stream.finish()

    def _served_model(self, lora_request: Any) -> str:
        """The model's name in the engine's responses, as vLLM's routes name it: the adapter's, or the
        first served name (vLLM's ModelConfig keeps only that one)."""
        if lora_request is not None:
            return str(lora_request.lora_name)
        return str(self._engine.model_config.served_model_name)


def with_salt(prompt: Any, salt: str) -> Any:
    """An engine prompt (text, a prompt dict, an engine request) with `salt` as its prefix-cache salt."""
    if isinstance(prompt, str):
        return {"prompt": prompt, "cache_salt": salt}
    if isinstance(prompt, dict):
        return {**prompt, "cache_salt": salt}
    if hasattr(prompt, "cache_salt"):  # vLLM's EngineCoreRequest, made by the caller
        prompt.cache_salt = salt
        return prompt
    raise TypeError(f"cannot salt an engine prompt of type {type(prompt).__name__}")


def _log_compaction_failure(future: Future[Any]) -> None:
    """A compaction record that cannot be written (nothing recorded before it, or the range already
    released by an earlier one) loses no State: the State is saved apart. It is logged."""
    error = future.exception()
    if error is not None:
        log.warning("the compaction record was not written: %s", error)
