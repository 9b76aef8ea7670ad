"""Concept activations in the audit log, committed by hash and stored once: in the experience file.

Activations are most of a token's bytes (ten ids and ten float32s), and storing them in both files made the
audit log the larger half of the disk XDB fills. From schema version 7 on a record stores its activations
only as hashes, and the chain still binds them:
    act_leaf_i = SHA-256(uint16 slot mask || k × int32 concept id || k × float32 value)
                 (record i's activation part of its canonical bytes, xdb/audit/canonical.py)
    act_root_b = SHA-256("acts" || act_leaf_a || ... || act_leaf_b)     for the batch of records a..b
    head_b     = SHA-256(... the batch's head as before ... || "acts" || act_root_b)   (xdb/audit/chain.py)
A record stores its act leaf's first 4 bytes (`activation_leaf`), the batch's last record the root
(`activation_root`); the record's own leaf hashes it with no activations (its concept columns null).

So the log verifies on its own as before, and what it proves about activations is checked against the file
that holds them (`check_experience`): each experience row's activations hashed, against its record's short
leaf (which row was changed) and, for a batch whose rows are all still there, the root (the integrity).
A row that retention, compression or a deletion removed has nothing left to check.

Until the experience file has committed a batch, the audit is its write-ahead log: the batch's activations
wait in `audit_replay`, written in the audit's own transaction, for a replay after a crash, and leave it
once the experience file holds them (`AuditLog.experience_holds`). A replayed row's activations are
checked against its record's leaf first.
"""

from __future__ import annotations

import hashlib

import duckdb
import numpy as np
import pyarrow as pa

from xdb.audit.canonical import activation_bytes
from xdb.sql import one

REPLAY_TABLE = "audit_replay"
ACTS = b"acts"


def activation_leaves(table: pa.Table, k: int) -> list[bytes]:
    """Every row's full act leaf: SHA-256 of its activation bytes (`concept_ids`, `concept_values`)."""
    sha = hashlib.sha256
    return [sha(raw).digest() for raw in activation_bytes(table, k)]


def activation_root(full: list[bytes]) -> bytes:
    return hashlib.sha256(ACTS + b"".join(full)).digest()


def short(full: list[bytes]) -> np.ndarray:
    """The stored part of each act leaf: its first 4 bytes as a little-endian int32."""
    if not full:
        return np.zeros(0, dtype=np.int32)
    out: np.ndarray = np.frombuffer(b"".join(full), dtype="<i4").reshape(len(full), 8)[:, 0].astype(np.int32)
    return out


def without_activations(table: pa.Table) -> pa.Table:
    """The records as the log stores them: concept columns null."""
    for name in ("concept_ids", "concept_values"):
        i = table.column_names.index(name)
        table = table.set_column(i, name, pa.nulls(table.num_rows, table.column(name).type))
    return table


def replay_rows(table: pa.Table) -> pa.Table:
    """What `audit_replay` keeps of a batch: the activations of its rows that have any."""
    rows = table.select(["timestep_id", "concept_ids", "concept_values"])
    return rows.filter(rows.column("concept_ids").is_valid())


def check_replayed(rows: pa.Table, stored_leaves: list[int | None], k: int) -> int | None:
    """The index of the first replayed row whose activations do not hash to its record's stored leaf."""
    mine = short(activation_leaves(rows, k))
    for i, (got, want) in enumerate(zip(mine.tolist(), stored_leaves)):
        if want is not None and got != want:
            return i
    return None


def check_experience(audit: duckdb.DuckDBPyConnection, experience: duckdb.DuckDBPyConnection, start: int,
                     end: int, k: int, chunk: int = 200_000) -> str | None:
    """Check the activations the experience file holds for the records seq start..end (those with an act
    leaf: schema version 7 on) against the log; the first row found changed, or None. Both connections
    read one snapshot each, taken by the caller. Read a run of whole batches (checkpoints) at a time."""
    lo = one(audit.execute("SELECT coalesce(max(seq_start), ?) FROM audit_checkpoints WHERE seq_start <= ?",
                           [start, start]))[0]
    while lo <= end:
        hi = one(audit.execute("SELECT coalesce(max(seq_end), min(seq_end)) FROM audit_checkpoints "
                               "WHERE seq_end >= ? AND seq_end < ?", [lo, lo + chunk]))[0]
        if hi is None:
            hi = one(audit.execute("SELECT coalesce(min(seq_end), ?) FROM audit_checkpoints WHERE seq_end >= ?",
                                   [end, lo]))[0]
        records = audit.execute(
            "SELECT seq, timestep_id, activation_leaf, activation_root FROM audit_records WHERE seq BETWEEN ? AND ? "
            "AND activation_leaf IS NOT NULL ORDER BY seq", [lo, hi]).to_arrow_table()
        lo = hi + 1
        ids = records.column("timestep_id").to_numpy()
        real = ids[ids >= 0]
        if real.size == 0:
            continue
        held = experience.execute(
            "SELECT id AS timestep_id, concept_ids, concept_values FROM timesteps WHERE id BETWEEN ? AND ?",
            [int(real.min()), int(real.max())]).to_arrow_table()
        problem = _compare(records, held, k)
        if problem is not None:
            return problem
    return None


def _compare(records: pa.Table, held: pa.Table, k: int) -> str | None:
    """`records`: whole batches of the log; `held`: the experience rows among theirs still there."""
    where = dict(zip(held.column("timestep_id").to_pylist(), range(held.num_rows)))
    ids = records.column("timestep_id").to_pylist()
    seqs = records.column("seq").to_pylist()
    stored = records.column("activation_leaf").to_pylist()
    present = [i for i, t in enumerate(ids) if t in where]
    mine = activation_leaves(held.take(pa.array([where[ids[i]] for i in present], pa.int64())), k)
    leaves: dict[int, bytes] = dict(zip(present, mine))
    for i, leaf in leaves.items():
        if int.from_bytes(leaf[:4], "little", signed=True) != stored[i]:
            return _changed(seqs[i], ids[i])
    # A system event's record (timestep id -1) has no row and no activations.
    empty = activation_leaves(pa.table({name: pa.nulls(1, held.schema.field(name).type)
                                        for name in ("concept_ids", "concept_values")}), k)[0]
    begin = 0
    for i, root in enumerate(records.column("activation_root").to_pylist()):
        if root is None:
            continue
        batch, begin = range(begin, i + 1), i + 1
        if all(ids[j] < 0 or j in leaves for j in batch):
            if activation_root([empty if ids[j] < 0 else leaves[j] for j in batch]) != bytes(root):
                return _changed(seqs[i], ids[i], batch=(seqs[batch.start], seqs[i]))
    return None


def _changed(seq: int, timestep_id: int, batch: tuple[int, int] | None = None) -> str:
    if batch is None:
        return (f"timestep id={timestep_id} (audit record seq={seq}): its activations in the experience file "
                "differ from those the audit log committed (edited)")
    return (f"audit records seq {batch[0]}..{batch[1]}: the activations the experience file holds for them differ "
            "from those the audit log committed, every row's short leaf matching (edited keeping the leaf)")
