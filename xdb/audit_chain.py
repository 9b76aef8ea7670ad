"""The audit chain's definition: how a record, a concept and a checkpoint are hashed onto it, and how
its head is written outside the log. xdb/audit.py writes the chain, xdb/audit_verify.py checks it, and the
lake's copy of every replica's chain is checked with the same steps (xdb/lake_reads.py).

Each record is one timestep with ALL its fields (ids, tick, content, activations, steering, ...; a
session's content sealed under its key, xdb/audit_seal.py):
    record_hash_i = SHA-256(record_hash_{i-1} || canonical bytes of record i),  record_hash_{-1} = 0^32
The canonical bytes (xdb/canonical.py, seq included) are laid out for a whole batch at once, so only
the hash step itself runs per record in Python. Concept names form a chain of their own, and every
committed batch adds a checkpoint (the chain head after it, itself chained).

The head file, `audit.head` beside the log, holds one line `SEQ HASH` per commit: the last record's
seq and its record hash in hex.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pyarrow as pa

from xdb.canonical import canonical_array
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
