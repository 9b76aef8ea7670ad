"""The audit log: a separate, append-only DuckDB file whose records form a SHA-256 hash chain.

Each record is one timestep with ALL its fields (ids, tick, content, activations, steering, ...):
    record_hash_i = SHA-256(record_hash_{i-1} || canonical bytes of record i),  record_hash_{-1} = 0^32
The canonical bytes (xdb/canonical.py, seq included) are laid out for a whole batch at once, so only
the hash step itself runs per record in Python. Concept names live in
`audit_concepts`, a chain of their own. Every committed batch adds a checkpoint (the chain head after
it, itself chained), so a range of records verifies from the nearest checkpoint without reading the
rest, and a truncated tail is caught. Nothing in the HTTP API reads this file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from xdb.canonical import canonical_array
from xdb.schema import TOP_K, connect_checked, migrate, stored_version
from xdb.sql import Row, one

APP = "ahc-xdb-audit"
GENESIS = bytes(32)
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
]


RECORD_COLUMNS = ("seq", "timestep_id", "session_id", "tick", "event_type", "role", "content", "token_id",
                  "request_id", "concept_ids", "concept_values", "activation_source", "created_at",
                  "metadata", "steering")


def chain(prev: bytes, records: pa.Table, k: int = TOP_K) -> list[bytes]:
    """record_hash_i = SHA-256(record_hash_{i-1} || canonical bytes of record i), for a run of records.
    The records' bytes come from one vectorised layout; the loop is only the (inherently
    sequential) SHA-256 calls, ~0.7 µs a record."""
    sha = hashlib.sha256
    out: list[bytes] = []
    append = out.append
    h = prev
    for record in canonical_array(records, k).to_pylist():
        h = sha(h + record).digest()
        append(h)
    return out


def concept_hash(prev: bytes, cid: int, name: str) -> bytes:
    return hashlib.sha256(prev + f"{cid}|{len(name.encode())}:{name}".encode()).digest()


def checkpoint_hash(prev: bytes, seq_start: int, seq_end: int, head: bytes, concept_count: int,
                    concepts_head: bytes) -> bytes:
    return hashlib.sha256(prev + f"{seq_start}|{seq_end}|{concept_count}|".encode() + head + concepts_head).digest()


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


@dataclass
class AuditReport:
    ok: bool
    records_checked: int
    first_bad: str | None = None  # names the first bad record, e.g. "audit record seq=12 (...): ..."


class AuditLog:
    """Owned by the XDB writer: `prepare` (hashing, Python) and `commit` (DuckDB) may run on two
    threads, batches in the same order; `verify` runs on any thread. `prepare` moves the chain's
    tip on at once, so the next batch can be hashed while this one is written; `committed_seq` is
    where the file itself is."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path) -> None:
        self.conn = conn
        self.path = path
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

    @classmethod
    def open(cls, path: Path, *, read_only: bool = False) -> AuditLog:
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        conn = connect_checked(path, read_only=read_only)
        try:
            if read_only:
                if stored_version(conn, path, "audit_meta", APP) is None:
                    raise ValueError(f"{path} holds no audit log")
            else:
                migrate(conn, path, AUDIT_MIGRATIONS, "audit_meta", APP)
                # Only the writer's audit stage writes here, one batch at a time, alongside the
                # experience file's insert on another thread: DuckDB's own threads on top of that
                # cost twice the CPU of one (measured: 8 → 4 µs a row) and buy nothing.
                conn.execute("SET threads = 1")
            return cls(conn, path)
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def append(self, batch: pa.Table, new_concepts: list[tuple[int, str]]) -> None:
        """Append one batch (the writer's Arrow table) and its new concepts in one transaction."""
        self.commit(self.prepare(batch, new_concepts))

    def prepare(self, batch: pa.Table, new_concepts: list[tuple[int, str]]) -> PreparedBatch:
        """Hash a batch onto the chain's tip (Python work, nothing written yet) and move the tip on."""
        n = batch.num_rows
        seq = pa.array(np.arange(self.next_seq, self.next_seq + n, dtype=np.int64))
        records = batch.rename_columns(["timestep_id" if c == "id" else c for c in batch.column_names])
        records = records.append_column("seq", seq)
        hashes = chain(self.head, records)
        records = (records.append_column("prev_hash", pa.array([self.head, *hashes[:-1]], pa.binary()))
                   .append_column("record_hash", pa.array(hashes, pa.binary())))
        concept_rows, concepts_head = [], self.concepts_head
        for cid, name in new_concepts:
            h = concept_hash(concepts_head, cid, name)
            concept_rows.append((cid, name, concepts_head, h))
            concepts_head = h
        concept_count = self.concept_count + len(new_concepts)
        ckpt = checkpoint_hash(self.checkpoint_head, self.next_seq, self.next_seq + n - 1, hashes[-1],
                               concept_count, concepts_head)
        prepared = PreparedBatch(records, concept_rows, self.next_seq, self.next_seq + n - 1, hashes[-1],
                                 self.checkpoint_head, ckpt, concept_count, concepts_head)
        self.next_seq += n
        self.head, self.checkpoint_head = hashes[-1], ckpt
        self.concept_count, self.concepts_head = concept_count, concepts_head
        return prepared

    def commit(self, p: PreparedBatch) -> None:
        """Write a prepared batch, its concepts and its checkpoint in one transaction."""
        if p.seq_start != self.committed_seq:
            raise RuntimeError(f"audit batch prepared for seq {p.seq_start}, the file is at {self.committed_seq}")
        con = self.conn
        cols = ", ".join(RECORD_COLUMNS + ("prev_hash", "record_hash"))
        con.register("audit_batch", p.records)
        if p.concept_rows:
            ids, names, prevs, hashes = zip(*p.concept_rows)
            con.register("audit_new_concepts", pa.table({
                "id": pa.array(ids, pa.int32()), "name": pa.array(names, pa.string()),
                "prev_hash": pa.array(prevs, pa.binary()), "hash": pa.array(hashes, pa.binary())}))
        try:
            con.execute("BEGIN")
            try:
                if p.concept_rows:
                    con.execute("INSERT INTO audit_concepts SELECT id, name, prev_hash, hash FROM audit_new_concepts")
                con.execute(f"INSERT INTO audit_records ({cols}) SELECT {cols} FROM audit_batch")
                con.execute("INSERT INTO audit_checkpoints VALUES (?, ?, ?, ?, ?, now(), ?, ?)",
                            [p.seq_start, p.seq_end, p.head, p.concept_count, p.concepts_head,
                             p.prev_checkpoint, p.checkpoint])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        finally:
            con.unregister("audit_batch")
            if p.concept_rows:
                con.unregister("audit_new_concepts")
        self.committed_seq = p.seq_end + 1

    def last_timestep_id(self) -> int:
        last = one(self.conn.execute("SELECT max(timestep_id) FROM audit_records"))[0]
        return -1 if last is None else int(last)

    def rows_after(self, timestep_id: int) -> pa.Table:
        """Audited rows the experience file has not committed yet (replayed after a crash)."""
        cols = "timestep_id AS id, session_id, tick, event_type, role, content, token_id, request_id, " \
               "concept_ids, concept_values, activation_source, created_at, metadata"
        return self.conn.execute(f"SELECT {cols} FROM audit_records WHERE timestep_id > ? ORDER BY seq",
                                 [timestep_id]).to_arrow_table()

    def concepts(self) -> list[tuple[int, str]]:
        return self.conn.execute("SELECT id, name FROM audit_concepts ORDER BY id").fetchall()

    def verify(self, seq_from: int | None = None, seq_to: int | None = None, chunk: int = 200_000) -> AuditReport:
        with self.conn.cursor() as cur:
            return verify_connection(cur, seq_from, seq_to, chunk)


def _describe(cur: duckdb.DuckDBPyConnection, seq: int) -> str:
    row = cur.execute("SELECT timestep_id, session_id, tick FROM audit_records WHERE seq = ? LIMIT 1",
                      [seq]).fetchone()
    where = f" (timestep {row[0]}, session {row[1]!r}, tick {row[2]})" if row else ""
    return f"audit record seq={seq}{where}"


def _verify_concepts(cur: duckdb.DuckDBPyConnection) -> tuple[str | None, int, bytes]:
    prev = GENESIS
    rows = cur.execute("SELECT id, name, prev_hash, hash FROM audit_concepts ORDER BY id, hash").fetchall()
    for i, (cid, name, stored_prev, stored) in enumerate(rows):
        if cid != i:
            return f"audit concept id={cid}: expected id {i} (a concept was deleted or inserted)", i, prev
        h = concept_hash(prev, cid, name)
        if bytes(stored_prev) != prev or bytes(stored) != h:
            return f"audit concept id={cid} ({name!r}): hash mismatch (edited)", i, prev
        prev = h
    return None, len(rows), prev


def _verify_checkpoints(cur: duckdb.DuckDBPyConnection, concept_count: int, concepts_head: bytes
                        ) -> tuple[str | None, list[Row]]:
    rows = cur.execute("SELECT seq_start, seq_end, chain_head, concept_count, concepts_head, prev_hash, "
                       "checkpoint_hash FROM audit_checkpoints ORDER BY seq_end, seq_start").fetchall()
    prev, expected_start = GENESIS, 0
    heads: dict[int, bytes] = {}
    for start, end, head, ccount, chead, stored_prev, stored in rows:
        head, chead = bytes(head), bytes(chead)
        if start != expected_start or end < start:
            return f"audit checkpoint seq {start}..{end}: expected to start at seq {expected_start}", rows
        if bytes(stored_prev) != prev or checkpoint_hash(prev, start, end, head, ccount, chead) != bytes(stored):
            return f"audit checkpoint seq {start}..{end}: hash mismatch (edited)", rows
        prev, expected_start = bytes(stored), end + 1
        heads[end] = head
    if rows and (rows[-1][3] != concept_count or bytes(rows[-1][4]) != concepts_head):
        return "audit concepts: the concept chain does not match the last checkpoint (edited or truncated)", rows
    return None, rows


def verify_connection(cur: duckdb.DuckDBPyConnection, seq_from: int | None = None, seq_to: int | None = None,
                      chunk: int = 200_000) -> AuditReport:
    """Check the concept chain, the checkpoint chain and the records in [seq_from, seq_to] (all by
    default), recomputing every record's hash from its fields. Names the first bad record."""
    problem, concept_count, concepts_head = _verify_concepts(cur)
    if problem:
        return AuditReport(False, 0, problem)
    problem, checkpoints = _verify_checkpoints(cur, concept_count, concepts_head)
    if problem:
        return AuditReport(False, 0, problem)
    last_seq = checkpoints[-1][1] if checkpoints else -1
    # Start at the checkpoint just before seq_from, end at the one covering seq_to: a range reads
    # only its own segments.
    start, prev = 0, GENESIS
    end = last_seq
    for _s, e, head, *_ in checkpoints:
        if seq_from is not None and e < seq_from:
            start, prev = e + 1, bytes(head)
        if seq_to is not None and e >= seq_to:
            end = e
            break
    heads = {e: bytes(h) for s, e, h, *_ in checkpoints}
    checked = 0
    expected = start
    while expected <= end:
        hi = min(expected + chunk - 1, end)
        batch = cur.execute(f"SELECT {', '.join(RECORD_COLUMNS)}, prev_hash, record_hash FROM audit_records "
                            "WHERE seq BETWEEN ? AND ? ORDER BY seq, record_hash", [expected, hi]).to_arrow_table()
        seqs = batch.column("seq").to_pylist()
        stored_prevs = batch.column("prev_hash").to_pylist()
        stored_hashes = batch.column("record_hash").to_pylist()
        for _i, seq in enumerate(seqs):
            if seq != expected:
                what = "appears twice (inserted)" if seq < expected else "missing (deleted)"
                bad = expected - 1 if seq < expected else expected
                return AuditReport(False, checked, f"{_describe(cur, bad)}: {what}")
            expected += 1
        hashes = chain(prev, batch) if seqs else []
        for seq, stored_prev, stored, h in zip(seqs, stored_prevs, stored_hashes, hashes):
            if bytes(stored) != h or bytes(stored_prev) != prev:
                return AuditReport(False, checked, f"{_describe(cur, seq)}: hash mismatch "
                                   "(edited, reordered or a neighbour removed)")
            if seq in heads and heads[seq] != h:
                return AuditReport(False, checked, f"{_describe(cur, seq)}: differs from its checkpoint")
            prev, checked = h, checked + 1
        if expected <= hi:
            return AuditReport(False, checked, f"audit record seq={expected}: missing (deleted)")
    beyond = one(cur.execute("SELECT min(seq) FROM audit_records WHERE seq > ?", [last_seq]))[0]
    if seq_to is None and beyond is not None:
        return AuditReport(False, checked, f"{_describe(cur, beyond)}: not covered by any checkpoint (inserted)")
    return AuditReport(True, checked)


def verify_audit(data_dir: Path, seq_from: int | None = None, seq_to: int | None = None) -> AuditReport:
    """Verify `DATA_DIR/audit/audit.duckdb` from another process (opens it read-only)."""
    path = Path(data_dir) / "audit" / "audit.duckdb"
    log = AuditLog.open(path, read_only=True)
    try:
        return log.verify(seq_from, seq_to)
    finally:
        log.close()
