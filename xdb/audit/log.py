"""The audit log: a separate, append-only DuckDB file whose records form a SHA-256 hash chain
(xdb/audit/chain.py), written by the XDB writer a batch at a time. Nothing in the HTTP API reads this file.

Every commit writes the batch's records, the concepts it first names (`audit_concepts`) and a
checkpoint in one transaction, so a range of records verifies from the nearest checkpoint without
reading the rest (xdb/audit/verify.py), and a truncated tail is caught. It then anchors the new head
outside the file: one line `SEQ HASH` appended, flushed and fsynced to `audit.head` beside it, and
logged at INFO on `ahc.xdb.audit` (where a log shipper or the `ahc_audit_head_seq` gauge carries it
off the machine). A log written before anchoring existed (schema version 1) is anchored once, after
its chain verifies, when it is next opened for writing.

Deletions and rewrites in the experience file (compression, run purges, pruned session states, tag
and time-window changes), and what is added beside the recorded rows (a tag applied, a comment, a pinned
window, the agent's logged interactions and knowledge: their texts by SHA-256 alone), are chained too, as
system event records: event_type `xdb_event`, timestep_id and tick -1, the JSON description in `content`
(see `AuditLog.append_event`).

A session's records hold its content only sealed under the session's key (xdb/audit/seal.py,
xdb/audit/keys.py). Deleting the session first retires its keys under the lock that moves the chain's
tip (`retire_keys`), so every batch hashed after that point seals the session's new rows under a new
key; the deletion then chains a `delete_session` event naming the retired keys and the last timestep
sealed under them, the experience file drops those rows, and only then are the keys destroyed
(`destroy_keys`): the content is gone from the log's files, the records and their hashes stay, and
verification tells such an erasure (a key destroyed by a chained deletion after its last record) from
tampering (a key missing with no such deletion). A deletion a crash cut short after its event was
chained is finished at the next start (`pending_deletions`).

The log is bounded by retention (`retire`, run by XDB's storage pass; xdb/audit/retirement.py), and its
records are read back with their sealed content opened (`records`; xdb/audit/records.py).

The head file's last line is written and fsynced after the commit: a crash between the two can leave
it torn. Opening the log for writing cuts a torn last line off (the commit it named is anchored again
from the log), logs the repair and chains it as an `audit_head_repaired` event.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from xdb.audit.activations import (
    REPLAY_TABLE,
    activation_leaves,
    activation_root,
    replay_rows,
    short,
    without_activations,
)
from xdb.audit.chain import (
    EVENT_TYPE,
    GENESIS,
    HEAD_FILE,
    checkpoint_hash,
    concept_hash,
    stamp,
    stored_records,
)
from xdb.audit.checkpoints import RowGroupCheckpoints
from xdb.audit.hidden import HIDDEN_TABLE, erase_hidden, split_hidden
from xdb.audit.keys import KEYS_FILE, SessionKeys, cut_torn_tails
from xdb.audit.records import SealedReads
from xdb.audit.replay import ReplayMethods
from xdb.audit.retirement import RetirementMethods
from xdb.audit.seal import seal, seal_batch
from xdb.audit.verify import (
    AuditReport,
    Deletion,
    chained_deletions,
    check_anchor,
    check_erasures,
    check_expected_head,
    heads_as_of_now,
    retirements,
    verify_connection,
    verify_tail,
)
from xdb.checkpoints import QuietCheckpoints
from xdb.concepts import ConceptIndex
from xdb.private import fsync_path, private_dir, private_files
from xdb.rows import TimestepRow, rows_to_arrow
from xdb.schema import TOP_K, connect_checked, migrate, stored_version
from xdb.sql import one, string_literal

log = logging.getLogger("ahc.xdb.audit")

APP = "ahc-xdb-audit"
# How long a commit waits for the batch before it (prepared on another thread) to be committed.
COMMIT_TURN_TIMEOUT_S = 60.0
# What XDB hands the modules that delete or rewrite rows: (action, details) → one chained record.
AuditEvent = Callable[[str, dict[str, Any]], None]
AUDIT_MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        "CREATE TABLE audit_meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
        "CREATE TABLE audit_concepts (id INTEGER NOT NULL, name VARCHAR NOT NULL, "
        "prev_hash BLOB NOT NULL, hash BLOB NOT NULL)",
        f"""CREATE TABLE audit_records (
            seq BIGINT NOT NULL, timestep_id BIGINT NOT NULL, session_id VARCHAR NOT NULL,
            tick BIGINT NOT NULL, event_type VARCHAR NOT NULL, role VARCHAR, content VARCHAR,
            token_id INTEGER, request_id VARCHAR, concept_ids INTEGER[{TOP_K}],
            concept_values FLOAT[{TOP_K}], activation_source VARCHAR, created_at TIMESTAMP NOT NULL,
            metadata VARCHAR, steering VARCHAR, prev_hash BLOB NOT NULL, record_hash BLOB NOT NULL)""",
        """CREATE TABLE audit_checkpoints (
            seq_start BIGINT NOT NULL, seq_end BIGINT NOT NULL, chain_head BLOB NOT NULL,
            concept_count INTEGER NOT NULL, concepts_head BLOB NOT NULL, created_at TIMESTAMP NOT NULL,
            prev_hash BLOB NOT NULL, checkpoint_hash BLOB NOT NULL)""",
    ]),
    # Version 2 marks a log whose head is anchored in audit.head; the schema is unchanged.
    (2, ["INSERT INTO audit_meta VALUES ('head_file', 'audit.head')"]),
    # Version 3 seals each session's records under the session's key (audit.keys); older records stay
    # in clear, and hash as they did.
    (3, ["ALTER TABLE audit_records ADD COLUMN IF NOT EXISTS key_id INTEGER",
         "ALTER TABLE audit_records ADD COLUMN IF NOT EXISTS sealed BLOB",
         "INSERT OR REPLACE INTO audit_meta VALUES ('keys_file', 'audit.keys')"]),
    # Version 4 stops storing each record's prev_hash: it is the record before's record_hash, and cost
    # 32 bytes and a fifth of the insert a record. Records stored with one are still checked against it.
    (4, ["ALTER TABLE audit_records ALTER COLUMN prev_hash DROP NOT NULL"]),
    # Version 5 seals a batch's records of one session as one compressed blob (xdb/audit/seal.py's
    # `seal_batch`), from the seq marked here on (the log's next one); records before it stay as they were.
    (5, ["INSERT OR REPLACE INTO audit_meta SELECT 'batch_sealed_from', CAST(coalesce(max(seq) + 1, 0) AS VARCHAR) "
         "FROM audit_records"]),
    # Version 6 chains a batch at a time (xdb/audit/chain.py): a record stores a 4-byte leaf, only a
    # batch's last one its head; records stored before (leaf null) keep their own hashes and verify so.
    (6, ["ALTER TABLE audit_records ADD COLUMN IF NOT EXISTS leaf INTEGER",
         "ALTER TABLE audit_records ALTER COLUMN record_hash DROP NOT NULL"]),
    # Version 7 stores a record's activations only as hashes (xdb/audit/activations.py): its act leaf's first
    # 4 bytes, and the batch's root in its last record; they wait in audit_replay until the experience file
    # holds them. Records stored before keep theirs, and verify so.
    (7, ["ALTER TABLE audit_records ADD COLUMN IF NOT EXISTS activation_leaf INTEGER",
         "ALTER TABLE audit_records ADD COLUMN IF NOT EXISTS activation_root BLOB",
         f"CREATE TABLE IF NOT EXISTS {REPLAY_TABLE} (timestep_id BIGINT NOT NULL, concept_ids INTEGER[{TOP_K}], "
         f"concept_values FLOAT[{TOP_K}])"]),
    # Version 8 keeps hidden concepts' activations in the log alone (xdb/audit/hidden.py): the values in
    # audit_hidden, each record's salted digest of them in hidden_digest, bound by its canonical bytes.
    (8, ["ALTER TABLE audit_records ADD COLUMN IF NOT EXISTS hidden_digest BLOB",
         f"CREATE TABLE IF NOT EXISTS {HIDDEN_TABLE} (seq BIGINT NOT NULL, salt BLOB NOT NULL, "
         "activations VARCHAR NOT NULL)"]),
]


@dataclass(frozen=True)
class Retirement:
    """A session's keys retired at one point of the chain: `keys` (every key of the session), and
    `before_seq`, the first seq hashed after it; no record from there on is sealed under them."""

    session_id: str
    keys: list[int]
    before_seq: int


@dataclass
class PreparedBatch:
    """A batch hashed onto the chain, ready for `AuditLog.commit`."""

    records: pa.Table
    concept_rows: list[tuple[int, str, bytes, bytes]]
    seq_start: int
    seq_end: int
    head: bytes
    prev_checkpoint: bytes
    checkpoint: bytes
    concept_count: int
    concepts_head: bytes
    replay: pa.Table | None = None  # the batch's activations (audit_replay's rows); None before version 7
    hidden: pa.Table | None = None  # its hidden activations (audit_hidden's rows); None: no record has any


def copy_database(conn: duckdb.DuckDBPyConnection, dest: Path) -> None:
    """Copy the database `conn` is on into a new file, from one snapshot (one statement, one
    transaction), while other connections keep committing."""
    cur = conn.cursor()
    try:
        source = cur.execute("SELECT current_database()").fetchone()
        assert source is not None
        cur.execute(f"ATTACH {string_literal(str(dest))} AS ahc_backup")
        try:
            cur.execute(f'COPY FROM DATABASE "{source[0]}" TO ahc_backup')
        finally:
            cur.execute("DETACH ahc_backup")
    finally:
        cur.close()


class AuditLog(ReplayMethods, SealedReads, RetirementMethods):
    """Owned by the XDB writer: `prepare` (hashing, Python) and `commit` (DuckDB) may run on two
    threads, batches in the same order; `verify` runs on any thread. `prepare` moves the chain's
    tip on at once, so the next batch can be hashed while this one is written; `committed_seq` is
    where the file itself is."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path, keys: SessionKeys) -> None:
        self.conn = conn
        self.path = path
        self.keys = keys
        self.head_path = path.parent / HEAD_FILE
        self._head_fd: int | None = None
        self.full_verification: AuditReport | None = None  # the background re-hash's verdict, once done
        self.repairs: list[dict[str, Any]] = []  # torn tails cut at open, chained by `verify_for_open`
        self._closing = False
        # prepare may run on the writer's thread and, for system events, on any other: the tip
        # moves under this lock. Commits take turns in seq order under `_turn`, and `_commit_lock`
        # keeps a verification from seeing a commit half done (file written, head not yet).
        self._tip_lock = threading.Lock()
        self._turn = threading.Condition()
        self._commit_lock = threading.Lock()
        self._failed: BaseException | None = None
        head = conn.execute("SELECT seq_end, chain_head, checkpoint_hash, concept_count, concepts_head "
                            "FROM audit_checkpoints ORDER BY seq_end DESC LIMIT 1").fetchone()
        if head is None:
            self.next_seq, self.head, self.checkpoint_head = 0, GENESIS, GENESIS
            self.concept_count, self.concepts_head = 0, GENESIS
        else:
            self.next_seq = head[0] + 1
            self.head, self.checkpoint_head = bytes(head[1]), bytes(head[2])
            self.concept_count, self.concepts_head = head[3], bytes(head[4])
        self.committed_seq = self.next_seq
        self.largest_commit = 0  # the most records one commit has brought (RowGroupCheckpoints)
        self.committed_head = (self.next_seq - 1, self.head)
        # Where batch sealing starts (None: a log not migrated to version 5, opened read-only).
        marked = conn.execute("SELECT value FROM audit_meta WHERE key = 'batch_sealed_from'").fetchone()
        self.batch_sealed_from: int | None = None if marked is None else int(marked[0])
        # Activations hashed apart and kept until the experience file holds them (version 7 on; not in a
        # log opened read-only before its migration).
        self.activations_apart = one(conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND table_name = ?",
            [REPLAY_TABLE]))[0] > 0
        self._held_through = -1  # the last timestep id the experience file has committed (`experience_holds`)
        self._audited_through = -1  # the last timestep id this log has committed
        self._pruned_through = -1

    @classmethod
    def open(cls, path: Path, *, read_only: bool = False) -> AuditLog:
        if not read_only:
            private_dir(path.parent)
        conn = connect_checked(path, read_only=read_only)
        if not read_only:
            private_files(path, path.with_name(path.name + ".wal"))
        try:
            keys = SessionKeys(path.parent / KEYS_FILE, read_only=read_only)
            if read_only:
                if stored_version(conn, path, "audit_meta", APP) is None:
                    raise ValueError(f"{path} holds no audit log")
                return cls(conn, path, keys)
            before = stored_version(conn, path, "audit_meta", APP)
            head_path = path.parent / HEAD_FILE
            repairs = cut_torn_tails(head_path, keys)
            adopt = before is not None and before < 2 and not head_path.exists()
            if adopt:
                # A log from before anchoring: anchor what it holds now, but only a chain that
                # verifies, so a damaged log is never blessed.
                report = verify_connection(conn)
                if not report.ok:
                    raise ValueError(f"audit log {path} is broken: {report.first_bad}; nothing was modified")
            migrate(conn, path, AUDIT_MIGRATIONS, "audit_meta", APP)
            # Only the writer's audit stage writes here, one batch at a time, alongside the
            # experience file's insert on another thread: DuckDB's own threads on top of that
            # cost twice the CPU of one (measured: 8 → 4 µs a row) and buy nothing.
            conn.execute("SET threads = 1")
            conn.execute("SET max_vacuum_tasks = 0")  # no merges: checkpoints fill row groups (audit_checkpoints.py)
            audit = cls(conn, path, keys)
            audit.repairs = repairs
            if adopt and audit.committed_seq > 0:
                log.warning("audit log %s predates audit.head: anchoring its current head seq=%d", path,
                            audit.committed_seq - 1)
                audit._anchor(audit.committed_seq - 1, audit.head)
            elif audit.committed_seq == 0 and not head_path.exists():
                audit._anchor_file()  # a new log starts with its (empty) head file
            return audit
        except BaseException:
            conn.close()
            raise

    def quiet_checkpoints(self) -> QuietCheckpoints:
        """The writer's checkpoints of this file, taken between commits, a row group at a time."""
        return RowGroupCheckpoints(self.conn, self._commit_lock, lambda: (self.committed_seq, self.largest_commit),
                                   self._empty_replay)

    def close(self) -> None:
        self._closing = True
        if self._held_through > self._pruned_through:
            with self._commit_lock:
                self._prune_replay(self.conn)
        if self._head_fd is not None:
            os.close(self._head_fd)
            self._head_fd = None
        self.keys.close()
        self.conn.close()

    def copy_to(self, dest_dir: Path) -> int:
        """A consistent copy of the log and its head file into `dest_dir` while commits go on: between
        two commits, so the copied head file names the copied log's last record. Returns that seq."""
        with self._commit_lock:
            copy_database(self.conn, dest_dir / self.path.name)
            if self.head_path.exists():
                shutil.copy2(self.head_path, dest_dir / HEAD_FILE)
            if self.keys.exists:
                self.keys.copy_to(dest_dir / KEYS_FILE)
            return self.committed_seq - 1

    # -- the anchor ------------------------------------------------------------------------------
    def _anchor_file(self) -> int:
        if self._head_fd is None:
            created = not self.head_path.exists()
            self._head_fd = os.open(self.head_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            private_files(self.head_path)  # made before files were private
            if created:  # the new name must survive a crash too, not only the bytes
                fsync_path(self.head_path.parent)
        return self._head_fd

    def _anchor(self, seq: int, head: bytes) -> None:
        """Append `SEQ HASH` to the head file and fsync it: one write, so a line is never split
        between two commits."""
        fd = self._anchor_file()
        os.write(fd, f"{seq} {head.hex()}\n".encode())
        os.fsync(fd)
        log.info("audit head seq=%d hash=%s", seq, head.hex())

    def audit_head(self) -> tuple[int, str]:
        """The last committed (and anchored) head: (seq, hex hash); (-1, zeros) for an empty log."""
        seq, head = self.committed_head
        return seq, head.hex()

    def append(self, batch: pa.Table, new_concepts: list[tuple[int, str]]) -> None:
        """Append one batch (the writer's Arrow table) and its new concepts in one transaction."""
        self.commit(self.prepare(batch, new_concepts))

    def append_event(self, action: str, details: dict[str, Any]) -> int:
        """Chain one system event (a deletion or rewrite elsewhere in XDB) and commit it; returns its
        seq. Callers append before committing their own change, as the writer does its batches,
        so a change the audit does not hold never happens. A `delete_session` event names the keys
        its deletion destroys (`keys_destroyed`, from `retire_keys`); they are destroyed by
        `destroy_keys` once the deletion is committed."""
        session_id = str(details.get("session_id") or "")
        content = json.dumps({"action": action, **details}, sort_keys=True, separators=(",", ":"), default=str)
        row = TimestepRow(session_id, -1, EVENT_TYPE, "system", content)
        table, _ = rows_to_arrow([row], -1, ConceptIndex([]))
        prepared = self.prepare(table, [])
        self.commit(prepared)
        return prepared.seq_start

    def retire_keys(self, session_id: str) -> Retirement:
        """Retire the session's keys where the chain's tip is now: a record hashed after this seals the
        session's rows under a new key, so destroying these never touches a row recorded after."""
        with self._tip_lock:
            return Retirement(session_id, self.keys.retire(session_id), self.next_seq)

    def last_timestep_before(self, retirement: Retirement) -> int | None:
        """The session's last timestep recorded before its keys were retired (None: none), once the
        records up to there are committed (waits for them)."""
        self._wait_committed(retirement.before_seq)
        with self.conn.cursor() as cur:
            found = one(cur.execute("SELECT max(timestep_id) FROM audit_records WHERE session_id = ? AND seq < ? "
                                    "AND event_type != ?", [retirement.session_id, retirement.before_seq,
                                                            EVENT_TYPE]))[0]
        return None if found is None else int(found)

    def _wait_committed(self, seq: int, timeout: float = COMMIT_TURN_TIMEOUT_S) -> None:
        with self._turn:
            if not self._turn.wait_for(lambda: self.committed_seq >= seq or self._failed is not None, timeout):
                raise RuntimeError(f"audit records before seq {seq} were not committed in {timeout:.0f} s")
            if self._failed is not None and self.committed_seq < seq:
                raise RuntimeError(f"audit log failed earlier: {self._failed!r}") from self._failed

    def destroy_keys(self, key_ids: list[int]) -> None:
        """Destroy keys a committed deletion named (chained first: a key is only ever destroyed by a
        deletion the log holds); the hidden activations sealed records carry go with them."""
        with self._commit_lock:
            erase_hidden(self.conn, key_ids)
        self.keys.destroy(key_ids)

    def pending_deletions(self) -> list[Deletion]:
        """Chained deletions whose keys are still in audit.keys: a crash came between the event and the
        keys' destruction, so the experience file may still hold the rows (finished by the caller)."""
        with self.conn.cursor() as cur:
            deletions = chained_deletions(cur)
        named = sorted({k for d in deletions for k in d.keys})
        alive = set(self.keys.owners(named)) if named else set()
        return [d for d in deletions if alive & set(d.keys)]

    def prepare(self, batch: pa.Table, new_concepts: list[tuple[int, str]]) -> PreparedBatch:
        """Hash a batch onto the chain's tip (Python work, nothing written yet) and move the tip on."""
        with self._tip_lock:
            return self._prepare(batch, new_concepts)

    def _prepare(self, batch: pa.Table, new_concepts: list[tuple[int, str]]) -> PreparedBatch:
        n = batch.num_rows
        seq = pa.array(np.arange(self.next_seq, self.next_seq + n, dtype=np.int64))
        records = batch.rename_columns(["timestep_id" if c == "id" else c for c in batch.column_names])
        sealing = seal_batch if self.batch_sealed_from is not None and self.next_seq >= self.batch_sealed_from else seal
        records, hidden = split_hidden(sealing(records.append_column("seq", seq), self.keys.keys_for, EVENT_TYPE))
        end = self.next_seq + n - 1
        replay = None
        if self.activations_apart:
            full = activation_leaves(records, TOP_K)
            replay = replay_rows(records)
            records = without_activations(records)
            root = activation_root(full)
            leaf, hashes = stamp(self.head, records, [end], acts={end: root})
            records = records.append_column("activation_leaf", pa.array(short(full), pa.int32())).append_column(
                "activation_root", pa.array([None] * (n - 1) + [root], pa.binary()))
        else:
            leaf, hashes = stamp(self.head, records, [end])
        records = records.append_column("record_hash", pa.array(hashes, pa.binary())).append_column(
            "leaf", pa.array(leaf, pa.int32()))
        head = hashes[-1]
        assert head is not None
        concept_rows, concepts_head = [], self.concepts_head
        for cid, name in new_concepts:
            h = concept_hash(concepts_head, cid, name)
            concept_rows.append((cid, name, concepts_head, h))
            concepts_head = h
        concept_count = self.concept_count + len(new_concepts)
        ckpt = checkpoint_hash(self.checkpoint_head, self.next_seq, end, head, concept_count, concepts_head)
        prepared = PreparedBatch(records, concept_rows, self.next_seq, end, head, self.checkpoint_head, ckpt,
                                 concept_count, concepts_head, replay, hidden)
        self.next_seq += n
        self.head, self.checkpoint_head = head, ckpt
        self.concept_count, self.concepts_head = concept_count, concepts_head
        return prepared

    def commit(self, p: PreparedBatch, timeout: float = COMMIT_TURN_TIMEOUT_S) -> None:
        """Write a prepared batch, its concepts and its checkpoint in one transaction, then anchor
        the new head. Batches commit in the order they were prepared: one prepared after another
        still being written waits its turn."""
        deadline = time.monotonic() + timeout
        with self._turn:
            while p.seq_start != self.committed_seq:
                if self._failed is not None:
                    raise RuntimeError(f"audit log failed earlier: {self._failed!r}") from self._failed
                remaining = deadline - time.monotonic()
                if p.seq_start < self.committed_seq or remaining <= 0:
                    raise RuntimeError(f"audit batch prepared for seq {p.seq_start}, "
                                       f"the file is at {self.committed_seq}")
                self._turn.wait(remaining)
        try:
            with self._commit_lock:
                self._write(p)
                self._anchor(p.seq_end, p.head)
        except BaseException as exc:
            # The tip has moved past this batch: nothing prepared after it can ever commit.
            with self._turn:
                self._failed = exc
                self._turn.notify_all()
            raise
        with self._turn:
            self.committed_seq = p.seq_end + 1
            self.largest_commit = max(self.largest_commit, p.seq_end + 1 - p.seq_start)
            self.committed_head = (p.seq_end, p.head)
            if p.replay is not None and p.replay.num_rows:
                self._audited_through = max(self._audited_through, int(p.replay.column("timestep_id")[-1].as_py()))
            self._turn.notify_all()

    def _write(self, p: PreparedBatch) -> None:
        con = self.conn
        con.execute("BEGIN")
        try:
            # Relations over the Arrow tables, not registered views: a view's creation and drop are
            # catalog changes, ~0.35 ms of CPU a batch each. Columns in the tables' order.
            if p.concept_rows:
                ids, names, prevs, hashes = zip(*p.concept_rows)
                con.from_arrow(pa.table({
                    "id": pa.array(ids, pa.int32()), "name": pa.array(names, pa.string()),
                    "prev_hash": pa.array(prevs, pa.binary()), "hash": pa.array(hashes, pa.binary())})
                ).insert_into("audit_concepts")
            con.from_arrow(stored_records(p.records)).insert_into("audit_records")
            if p.replay is not None and p.replay.num_rows:
                con.from_arrow(p.replay).insert_into(REPLAY_TABLE)
            if p.hidden is not None:
                con.from_arrow(p.hidden).insert_into(HIDDEN_TABLE)
            # Every batch, not only before a checkpoint: left to accumulate, the rows reach the file anyway
            # (bench/audit_bytes.py at 2M tokens: 85.5 bytes a token against 78.7).
            self._prune_replay(con)
            # Numbers and hashes only, so a literal: a statement with parameters is prepared anew on
            # every call (a millisecond of a small batch's commit).
            con.execute(f"INSERT INTO audit_checkpoints VALUES ({int(p.seq_start)}, {int(p.seq_end)}, "
                        f"from_hex('{p.head.hex()}'), {int(p.concept_count)}, from_hex('{p.concepts_head.hex()}'), "
                        f"now(), from_hex('{p.prev_checkpoint.hex()}'), from_hex('{p.checkpoint.hex()}'))")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def concepts(self) -> list[tuple[int, str]]:
        return self.conn.execute("SELECT id, name FROM audit_concepts ORDER BY id").fetchall()

    def verify(self, seq_from: int | None = None, seq_to: int | None = None, chunk: int = 200_000, *,
               anchored: bool = True, expect_head: tuple[int, bytes] | None = None) -> AuditReport:
        """The chain (`verify_connection`), then, with `anchored`, the head file, and the head
        noted elsewhere (`expect_head`: that record must still be on the chain with that hash).

        The commit lock is held only while a read transaction opens and the head file is read: the
        check runs on that snapshot while commits go on (re-hashing 300k records took 1 s, during
        which every commit, and so every reply being recorded, used to wait)."""
        with self.conn.cursor() as cur:
            with self._commit_lock:
                cur.execute("BEGIN TRANSACTION")
                cur.execute("SELECT count(*) FROM audit_checkpoints").fetchone()  # the snapshot, taken now
                heads = heads_as_of_now(self.head_path)
            owners = self.keys.owners if self.keys.exists else None
            try:
                report = verify_connection(cur, seq_from, seq_to, chunk)
                if report.ok:
                    # Keys are read after the snapshot: one destroyed since is checked against the
                    # deletions chained since, too.
                    report = check_erasures(cur, owners, report, self._deletions_now)
                if report.ok and anchored:
                    report = check_anchor(cur, self.head_path, report, heads)
                if report.ok and expect_head is not None:
                    report = check_expected_head(cur, expect_head, report)
                if report.ok and report.retired is not None:
                    report.erased.insert(0, report.retired)
                return report
            finally:
                cur.execute("ROLLBACK")

    def verify_for_open(self, seq_from: int | None = None) -> None:
        """Verify what a start builds on before anything does, in time flat in the log's size: its
        tail from the last checkpoint (and from `seq_from`, the first record to replay, if earlier) and
        its last anchor (`verify_tail`); raise ValueError naming the first bad record (or the head
        mismatch). The one fault repaired is a single checkpoint past the anchor with the chain intact:
        what a crash between a commit's two writes leaves (only one commit is ever in flight); its head
        is anchored now. The whole chain is re-hashed by `verify_in_background`."""
        last_start = one(self.conn.execute("SELECT coalesce(max(seq_start), 0) FROM audit_checkpoints"))[0]
        start = last_start if seq_from is None else min(seq_from, last_start)
        report = self._verify_tail(start)
        if not report.ok and len(report.unanchored) == 1:
            seq, head = report.unanchored[0]
            log.warning("audit log %s: checkpoint at seq=%d was committed but not anchored (a crash between "
                        "the two writes); anchoring it now", self.path, seq)
            with self._commit_lock:
                self._anchor(seq, head)
            report = self._verify_tail(start)
        if not report.ok:
            raise ValueError(f"audit log {self.path} is broken: {report.first_bad}; nothing was replayed or modified")
        for repair in self.repairs:
            self.append_event("audit_head_repaired" if repair["file"] == HEAD_FILE else "audit_keys_repaired", repair)
        self.repairs = []
        with self.conn.cursor() as cur:
            chained = retirements(cur)
            first = one(cur.execute("SELECT min(seq) FROM audit_records"))[0]
        if chained and first is not None and chained[-1].through >= first:
            log.warning("audit log %s: the retirement chained at seq=%d was cut short (a crash): carrying it out",
                        self.path, chained[-1].seq)
            self._carry_out(chained[-1].through)

    def _deletions_now(self) -> list[Deletion]:
        with self.conn.cursor() as cur:
            return chained_deletions(cur)

    def _verify_tail(self, seq_from: int) -> AuditReport:
        with self.conn.cursor() as cur:
            return verify_tail(cur, self.head_path, seq_from)

    def verify_in_background(self) -> threading.Thread:
        """Re-hash the whole chain and check every anchor on a thread of its own (no lock held: it reads
        a snapshot), its verdict in `full_verification` when done; a broken log is logged as an error.
        A start runs it after `verify_for_open`, so recording and serving never wait for it."""
        def run() -> None:
            started = time.monotonic()
            try:
                report = self.verify()
            except (duckdb.Error, sqlite3.ProgrammingError):
                if self._closing:  # the log or its keys closed under it (a stop): no verdict, not a fault
                    return
                raise
            self.full_verification = report
            if report.ok:
                log.info("audit log %s: the whole chain verified (%d records, %.1f s)", self.path,
                         report.records_checked, time.monotonic() - started)
            else:
                log.error("audit log %s is broken: %s", self.path, report.first_bad)

        thread = threading.Thread(target=run, name="ahc-audit-verify", daemon=True)
        thread.start()
        return thread

def verify_audit(data_dir: Path, seq_from: int | None = None, seq_to: int | None = None, *,
                 expect_head: tuple[int, bytes] | None = None) -> AuditReport:
    """Verify `DATA_DIR/audit/audit.duckdb` and its anchor `audit.head` from another process
    (opens it read-only)."""
    path = Path(data_dir) / "audit" / "audit.duckdb"
    audit = AuditLog.open(path, read_only=True)
    try:
        return audit.verify(seq_from, seq_to, expect_head=expect_head)
    finally:
        audit.close()
