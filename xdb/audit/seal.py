"""Sealing audit records: a session's content is stored in the audit log only encrypted under a key of
that session's, so deleting the session (destroying its keys, xdb/audit/keys.py) removes its content
from the log while every record, and so the hash chain over the sealed bytes, stays in place.

A record of a session (not a system event) is sealed: its token id, content, metadata and steering go
into one payload, stored as `sealed` under `key_id`, and those columns are stored null. The payload is
    int32 token_id (-1 for none), then for content, metadata and steering: int32 UTF-8 byte length
    (-1 for null) and the bytes,
encrypted with AES-256 in counter mode: record `seq`'s keystream is AES(key, seq ‖ i) for its 16-byte
blocks i = 0, 1, ... (both big-endian uint64), unique per key since a seq is never reused. A batch's
counter blocks are built with numpy and encrypted one call per session, so sealing costs no Python
work per record. Integrity is the chain's: the sealed bytes are hashed onto it (xdb/audit/canonical.py).

From the seq an audit log marks (`batch_sealed_from` in audit_meta, schema version 5) on, a batch's
records of one session are sealed together (`seal_batch`): one blob, stored in the session's first record
of the batch, every other record of it holding only `key_id` (its `sealed` null), encrypted as above with
the blob's record's seq as its counter's seq (no other record of the key uses that seq). A blob is
    byte 1, then raw DEFLATE (no zlib header) of: uint32 n, then the 5 × n int32s below split into byte
    planes (every value's lowest byte, then every second byte, ...), then the UTF-8 bytes of the
    content, metadata and steering of the records in turn;
the int32s: each record's seq less the one before's (the blob's record's own: 0), token_id (-1 for
none), and for content, metadata and steering the UTF-8 byte length plus one (0 for null). Small
values' high bytes are then long runs of zeros: ~4.4 bytes a record for a reply's tokens, where the
layout before, still read, took ~7: zlib (its header's first byte 0x78) of uint32 n, n × int32 seq
offset from the blob's record, n × int32 token_id (-1 for none), then for content, metadata and
steering: n × int32 UTF-8 byte length (-1 for null) and the bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from xdb.audit.canonical import length_prefixed

PAYLOAD_FIELDS = ("content", "metadata", "steering")
SEALED_COLUMNS = ("token_id", *PAYLOAD_FIELDS)
BLOCK = 16
BLOB_PLANES = b"\x01"  # a batch blob's first byte in the byte-plane layout (zlib's, before it: 0x78)


def seal(records: pa.Table, keys_for: Callable[[list[str]], dict[str, tuple[int, bytes]]], system_event: str
         ) -> pa.Table:
    """`records` (audit_records columns but key_id and sealed, with seq) with every session's record
    sealed under its session's key (`keys_for(session ids)`: each one's key id and key, made at once for
    those that have none); system events and session-less records stay in clear."""
    keyed = _session_keys(records, keys_for, system_event)
    if keyed is None:
        return _unsealed(records)
    clear, key_ids, keys = keyed
    sealed = _crypt(_payload(records), records.column("seq").to_numpy(), key_ids, keys, ~clear)
    return _with_sealed(records, clear, key_ids, sealed, ~clear)


def seal_batch(records: pa.Table, keys_for: Callable[[list[str]], dict[str, tuple[int, bytes]]],
               system_event: str) -> pa.Table:
    """As `seal`, but each session's records of the batch sealed as one blob, stored in its first record
    (the others: `key_id` alone)."""
    keyed = _session_keys(records, keys_for, system_event)
    if keyed is None:
        return _unsealed(records)
    clear, key_ids, keys = keyed
    n = records.num_rows
    seqs = records.column("seq").to_numpy()
    token = pc.fill_null(records.column("token_id").combine_chunks(), -1).to_numpy().astype("<i4")
    texts = {name: records.column(name).combine_chunks() for name in PAYLOAD_FIELDS}
    blobs: list[bytes | None] = [None] * n
    for key_id in np.unique(key_ids[~clear]).tolist():
        rows = np.flatnonzero((key_ids == key_id) & ~clear)
        numbers = [np.diff(seqs[rows], prepend=seqs[rows[0]]), token[rows]]
        strings = []
        for name in PAYLOAD_FIELDS:
            values = [None if v is None else v.encode() for v in texts[name].take(pa.array(rows)).to_pylist()]
            numbers.append(np.array([0 if v is None else len(v) + 1 for v in values]))
            strings.append(b"".join(v for v in values if v is not None))
        planes = np.stack(numbers).astype("<i4").view(np.uint8).reshape(len(numbers), len(rows), 4)
        deflate = zlib.compressobj(9, zlib.DEFLATED, -15, 9)
        blobs[rows[0]] = BLOB_PLANES + deflate.compress(
            struct.pack("<I", len(rows)) + planes.transpose(2, 0, 1).tobytes() + b"".join(strings)) + deflate.flush()
    has_blob = np.array([b is not None for b in blobs], dtype=bool)
    plain = pa.array([b if b is not None else b"" for b in blobs], pa.large_binary())
    sealed = _crypt(plain, seqs, key_ids, keys, has_blob)
    return _with_sealed(records, clear, key_ids, sealed, has_blob)


def _session_keys(records: pa.Table, keys_for: Callable[[list[str]], dict[str, tuple[int, bytes]]],
                  system_event: str) -> tuple[np.ndarray, np.ndarray, dict[int, bytes]] | None:
    """Which records stay in clear (system events, session-less ones), each record's key id (-1 in clear)
    and the keys by id, made at once for sessions that have none; None when every record stays in clear."""
    n = records.num_rows
    sessions = records.column("session_id").combine_chunks()
    clear = np.asarray(pc.fill_null(pc.or_(pc.equal(records.column("event_type"), system_event),
                                           pc.equal(pc.fill_null(sessions, ""), "")), True), dtype=bool)
    if n == 0 or clear.all():
        return None
    encoded = pc.dictionary_encode(sessions)
    names = encoded.dictionary.to_pylist()
    codes = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
    found = keys_for(sorted({names[c] for c in np.unique(codes[~clear]).tolist()}))
    ids_by_code = np.array([found[name][0] if name in found else -1 for name in names], dtype=np.int32)
    key_ids = np.where(clear, -1, ids_by_code[codes]).astype(np.int32)
    return clear, key_ids, {key_id: key for key_id, key in found.values()}


def _unsealed(records: pa.Table) -> pa.Table:
    n = records.num_rows
    return records.append_column("key_id", pa.nulls(n, pa.int32())).append_column("sealed", pa.nulls(n, pa.binary()))


def _with_sealed(records: pa.Table, clear: np.ndarray, key_ids: np.ndarray, sealed: pa.Array,
                 stored: np.ndarray) -> pa.Table:
    """The sealed columns cleared where a record is sealed, its key id and (where `stored`) its sealed bytes."""
    n = records.num_rows
    for name in SEALED_COLUMNS:
        column = records.column(name)
        records = records.set_column(records.column_names.index(name), name,
                                     pc.if_else(pa.array(clear), column, pa.nulls(n, column.type)))
    return (records.append_column("key_id", pa.array(key_ids, pa.int32(), mask=clear))
            .append_column("sealed", pc.if_else(pa.array(stored), sealed.cast(pa.binary()),
                                                pa.nulls(n, pa.binary()))))


Payload = tuple[int | None, str | None, str | None, str | None]


def open_blobs(seqs: np.ndarray, key_ids: np.ndarray, blobs: pa.Array, keys: dict[int, bytes]
               ) -> dict[int, Payload]:
    """The records' payloads (by seq) held by the batch blobs of `seal_batch` stored at `seqs`, for those
    whose key is in `keys` (the rest were erased)."""
    known = np.array([k in keys for k in key_ids.tolist()], dtype=bool) & blobs.is_valid().to_numpy(
        zero_copy_only=False)
    out: dict[int, Payload] = {}
    if not known.any():
        return out
    plain = _crypt(pc.fill_null(blobs, b"").cast(pa.large_binary()), seqs, key_ids, keys, known)
    for ok, base, data in zip(known.tolist(), seqs.tolist(), plain.to_pylist()):
        if not ok:
            continue
        if data[:1] == BLOB_PLANES:
            out.update(_open_planes(base, zlib.decompress(data[1:], -15)))
            continue
        raw = zlib.decompress(data)
        (count,) = struct.unpack_from("<I", raw, 0)
        pos = 4
        offsets = np.frombuffer(raw, "<i4", count, pos).tolist()
        tokens = np.frombuffer(raw, "<i4", count, pos + 4 * count).tolist()
        pos += 8 * count
        fields: list[list[str | None]] = []
        for _ in PAYLOAD_FIELDS:
            lengths = np.frombuffer(raw, "<i4", count, pos).tolist()
            pos += 4 * count
            values: list[str | None] = []
            for size in lengths:
                if size < 0:
                    values.append(None)
                else:
                    values.append(raw[pos:pos + size].decode())
                    pos += size
            fields.append(values)
        for i, offset in enumerate(offsets):
            out[base + offset] = (None if tokens[i] == -1 else tokens[i], fields[0][i], fields[1][i], fields[2][i])
    return out


def _open_planes(base: int, raw: bytes) -> dict[int, Payload]:
    (count,) = struct.unpack_from("<I", raw, 0)
    size = 4 * count * (2 + len(PAYLOAD_FIELDS))
    numbers = np.frombuffer(raw, np.uint8, size, 4).reshape(4, -1, count).transpose(1, 2, 0).copy().view("<i4")
    seqs = (base + np.cumsum(numbers[0, :, 0])).tolist()
    tokens = numbers[1, :, 0].tolist()
    pos = 4 + size
    fields: list[list[str | None]] = []
    for lengths in numbers[2:, :, 0].tolist():
        values: list[str | None] = []
        for length in lengths:
            values.append(None if length == 0 else raw[pos:pos + length - 1].decode())
            pos += max(length - 1, 0)
        fields.append(values)
    return {seq: (None if token == -1 else token, fields[0][i], fields[1][i], fields[2][i])
            for i, (seq, token) in enumerate(zip(seqs, tokens))}


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
        # One AES call a key: the blocks sorted by key, each key's a contiguous run.
        order = np.argsort(owner, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(owner[order]) != 0])
        for a, b in zip(starts.tolist(), [*starts[1:].tolist(), total]):
            run = order[a:b]
            encryptor = Cipher(algorithms.AES(keys[int(owner[run[0]])]), modes.ECB()).encryptor()
            stream[run] = np.frombuffer(encryptor.update(counters[run].tobytes()), dtype=np.uint8).reshape(-1, BLOCK)
        # Byte i of the data, in row j, takes keystream byte i + base[j]: row j's bytes start at its first
        # block; an unselected row's bytes all fall in a run of zeros after the keystream.
        every = np.diff(offsets)
        zeros = int(every[~rows].max()) if not rows.all() else 0
        keystream = np.concatenate([stream.reshape(-1), np.zeros(zeros, np.uint8)])
        base = np.where(rows, first_block * BLOCK, total * BLOCK) - (offsets[:-1] - offsets[0])
        flat ^= keystream[np.arange(len(flat), dtype=np.int64) + np.repeat(base, every)]
    rebased = (offsets - offsets[0]).astype(np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(data), [None, pa.py_buffer(rebased),
                                                                          pa.py_buffer(flat)])


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
