"""Sealing audit records: a session's content is stored in the audit log only encrypted under a key of
that session's, so deleting the session (destroying its keys, xdb/audit_keys.py) removes its content
from the log while every record, and so the hash chain over the sealed bytes, stays in place.

A record of a session (not a system event) is sealed: its token id, content, metadata and steering go
into one payload, stored as `sealed` under `key_id`, and those columns are stored null. The payload is
    int32 token_id (-1 for none), then for content, metadata and steering: int32 UTF-8 byte length
    (-1 for null) and the bytes,
encrypted with AES-256 in counter mode: record `seq`'s keystream is AES(key, seq ‖ i) for its 16-byte
blocks i = 0, 1, ... (both big-endian uint64), unique per key since a seq is never reused. A batch's
counter blocks are built with numpy and encrypted one call per session, so sealing costs no Python
work per record. Integrity is the chain's: the sealed bytes are hashed onto it (xdb/canonical.py).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from xdb.canonical import length_prefixed

PAYLOAD_FIELDS = ("content", "metadata", "steering")
SEALED_COLUMNS = ("token_id", *PAYLOAD_FIELDS)
BLOCK = 16


def seal(records: pa.Table, key_for: Callable[[str], tuple[int, bytes]], system_event: str) -> pa.Table:
    """`records` (audit_records columns but key_id and sealed, with seq) with every session's record
    sealed under `key_for(session_id)` (its key id and key); system events and session-less records
    stay in clear."""
    n = records.num_rows
    sessions = records.column("session_id").combine_chunks()
    clear = np.asarray(pc.fill_null(pc.or_(pc.equal(records.column("event_type"), system_event),
                                           pc.equal(pc.fill_null(sessions, ""), "")), True), dtype=bool)
    if n == 0 or clear.all():
        return (records.append_column("key_id", pa.nulls(n, pa.int32()))
                .append_column("sealed", pa.nulls(n, pa.binary())))
    key_ids = np.full(n, -1, dtype=np.int32)
    keys: dict[int, bytes] = {}
    for name in pc.unique(sessions.filter(pa.array(~clear))).to_pylist():
        key_id, key = key_for(name)
        keys[key_id] = key
        key_ids[np.asarray(pc.fill_null(pc.equal(sessions, name), False), dtype=bool) & ~clear] = key_id
    payload = _payload(records)
    sealed = _crypt(payload, records.column("seq").to_numpy(), key_ids, keys, ~clear)
    for name in SEALED_COLUMNS:
        column = records.column(name)
        records = records.set_column(records.column_names.index(name), name,
                                     pc.if_else(pa.array(clear), column, pa.nulls(n, column.type)))
    return (records.append_column("key_id", pa.array(key_ids, pa.int32(), mask=clear))
            .append_column("sealed", pc.if_else(pa.array(~clear), sealed.cast(pa.binary()), pa.nulls(n, pa.binary()))))


def open_sealed(seqs: np.ndarray, key_ids: np.ndarray, sealed: pa.Array, keys: dict[int, bytes]
                ) -> list[tuple[int | None, str | None, str | None, str | None] | None]:
    """Each sealed record's (token_id, content, metadata, steering); None where its key is gone (the
    session was deleted) or the record is not sealed."""
    known = np.array([k in keys for k in key_ids.tolist()], dtype=bool) & sealed.is_valid().to_numpy(
        zero_copy_only=False)
    if not known.any():
        return [None] * len(seqs)
    plain = _crypt(pc.fill_null(sealed, b"").cast(pa.large_binary()), seqs, key_ids, keys, known)
    out: list[tuple[int | None, str | None, str | None, str | None] | None] = []
    for ok, data in zip(known.tolist(), plain.to_pylist()):
        out.append(_parse(data) if ok else None)
    return out


def _payload(records: pa.Table) -> pa.Array:
    n = records.num_rows
    token = pc.fill_null(records.column("token_id").combine_chunks(), -1).to_numpy().astype("<i4")
    parts = length_prefixed(records, token.view(np.uint8).reshape(n, 4), PAYLOAD_FIELDS)
    joined: pa.Array = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))
    return joined


def _crypt(data: pa.Array, seqs: np.ndarray, key_ids: np.ndarray, keys: dict[int, bytes], rows: np.ndarray
           ) -> pa.Array:
    """XOR each selected row's bytes with its keystream (encrypts and decrypts alike); unselected rows
    come back as they were. `data` is large_binary."""
    data = data.cast(pa.large_binary())
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int64)[data.offset:data.offset + len(data) + 1]
    lengths = np.diff(offsets)
    lengths = np.where(rows, lengths, 0)
    blocks = (lengths + BLOCK - 1) // BLOCK
    total = int(blocks.sum())
    flat = np.frombuffer(data.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]].copy() \
        if data.buffers()[2] is not None else np.zeros(0, np.uint8)
    if total:
        first_block = np.cumsum(blocks) - blocks
        counters = np.empty((total, 2), dtype=">u8")
        counters[:, 0] = np.repeat(seqs.astype(np.uint64), blocks)
        counters[:, 1] = np.arange(total, dtype=np.uint64) - np.repeat(first_block, blocks).astype(np.uint64)
        owner = np.repeat(key_ids, blocks)
        stream = np.empty((total, BLOCK), dtype=np.uint8)
        for key_id in np.unique(owner).tolist():
            sel = owner == key_id
            encryptor = Cipher(algorithms.AES(keys[key_id]), modes.ECB()).encryptor()
            stream[sel] = np.frombuffer(encryptor.update(counters[sel].tobytes()), dtype=np.uint8).reshape(-1, BLOCK)
        where = np.repeat(offsets[:-1] - offsets[0], lengths) + _ranks(lengths)
        flat[where] ^= stream.reshape(-1)[np.repeat(first_block * BLOCK, lengths) + _ranks(lengths)]
    rebased = (offsets - offsets[0]).astype(np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(data), [None, pa.py_buffer(rebased),
                                                                          pa.py_buffer(flat)])


def _ranks(lengths: np.ndarray) -> np.ndarray:
    """0..len-1 for each row's bytes, concatenated."""
    total = int(lengths.sum())
    ranks: np.ndarray = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return ranks


def _parse(data: bytes) -> tuple[int | None, str | None, str | None, str | None]:
    (token,) = struct.unpack_from("<i", data, 0)
    pos, fields = 4, list[str | None]()
    for _ in PAYLOAD_FIELDS:
        (size,) = struct.unpack_from("<i", data, pos)
        pos += 4
        if size < 0:
            fields.append(None)
        else:
            fields.append(data[pos:pos + size].decode())
            pos += size
    return (None if token == -1 else token), fields[0], fields[1], fields[2]
