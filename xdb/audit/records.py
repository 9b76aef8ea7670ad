"""Reading the audit log's records back, their sealed content opened with the session keys still held: a
record sealed alone, or (from `batch_sealed_from` on) in its batch's blob of the session; a record whose key
was destroyed (its session deleted) reads as erased."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from xdb.audit.hidden import hidden_of
from xdb.audit.keys import SessionKeys
from xdb.audit.seal import Payload, open_blobs, open_sealed
from xdb.sql import one


class SealedReads:
    """`AuditLog`'s reads of its records (a mixin)."""

    conn: duckdb.DuckDBPyConnection
    keys: SessionKeys
    batch_sealed_from: int | None

    def records(self, session_id: str | None, event_type: str | None, since: datetime | None,
                until: datetime | None, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """Committed records in chain order, filtered (see XDB.audit_records); each with its record_hash (from
        schema version 6 on the batch's head in a batch's last record, null in the others)."""
        where, args = ["seq > ?"], list[Any]([after_seq])
        for clause, value in (("session_id = ?", session_id), ("event_type = ?", event_type),
                              ("created_at >= ?", since), ("created_at < ?", until)):
            if value is not None:
                where.append(clause)
                args.append(value)
        table = self.conn.cursor().execute(f"""
            SELECT seq, session_id, tick, event_type, role, content, token_id, request_id, created_at, metadata,
                   record_hash, key_id, sealed FROM audit_records WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?""",
            [*args, limit]).to_arrow_table()
        opened = self._open_sealed(table)
        out = []
        for row, payload in zip(table.drop_columns(["key_id", "sealed"]).to_pylist(), opened):
            row["created_at"] = row["created_at"].isoformat() + "Z"
            row["record_hash"] = None if row["record_hash"] is None else row["record_hash"].hex()
            row["erased"] = payload is False
            if isinstance(payload, tuple):
                row["token_id"], row["content"], row["metadata"], _ = payload
            out.append(row)
        hidden = hidden_of(self.conn.cursor(), [row["seq"] for row in out])
        for row in out:  # only the auditor reads these records: a hidden concept is shown here alone
            row["hidden_activations"] = hidden.get(row["seq"])
        return out

    def _open_sealed(self, table: pa.Table) -> list[Payload | bool]:
        """Per row: the sealed payload, False where its key was destroyed, True for a record in clear.
        A record sealed in a batch blob (from `batch_sealed_from` on) is read from its blob, fetched from
        the log when the blob's record is not among the rows (it is in the same batch, before it)."""
        key_ids = table.column("key_id").combine_chunks()
        if key_ids.null_count == len(key_ids):
            return [True] * table.num_rows
        ids = pa.compute.fill_null(key_ids, -1).to_numpy()
        seqs = table.column("seq").to_numpy()
        keys = self.keys.secrets(np.unique(ids[ids >= 0]).tolist())
        marker = self.batch_sealed_from
        batched = np.zeros(len(seqs), dtype=bool) if marker is None else (seqs >= marker) & (ids >= 0)
        opened = open_sealed(seqs, np.where(batched, -1, ids), table.column("sealed").combine_chunks(), keys)
        blobs: dict[int, Payload] = {}
        if batched.any():
            blobs = self._blob_payloads(seqs[batched], ids[batched], keys)
        out: list[Payload | bool] = []
        for i, valid in enumerate(key_ids.is_valid().to_pylist()):
            if not valid:
                out.append(True)
            elif batched[i]:
                out.append(blobs.get(int(seqs[i]), False))
            else:
                payload = opened[i]
                out.append(False if payload is None else payload)
        return out

    def _blob_payloads(self, seqs: np.ndarray, key_ids: np.ndarray, keys: dict[int, bytes]) -> dict[int, Payload]:
        """The payloads of the batch blobs holding records `seqs` (sealed under `key_ids`) whose keys are
        in `keys`, by seq."""
        wanted = sorted({int(k) for k in key_ids.tolist() if int(k) in keys})
        if not wanted:
            return {}
        lo, hi = int(seqs.min()), int(seqs.max())
        with self.conn.cursor() as cur:
            start = one(cur.execute("SELECT coalesce(max(seq_start), 0) FROM audit_checkpoints WHERE seq_start <= ?",
                                    [lo]))[0]
            found = cur.execute(f"SELECT seq, key_id, sealed FROM audit_records WHERE seq BETWEEN ? AND ? "
                                f"AND sealed IS NOT NULL AND key_id IN ({', '.join(map(str, wanted))}) ORDER BY seq",
                                [int(start), hi]).to_arrow_table()
        return open_blobs(found.column("seq").to_numpy(), found.column("key_id").to_numpy(),
                          found.column("sealed").combine_chunks(), keys)
