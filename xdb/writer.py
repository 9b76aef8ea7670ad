"""The XDB writer: a bounded in-memory queue drained by background threads into DuckDB.

Generation never waits on disk: `submit` only appends to a deque under a lock (it blocks only when the
queue is full — back-pressure — and raises after a timeout). It takes TimestepRow lists or, for a
reply's tokens, a column-wise TokenBatch. Three stages, each a thread, so Python's work overlaps
DuckDB's inserts (which release the GIL), and the two files' inserts overlap each other:
    prepare stage:    parts → token texts decoded from ids where only ids came (xdb/token_decoder.py)
                      → tokens joined to their activations, if capture is on
                      (xdb/activation_join.py) → one Arrow table, handed to the experience stage at
                      once → audit chain hashed (the next batch is hashed while this one is written)
    audit stage:      the hashed batch → audit file, committed
    experience stage: the same table → `timesteps`, inserted while the audit works, and committed
                      only once the audit has committed that batch (the audit is the write-ahead log)
A batch is cut when it reaches `batch_rows`, when its oldest row has waited `max_latency_s` (1 s),
or when someone calls `flush()` (the server does at the end of every reply) and no batch is still being
committed. Each commit costs ~10 ms of CPU per file whatever its size, so the flushes that arrive while
a batch commits share the next one (group commit): with many streams ending together, one commit a
reply would keep the writer committing tiny batches back to back. A batch
the audit holds but the experience file lost to a crash is replayed from the audit at the next open
(`replay_from_audit`); a batch the audit lost never reaches the experience file, whose transaction is
rolled back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.errors import Unavailable
from xdb import auto_tags
from xdb.activation_join import ActivationJoiner
from xdb.audit.log import AuditLog, PreparedBatch
from xdb.checkpoints import QuietCheckpoints
from xdb.concepts import ConceptIndex
from xdb.rows import HIDDEN_COLUMN, TIMESTEP_COLUMNS, TimestepRow, TokenBatch, check_rows, storable, to_arrow
from xdb.schema import TOP_K
from xdb.sql import string_literal
from xdb.tables import HOT_TIMESTEPS
from xdb.token_decoder import TokenDecoder

log = logging.getLogger(__name__)


class WriterBackpressure(Unavailable, TimeoutError):
    """The queue stayed full for the whole submit timeout: the disk is not keeping up."""


class FlushTimeout(Unavailable, TimeoutError):
    """Rows were still uncommitted when a flush's timeout ran out."""


class WriterStopped(RuntimeError):
    """The writer is closed, or a background stage failed (the message says why)."""


Part = list[TimestepRow] | TokenBatch
PartSpan = tuple[str, int, int]  # rows of one session: its id, the first tick and the last
# What the prepare stage hands each file's stage (None: no more batches), with the batch's spans.
ToAudit = tuple[PreparedBatch, "_Audited", list[PartSpan]]
ToExperience = tuple[pa.Table, list[tuple[int, str]], "_Audited", list[PartSpan]]
Item = TypeVar("Item")


def spans(parts: list[Part]) -> list[PartSpan]:
    """Where the parts' rows sit: a span per part and session."""
    out: list[PartSpan] = []
    for part in parts:
        if isinstance(part, TokenBatch):
            if len(part):
                ticks = np.asarray(part.ticks)
                out.append((part.session_id, int(ticks.min()), int(ticks.max())))
            continue
        by_session: dict[str, list[int]] = {}
        for row in part:
            by_session.setdefault(row.session_id, []).append(row.tick)
        out += [(session, min(t), max(t)) for session, t in by_session.items()]
    return out


def insert_batch(conn: duckdb.DuckDBPyConnection, table: pa.Table, new_concepts: list[tuple[int, str]],
                 thresholds: np.ndarray | None = None) -> int:
    """Open a transaction on the experience file and insert one batch into it — rows, new concept
    names, per-session last ticks and the last timestep id, and the tags of concepts over their
    thresholds (`thresholds[concept id]`; None: no concept has one; no activation reaching one runs
    no tag statement) — without committing: the caller commits (or rolls back) once the audit has the
    batch. Rolls back itself if an insert fails. Returns how many tokens were auto-tagged."""
    auto_tags.beginning(conn)
    conn.execute("BEGIN")
    try:
        if new_concepts:
            ids, names = zip(*new_concepts)
            append(conn, "concepts", pa.table({"id": pa.array(ids, pa.int32()), "name": pa.array(names, pa.string())}))
            auto_tags.forget(conn)  # a new concept may be one the hierarchy has a threshold for
        append(conn, HOT_TIMESTEPS, table.select(list(TIMESTEP_COLUMNS)))
        store_last_ticks(conn, table)
        set_last_timestep_id(conn, int(pc.max(table.column("id")).as_py()))
        fired = None if thresholds is None else auto_tags.over_threshold(table, thresholds)
        return 0 if fired is None else auto_tags.insert(conn, fired)
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def append(conn: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    """Insert an Arrow table whose columns are the DuckDB table's, in its order, within the open
    transaction: a relation over it, not a registered view (~0.35 ms of CPU less a batch: registering
    and dropping a view are catalog changes)."""
    conn.from_arrow(table).insert_into(name)


def store_last_ticks(conn: duckdb.DuckDBPyConnection, table: pa.Table) -> None:
    """Move each session's last tick in `session_ticks` on to the batch's. Literals, not scans of the
    batch: each statement over the registered table costs a millisecond of CPU, a fifth of a small
    batch's insert. An UPDATE first, at three quarters of an upsert's CPU; the upsert only when a
    session has no row yet (its first batch, or a batch after its deletion)."""
    last = last_ticks(table)
    values = ", ".join(f"({string_literal(session)}, {tick})" for session, tick in last)
    updated = conn.execute(f"UPDATE session_ticks SET last_tick = greatest(session_ticks.last_tick, v.t) "
                           f"FROM (VALUES {values}) v(s, t) WHERE session_id = v.s").fetchone()
    if updated is None or updated[0] < len(last):
        conn.execute(f"INSERT INTO session_ticks VALUES {values} ON CONFLICT (session_id) DO UPDATE "
                     "SET last_tick = greatest(session_ticks.last_tick, excluded.last_tick)")


def last_ticks(table: pa.Table) -> list[tuple[str, int]]:
    """Each session's last tick in the batch, sessions in order of first appearance. In numpy: an
    Arrow group-by costs ~0.7 ms a call whatever its size."""
    encoded = pc.dictionary_encode(table.column("session_id").combine_chunks())
    last = np.full(len(encoded.dictionary), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(last, encoded.indices.to_numpy(zero_copy_only=False), table.column("tick").to_numpy())
    return list(zip(encoded.dictionary.to_pylist(), last.tolist()))


def set_last_timestep_id(conn: duckdb.DuckDBPyConnection, last_id: int) -> None:
    """An UPDATE of the one row, at half the CPU of an upsert; the row is made by the file's first batch."""
    changed = conn.execute(f"UPDATE xdb_meta SET value = '{last_id}' WHERE key = 'last_timestep_id'").fetchone()
    if changed is None or changed[0] == 0:
        conn.execute(f"INSERT INTO xdb_meta VALUES ('last_timestep_id', '{last_id}')")


def store_batch(conn: duckdb.DuckDBPyConnection, table: pa.Table, new_concepts: list[tuple[int, str]]) -> None:
    """Commit one batch to the experience file in one transaction."""
    insert_batch(conn, table, new_concepts)
    try:
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class _Audited:
    """Set by the audit stage once a batch is committed to the audit (ok) or has failed there."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.ok = False

    def set(self, ok: bool) -> None:
        self.ok = ok
        self._event.set()

    def wait(self, failed: Callable[[], bool]) -> bool:
        """True once the audit committed the batch; False if it failed, or `failed()` says a stage
        died (so nothing would ever set it)."""
        while not self._event.wait(0.1):
            if failed():
                return self._event.is_set() and self.ok
        return self.ok


def _split(part: Part, n: int) -> tuple[Part, Part]:
    if isinstance(part, TokenBatch):
        return part.slice(0, n), part.slice(n, len(part))
    return part[:n], part[n:]


def accepted(rows: Part, k: int, decodes: bool = False) -> Part:
    """Rows as a writer takes them: validated at submit time, so a bad batch fails its caller and not
    the writer, and a TokenBatch stamped with its arrival time as a TimestepRow is when made.
    `decodes`: the writer was given a tokenizer, which a TokenBatch of token ids without texts needs."""
    if isinstance(rows, TokenBatch):
        rows.check(k)
        if rows.contents is None and not decodes:
            raise ValueError("a TokenBatch without contents needs a writer that decodes (XDB.decode_tokens_with)")
        storable(rows)
        return rows if rows.created_at is not None else dataclasses.replace(rows, created_at=time.time())
    rows = list(rows)
    check_rows(rows, k)
    storable(rows)
    return rows


def wait_committed(cond: threading.Condition, target: int, written: Callable[[], int],
                   check_alive: Callable[[], None], timeout: float | None) -> None:
    """With `cond` held, wait until `written()` rows reach `target`; FlushTimeout once `timeout` is out.
    `check_alive` raises when nothing will ever be committed again."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while written() < target:
        check_alive()
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise FlushTimeout(f"XDB flush: {target - written()} rows still uncommitted")
        cond.wait(remaining)


def last_timestep_id(conn: duckdb.DuckDBPyConnection) -> int:
    row = conn.execute("SELECT value FROM xdb_meta WHERE key = 'last_timestep_id'").fetchone()
    return -1 if row is None else int(row[0])


def replay_from_audit(conn: duckdb.DuckDBPyConnection, audit: AuditLog) -> int:
    """Copy rows the audit committed but the experience file did not (a crash between the two
    commits) into the experience file; returns how many. The audit's tail, from the first row to
    copy or its last checkpoint, and its anchor are verified first: a broken log raises ValueError
    naming the first bad record (or the head mismatch), and nothing is copied from it."""
    last = last_timestep_id(conn)
    audit.verify_for_open(audit.first_seq_after(last))
    table = audit.rows_after(last)
    if table.num_rows:
        known = {cid for (cid,) in conn.execute("SELECT id FROM concepts").fetchall()}
        missing = [(cid, name) for cid, name in audit.concepts() if cid not in known]
        store_batch(conn, table, missing)
    audit.experience_holds(last_timestep_id(conn))  # what the log kept for a replay may go
    return int(table.num_rows)


class Writer:
    def __init__(self, conn: duckdb.DuckDBPyConnection, audit: AuditLog, concepts: ConceptIndex, *,
                 next_id: int, batch_rows: int = 50_000, max_latency_s: float = 1.0,
                 max_queue_rows: int = 1_000_000, submit_timeout_s: float = 30.0,
                 on_commit: Callable[[int], None] | None = None, k: int = TOP_K) -> None:
        self._conn, self._audit, self._concepts, self._k = conn, audit, concepts, k
        self._next_id = next_id
        self.batch_rows, self.max_latency_s = batch_rows, max_latency_s
        self.max_queue_rows, self.submit_timeout_s = max_queue_rows, submit_timeout_s
        self.on_commit = on_commit
        # Concept thresholds by name while a lens pack with thresholds is registered (None: no auto
        # tags), and by concept id for the writer's thread; `on_auto_tags` hears of batches that fired.
        self._auto_tag_thresholds: dict[str, float] | None = None
        self._threshold_by_id: np.ndarray | None = None
        self._thresholds_lock = threading.Lock()
        self.on_auto_tags: Callable[[], None] | None = None
        self._joiner: ActivationJoiner | None = None  # the engine's activations, once capture is on
        self._decoder: TokenDecoder | None = None  # the texts of token batches that bring ids alone
        # The rows of the batch a stage failed on, and who hears of the failure (the XDB service, which
        # exits so that its next run can tell the part that killed it from the rest).
        self.failed_spans: list[PartSpan] | None = None
        self.on_failure: Callable[[], None] | None = None
        self._cond = threading.Condition()
        self._pending: deque[Part] = deque()
        self._queued = 0          # rows in _pending
        self._oldest_at = 0.0     # monotonic time the oldest pending row arrived
        self._submitted = 0       # rows accepted since open
        self._taken = 0           # rows the prepare stage has taken off the queue
        self._flush_target = 0    # rows that a waiting flush() needs taken once nothing is in flight
        self.rows_written = 0     # rows committed to the experience file since open
        self._closing = False
        self._error: BaseException | None = None
        # Bounded hand-offs, so a slow file slows the stages before it too (back-pressure).
        self._to_audit: queue.Queue[ToAudit | None] = queue.Queue(maxsize=2)
        self._to_experience: queue.Queue[ToExperience | None] = queue.Queue(maxsize=2)
        self._experience_checkpoints = QuietCheckpoints(conn)
        self._audit_checkpoints = audit.quiet_checkpoints()
        stages = {"xdb-prepare": self._prepare_stage, "xdb-audit": self._audit_stage,
                  "xdb-writer": self._experience_stage}
        self._threads = [threading.Thread(target=self._run, args=(stage,), name=name, daemon=True)
                         for name, stage in stages.items()]
        for t in self._threads:
            t.start()

    # -- the caller's side -------------------------------------------------------------------
    def submit(self, rows: Part, timeout: float | None = None) -> None:
        """Queue rows (a TimestepRow list or a TokenBatch); returns at once unless the queue is full,
        then waits (back-pressure) up to `timeout` (default `submit_timeout_s`) and raises
        WriterBackpressure. The writer keeps a TokenBatch's arrays: do not change them afterwards."""
        timeout = self.submit_timeout_s if timeout is None else timeout
        if not self._offer(rows, block=True, timeout=timeout):
            raise WriterBackpressure(f"XDB writer queue full ({self._queued} rows) for {timeout} s")

    def try_submit(self, rows: Part) -> bool:
        """Queue rows only if there is room now; False when the queue is full."""
        return self._offer(rows, block=False, timeout=0.0)

    async def asubmit(self, rows: Part, timeout: float | None = None) -> None:
        """`submit` for the event loop: never blocks it; a full queue is waited out in a thread."""
        if not self.try_submit(rows):
            await asyncio.to_thread(self.submit, rows, timeout)

    def _offer(self, rows: Part, *, block: bool, timeout: float) -> bool:
        rows = accepted(rows, self._k, self._decoder is not None)
        n = len(rows)
        if not n:
            return True
        if isinstance(rows, TokenBatch) and rows.activation_key is not None and rows.join_by is None:
            joiner = self._joiner
            rows.join_by = time.monotonic() + (joiner.wait_s if joiner is not None else 0.0)
        deadline = time.monotonic() + timeout
        with self._cond:
            self._check_alive()
            # An oversized submit is still accepted into an empty queue, so it can never wait forever.
            while self._queued and self._queued + n > self.max_queue_rows:
                remaining = deadline - time.monotonic()
                if not block or remaining <= 0:
                    return False
                self._cond.wait(remaining)
                self._check_alive()
            was_empty = not self._pending
            if was_empty:
                self._oldest_at = time.monotonic()
            self._pending.append(rows)
            self._queued += n
            self._submitted += n
            # The first row after idle starts the latency clock: the writer sleeps without a timeout.
            if was_empty or self._queued >= self.batch_rows:
                self._cond.notify_all()
        return True

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every row submitted before this call is committed (audit and experience)."""
        with self._cond:
            target = self._submitted
            self._flush_target = max(self._flush_target, target)
            self._cond.notify_all()
            wait_committed(self._cond, target, lambda: self.rows_written, self._check_alive, timeout)

    def request_flush(self) -> None:
        """Commit everything queued now rather than at the latency deadline, without waiting for it."""
        with self._cond:
            self._flush_target = max(self._flush_target, self._submitted)
            self._cond.notify_all()

    def activations_receiving(self) -> bool | None:
        """Whether the side channel's receiver runs (None: no capture)."""
        return None if self._joiner is None else self._joiner.receiver.alive

    def capture_activations(self, address: str, k: int, wait_s: float) -> None:
        """Receive the engine's activations on the side channel at `address` (bound before this
        returns) and join them to the token batches that name their request; a batch waits up to
        `wait_s` for activations not yet come."""
        if self._joiner is not None:
            self._joiner.close()
        self._joiner = ActivationJoiner(address, min(k, self._k), wait_s)

    def decode_tokens_with(self, tokenizer: str) -> None:
        """Decode the texts of the token batches that come with ids alone, with this tokenizer (a fast
        tokenizer's serialized form, `backend_tokenizer.to_str()`), in the prepare stage."""
        self._decoder = TokenDecoder.from_str(tokenizer)

    def set_auto_tag_thresholds(self, thresholds: dict[str, float] | None) -> None:
        """The concepts' thresholds (by name) from the batch committed next on; None or empty: none."""
        with self._thresholds_lock:
            self._auto_tag_thresholds = dict(thresholds) if thresholds else None
            self._threshold_by_id = None
        self.invalidate_auto_tags()

    def invalidate_auto_tags(self) -> None:
        """Concepts, their hierarchy or tags changed: the next batch's auto tags see the change."""
        auto_tags.forget(self._conn)

    @property
    def auto_tag_floor(self) -> float | None:
        """The lowest threshold (None: no auto tags)."""
        return min(self._auto_tag_thresholds.values()) if self._auto_tag_thresholds else None

    def _thresholds_for(self, added: list[tuple[int, str]]) -> np.ndarray | None:
        """By concept id, for a batch that registered `added` (new ids need their thresholds too)."""
        with self._thresholds_lock:
            by_name = self._auto_tag_thresholds
            if by_name is None:
                return None
            if self._threshold_by_id is None or added:
                self._threshold_by_id = self._concepts.by_id(by_name)
            return self._threshold_by_id

    def recording_state(self) -> tuple[str, str | None]:
        """("recording", None) or ("stopped", why)."""
        return ("recording", None) if self._error is None else ("stopped", repr(self._error))

    @property
    def error(self) -> BaseException | None:
        """What stopped the writer (None while it runs)."""
        return self._error

    @property
    def alive(self) -> bool:
        """False once closed or once a stage has failed: nothing more can be committed."""
        return self._error is None and not self._closing

    def queue_depth(self) -> int:
        """Rows accepted but not yet committed to the experience file."""
        return self._submitted - self.rows_written

    def close(self) -> None:
        """Commit everything queued, then stop the stages."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        if self._joiner is not None:
            self._joiner.close()
        if self._error is not None:
            raise WriterStopped(f"XDB writer failed: {self._error!r}") from self._error

    def _check_alive(self) -> None:
        if self._error is not None:
            raise WriterStopped(f"XDB writer failed: {self._error!r}") from self._error
        if self._closing:
            raise WriterStopped("XDB writer is closed")

    # -- the stages --------------------------------------------------------------------------
    def _run(self, stage: Callable[[], None]) -> None:
        try:
            stage()
        except BaseException as exc:  # a dead writer must be loud, not silent
            log.exception("XDB writer stage failed")
            with self._cond:
                first = self._error is None
                if first:  # the first failure is the cause; the other stages follow it
                    self._error = exc
                self._cond.notify_all()
            if first and self.on_failure is not None:
                self.on_failure()

    def _failed_on(self, batch: list[PartSpan]) -> None:
        with self._cond:
            if self.failed_spans is None:
                self.failed_spans = batch

    def _take_batch(self) -> list[Part] | None:
        """Block until a batch is due; None when closing with nothing left."""
        with self._cond:
            while True:
                if self._error is not None:
                    return None
                if self._pending:
                    due = (self._queued >= self.batch_rows or self._closing
                           or (self._taken < self._flush_target and self.rows_written == self._taken)
                           or time.monotonic() - self._oldest_at >= self.max_latency_s)
                    if due:
                        break
                    self._cond.wait(self.max_latency_s - (time.monotonic() - self._oldest_at))
                elif self._closing:
                    return None
                else:
                    self._cond.wait()
            batch: list[Part] = []
            size = 0
            while self._pending and size < self.batch_rows:
                head = self._pending.popleft()
                need = self.batch_rows - size
                if len(head) > need:
                    head, rest = _split(head, need)
                    self._pending.appendleft(rest)
                batch.append(head)
                size += len(head)
            self._queued -= size
            self._taken += size
            self._oldest_at = time.monotonic()  # the rest waited too, but never blocks a flush
            self._cond.notify_all()  # room for blocked submitters
            return batch

    def _prepare_stage(self) -> None:
        try:
            while (parts := self._take_batch()) is not None:
                batch = spans(parts)
                try:
                    if not self._prepare(parts, batch):
                        return
                except BaseException:
                    self._failed_on(batch)
                    raise
        finally:
            self._hand_over(self._to_audit, None)
            self._hand_over(self._to_experience, None)

    def _prepare(self, parts: list[Part], batch: list[PartSpan]) -> bool:
        """Decode, join, convert and hand on one batch; False once a stage has failed."""
        if self._decoder is not None:
            self._decoder.fill(parts)
        if self._joiner is not None:
            parts = self._joiner.join(parts)
        table, added = to_arrow(parts, self._next_id, self._concepts, self._k)
        self._next_id += table.num_rows
        audited = _Audited()
        # Handed on before hashing: the experience insert runs while the audit works.
        # The experience file never sees hidden activations (lens.hidden): the audit log's alone.
        experience = table.drop_columns([c for c in ("steering", HIDDEN_COLUMN) if c in table.column_names])
        if not self._hand_over(self._to_experience, (experience, added, audited, batch)):
            return False
        try:
            prepared = self._audit.prepare(table, added)
        except BaseException:
            audited.set(False)
            raise
        if not self._hand_over(self._to_audit, (prepared, audited, batch)):
            audited.set(False)
            return False
        return True

    def _audit_stage(self) -> None:
        while (item := self._to_audit.get()) is not None:
            prepared, audited, batch = item
            try:
                self._audit.commit(prepared)
            except BaseException:
                audited.set(False)
                self._failed_on(batch)
                raise
            audited.set(True)
            if self._quiet(self._to_audit):
                self._audit_checkpoints.run_if_due()

    def _quiet(self, hand_off: queue.Queue[Item | None]) -> bool:
        """No batch waits for this stage and no flush for rows not yet in a batch: a checkpoint now
        delays nobody (a flush of the batch just committed is released by the other stage)."""
        return hand_off.empty() and self._flush_target <= self._taken

    def _hand_over(self, to: queue.Queue[Item | None], item: Item | None) -> bool:
        """Put on a hand-off queue, waiting while it is full; False (item dropped) once a stage has
        failed, since then nobody may be taking."""
        while True:
            try:
                to.put(item, timeout=0.1)
                return True
            except queue.Full:
                if self._error is not None or not all(t.is_alive() for t in self._threads):
                    return False

    def _experience_stage(self) -> None:
        while (item := self._to_experience.get()) is not None:
            table, added, audited, batch = item
            try:
                fired = insert_batch(self._conn, table, added, self._thresholds_for(added))
            except BaseException:
                self._failed_on(batch)
                raise
            if not audited.wait(lambda: self._error is not None):
                # The audit never got this batch (its stage says why): it must not exist here either.
                self._conn.execute("ROLLBACK")
                return
            try:
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                self._failed_on(batch)
                raise
            if table.num_rows:
                self._audit.experience_holds(int(table.column("id")[-1].as_py()))
            if fired and self.on_auto_tags is not None:  # before a flush returns: its reads see the tags
                self.on_auto_tags()
            with self._cond:
                self.rows_written += table.num_rows
                self._cond.notify_all()
            if self.on_commit is not None:
                try:
                    self.on_commit(table.num_rows)
                except Exception:  # a metrics hook must not stop recording
                    log.exception("XDB on_commit callback failed")
            if self._quiet(self._to_experience):
                self._experience_checkpoints.run_if_due()
