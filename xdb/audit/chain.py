"""The audit chain's definition: how a record, a concept and a checkpoint are hashed onto it, and how
its head is written outside the log. xdb/audit/log.py writes the chain, xdb/audit/verify.py checks it, and the
lake's copy of every replica's chain is checked with the same steps (xdb/lake/reads.py).

Each record is one timestep with ALL its fields (ids, tick, content, activations, steering, ...; a
session's content sealed under its key, xdb/audit/seal.py), laid out as canonical bytes (xdb/audit/canonical.py,
seq included) for a whole batch at once, so only the hash steps run per record in Python.

From schema version 6 on, the chain moves a committed batch (records seq a..b) at a time:
    leaf_i = SHA-256(canonical bytes of record i)
    head_b = SHA-256(head_before || "batch" || int64 a || int64 b || leaf_a || ... || leaf_b)
(int64s little-endian). From version 7 on a record's activations are hashed apart and stored only in the
experience file, and the head ends with `"acts" || act_root_b`, the root of the batch's activation leaves
(xdb/audit/activations.py); the record's own leaf hashes it with its concept columns null.

A record stores the first 4 bytes of its leaf (`leaf`, a little-endian int32) and the batch's last record
the batch's head (`record_hash`, null in the others). The head carries the
integrity: it is recomputed from the records' full leaves, never from the stored short ones, which only
tell which record of a batch whose head fails was changed (an edit that kept its 4 bytes, a chance of
2^-32, is still caught by the head, named by its batch). A short leaf is no weaker a pointer than a
longer one would be: whoever can edit a record can rewrite its stored leaf too. 4 bytes a record stand
where a 32-byte hash a record (~36 bytes on disk) stood.

Records written before (`leaf` null) were chained one at a time, and still verify so:
    record_hash_i = SHA-256(record_hash_{i-1} || canonical bytes of record i),  record_hash_{-1} = 0^32
A batch chains onto whichever came before it: the last record's hash, or the last batch's head.
Concept names form a chain of their own, and every committed batch adds a checkpoint (the chain head
after it, itself chained).

The head file, `audit.head` beside the log, holds one line `SEQ HASH` per commit: the last record's
seq and the chain's head there (its `record_hash`) in hex.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa

from xdb.audit.activations import ACTS
from xdb.audit.canonical import canonical_array
from xdb.schema import TOP_K

GENESIS = bytes(32)
HEAD_FILE = "audit.head"
# A system event's record: outside the timestep id space (-1), so replay never copies it into
# `timesteps` and it never moves the next timestep id.
EVENT_TYPE = "xdb_event"
RECORD_COLUMNS = ("seq", "timestep_id", "session_id", "tick", "event_type", "role", "content", "token_id",
                  "request_id", "concept_ids", "concept_values", "activation_source", "created_at",
                  "metadata", "steering", "key_id", "sealed")


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


def stored_records(records: pa.Table) -> pa.Table:
    """A prepared batch's records as `audit_records` holds them, column for column in its order: the
    record columns, prev_hash (no longer stored: null), record_hash (the batch's head, in its last record),
    key_id, sealed, leaf, activation_leaf, activation_root and hidden_digest."""
    fields = [c for c in RECORD_COLUMNS if c not in ("key_id", "sealed")]
    out = records.select(fields).append_column("prev_hash", pa.nulls(records.num_rows, pa.binary()))
    out = out.append_column("record_hash", records.column("record_hash")).append_column(
        "key_id", records.column("key_id")).append_column("sealed", records.column("sealed")).append_column(
        "leaf", records.column("leaf"))
    for name, kind in (("activation_leaf", pa.int32()), ("activation_root", pa.binary()),
                       ("hidden_digest", pa.binary())):
        column = records.column(name) if name in records.column_names else pa.nulls(records.num_rows, kind)
        out = out.append_column(name, column)
    return out


def leaves(records: pa.Table, k: int = TOP_K) -> list[bytes]:
    """Every record's full leaf hash, SHA-256 of its canonical bytes."""
    sha = hashlib.sha256
    return [sha(record).digest() for record in canonical_array(records, k).to_pylist()]


def short_leaves(full: list[bytes]) -> np.ndarray:
    """The stored part of each leaf: its first 4 bytes as a little-endian int32."""
    if not full:
        return np.zeros(0, dtype=np.int32)
    out: np.ndarray = np.frombuffer(b"".join(full), dtype="<i4").reshape(len(full), 8)[:, 0].astype(np.int32)
    return out


def batch_head(prev: bytes, seq_start: int, seq_end: int, full: list[bytes], acts: bytes | None = None) -> bytes:
    """The chain's head after the batch of records seq_start..seq_end with leaves `full`, and from schema
    version 7 on the root of its activations' leaves (`acts`, xdb/audit/activations.py)."""
    tail = b"" if acts is None else ACTS + acts
    return hashlib.sha256(prev + b"batch" + struct.pack("<qq", seq_start, seq_end) + b"".join(full) + tail).digest()


def stamp(prev: bytes, records: pa.Table, ends: list[int], k: int = TOP_K,
          acts: dict[int, bytes] | None = None) -> tuple[np.ndarray, list[bytes | None]]:
    """The stored hash columns of a run of records chained onto `prev` in batches ending at the seqs `ends`
    (the run's last seq among them): each record's short leaf, and its `record_hash` (its batch's head
    at a batch's last record, None elsewhere). `acts`: each batch's activation root, by its last seq."""
    acts = acts or {}
    seqs = records.column("seq").to_pylist()
    full = leaves(records, k)
    closing = set(ends)
    hashes: list[bytes | None] = [None] * len(seqs)
    start = 0
    for i, seq in enumerate(seqs):
        if seq in closing:
            prev = batch_head(prev, seqs[start], seq, full[start:i + 1], acts.get(seq))
            hashes[i], start = prev, i + 1
    return short_leaves(full), hashes


def concept_hash(prev: bytes, cid: int, name: str) -> bytes:
    return hashlib.sha256(prev + f"{cid}|{len(name.encode())}:{name}".encode()).digest()


def checkpoint_hash(prev: bytes, seq_start: int, seq_end: int, head: bytes, concept_count: int,
                    concepts_head: bytes) -> bytes:
    return hashlib.sha256(prev + f"{seq_start}|{seq_end}|{concept_count}|".encode() + head + concepts_head).digest()


def parse_head(text: str) -> tuple[int, bytes]:
    """`SEQ HASH` (a head file line) or `SEQ:HASH` (the CLI's form) → (seq, 32-byte hash)."""
    parts = text.strip().replace(":", " ").split()
    try:
        seq, digest = int(parts[0]), bytes.fromhex(parts[1])
        if len(parts) != 2 or seq < 0 or len(digest) != 32:
            raise ValueError
    except (ValueError, IndexError):
        raise ValueError(f"bad audit head {text.strip()!r}: expected SEQ:HASH (64 hex digits)") from None
    return seq, digest


def read_heads(path: Path) -> list[tuple[int, bytes]] | None:
    """Every head anchored in a head file, oldest first; None when there is no file. A last line with no
    newline is not anchored yet (being written, or torn by a crash before its fsync) and is left out."""
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    text = text[:text.rfind("\n") + 1]
    heads = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                heads.append(parse_head(line))
            except ValueError as exc:
                raise ValueError(f"{path} line {n}: {exc}") from None
    return heads


def cut_torn_line(path: Path) -> str | None:
    """Truncate a file after its last newline, fsynced; returns what was cut (None: nothing was)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data or data.endswith(b"\n"):
        return None
    keep = data.rfind(b"\n") + 1
    with path.open("r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return data[keep:].decode("utf-8", "replace")


MISMATCH = "hash mismatch (edited, reordered or a neighbour removed)"


def _head_mismatch(start: int, end: int) -> str:
    return (f"hash mismatch: the head of its batch (seq {start}..{end}) differs, every record's leaf matching "
            "(a record edited keeping its leaf, or the head rewritten)")


class Rehash:
    """Re-hashes a run of records, fed in seq order (contiguous, checked by the caller) a chunk at a time,
    onto `prev`: a record chained alone against its stored hash (and prev_hash, where one is stored), a
    batched one's leaf against its stored short leaf, and each batch's head against the one its last record
    stores. `ends`: the seqs where batches must end, each with its head (the checkpoints'), or None where
    the records alone say where (a lake's copy: where a head is stored). `checked` counts the records
    verified: a batch's once its head is."""

    def __init__(self, prev: bytes, ends: dict[int, bytes] | None = None, k: int = TOP_K) -> None:
        self.prev, self.ends, self.k = prev, ends, k
        self.checked = 0
        self._open: list[bytes] = []  # the leaves of the batch whose head has not come yet
        self._start = 0

    def feed(self, records: pa.Table) -> tuple[int, str] | None:
        """Check these records; the first bad one's seq and what is wrong with it, or None."""
        seqs = records.column("seq").to_pylist()
        if not seqs:
            return None
        has_leaf = "leaf" in records.column_names
        roots = records.column("activation_root").to_pylist() if "activation_root" in records.column_names \
            else [None] * len(seqs)
        if not self._open and (not has_leaf or records.column("leaf").null_count == len(seqs)):
            return self._feed_chained(seqs, records)
        canonical = canonical_array(records, self.k).to_pylist()
        if has_leaf and records.column("leaf").null_count == 0 and records.column("prev_hash").null_count == len(seqs):
            return self._feed_batched(seqs, canonical, records, roots)
        stored_prevs = records.column("prev_hash").to_pylist()
        stored = records.column("record_hash").to_pylist()
        short = records.column("leaf").to_pylist() if "leaf" in records.column_names else [None] * len(seqs)
        sha = hashlib.sha256
        for seq, raw, stored_prev, digest, leaf, root in zip(seqs, canonical, stored_prevs, stored, short, roots):
            if leaf is None:  # chained alone (before schema version 6)
                h = sha(self.prev + raw).digest()
                if self._open or digest is None or bytes(digest) != h or (
                        stored_prev is not None and bytes(stored_prev) != self.prev):
                    return seq, MISMATCH
                if self.ends is not None and seq in self.ends and self.ends[seq] != h:
                    return seq, "differs from its checkpoint"
                self.prev = h
                self.checked += 1
                continue
            full = sha(raw).digest()
            if int.from_bytes(full[:4], "little", signed=True) != leaf or stored_prev is not None:
                return seq, MISMATCH
            if not self._open:
                self._start = seq
            self._open.append(full)
            closes = digest is not None
            if self.ends is not None and closes != (seq in self.ends):
                return seq, MISMATCH if closes else "differs from its checkpoint (its batch's head is missing)"
            if closes and (failed := self._close(seq, bytes(digest), root)) is not None:
                return failed
        return None

    def _close(self, seq: int, stored: bytes | None, acts: bytes | None) -> tuple[int, str] | None:
        """End the open batch at `seq`: its head recomputed against the stored one and the checkpoint's."""
        h = batch_head(self.prev, self._start, seq, self._open, None if acts is None else bytes(acts))
        if stored != h:
            return seq, _head_mismatch(self._start, seq)
        if self.ends is not None and self.ends[seq] != h:
            return seq, "differs from its checkpoint"
        self.prev = h
        self.checked += len(self._open)
        self._open = []
        return None

    def _feed_batched(self, seqs: list[int], canonical: list[bytes], records: pa.Table,
                      roots: list[bytes | None]) -> tuple[int, str] | None:
        """`feed` for records every one of which is batched (the common case), with the same verdicts: the
        leaves compared at once, and the loop only over the batches' ends."""
        sha = hashlib.sha256
        full = [sha(raw).digest() for raw in canonical]
        bad = np.flatnonzero(short_leaves(full) != records.column("leaf").to_numpy())
        stored = records.column("record_hash").combine_chunks()
        closing = np.flatnonzero(stored.is_valid().to_numpy(zero_copy_only=False)).tolist()
        stop = int(bad[0]) if bad.size else len(seqs)
        moved = None  # the first record where a batch ends but no checkpoint does, or the other way round
        if self.ends is not None:
            first, last = seqs[0], seqs[-1]
            wanted = {e - first for e in self.ends if first <= e <= last}
            moved = min(wanted.symmetric_difference(closing), default=None)
        until = stop if moved is None else min(stop, moved)
        taken = 0
        for i in closing:
            if i >= until:
                break
            seq = seqs[i]
            if not self._open:
                self._start = seqs[taken]
            self._open.extend(full[taken:i + 1])
            taken = i + 1
            if (failed := self._close(seq, stored[i].as_py(), roots[i])) is not None:
                return failed
        if until < len(seqs):
            if until == stop:
                return seqs[until], MISMATCH
            return seqs[until], MISMATCH if until in closing else \
                "differs from its checkpoint (its batch's head is missing)"
        if taken < len(seqs):
            if not self._open:
                self._start = seqs[taken]
            self._open.extend(full[taken:])
        return None

    def _feed_chained(self, seqs: list[int], records: pa.Table) -> tuple[int, str] | None:
        """`feed` for records every one of which was chained alone (written before schema version 6)."""
        for seq, stored_prev, stored, h in zip(seqs, records.column("prev_hash").to_pylist(),
                                               records.column("record_hash").to_pylist(),
                                               chain(self.prev, records, self.k)):
            if stored is None or bytes(stored) != h or (stored_prev is not None and bytes(stored_prev) != self.prev):
                return seq, MISMATCH
            if self.ends is not None and seq in self.ends and self.ends[seq] != h:
                return seq, "differs from its checkpoint"
            self.prev = h
            self.checked += 1
        return None
