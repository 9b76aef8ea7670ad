"""Hidden concept activations: kept in the audit log alone, bound into the chain by a salted digest.

A lens pack's hidden concepts (`lens.hidden`) are measured like the others but never reach the experience
file, recall, the stream or the lake: the writer hands the audit a token's top `lens.audit_k` hidden
activations as `hidden_activations`, a JSON object {concept name: value} (largest first), and nothing else
takes them. The log stores them apart from its records, in `audit_hidden` (seq, salt, activations), which is
never shipped; the record itself stores only
    hidden_digest = SHA-256(16-byte random salt || the activations' UTF-8 JSON)
and its canonical bytes end with "hidden" || hidden_digest (xdb/audit/canonical.py), so the chain binds
the digest and the digest the values. A record without hidden activations (every record written before
they existed) has no such trailer and hashes as it always did. The salt keeps the digest, which a shared
lake does hold (it re-hashes every replica's chain), from being matched against guessed values.

Verification re-hashes the chain as before and then each stored row of `audit_hidden` against its record's
digest (`check_hidden`), naming the first record whose hidden activations were edited, removed or added.
"""

from __future__ import annotations

import hashlib
import json
import os

import duckdb
import pyarrow as pa

from xdb.rows import HIDDEN_COLUMN as COLUMN

HIDDEN_TABLE = "audit_hidden"
SALT_BYTES = 16


def digest(salt: bytes, activations: str) -> bytes:
    return hashlib.sha256(salt + activations.encode()).digest()


def split_hidden(records: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """The records with their `hidden_activations` column replaced by `hidden_digest` (null where a record
    has none), and the `audit_hidden` rows of those that have any (None: no record has). Takes `seq`."""
    if COLUMN not in records.column_names:
        return records, None
    texts = records.column(COLUMN).to_pylist()
    seqs = records.column("seq").to_pylist()
    rows: dict[str, list[object]] = {"seq": [], "salt": [], "activations": []}
    digests: list[bytes | None] = []
    salts = os.urandom(SALT_BYTES * len(texts))  # one call a batch, not one a record
    for i, (seq, text) in enumerate(zip(seqs, texts)):
        if text is None:
            digests.append(None)
            continue
        salt = salts[i * SALT_BYTES:(i + 1) * SALT_BYTES]
        digests.append(digest(salt, text))
        rows["seq"].append(seq)
        rows["salt"].append(salt)
        rows["activations"].append(text)
    records = records.drop_columns([COLUMN]).append_column("hidden_digest", pa.array(digests, pa.binary()))
    if not rows["seq"]:
        return records, None
    return records, pa.table({"seq": pa.array(rows["seq"], pa.int64()), "salt": pa.array(rows["salt"], pa.binary()),
                              "activations": pa.array(rows["activations"], pa.string())})


def has_hidden(cur: duckdb.DuckDBPyConnection) -> bool:
    """The log has the hidden table (a log opened read-only before its migration has not)."""
    found = cur.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
                        "AND table_name = ?", [HIDDEN_TABLE]).fetchone()
    return found is not None and found[0] > 0


def check_hidden(cur: duckdb.DuckDBPyConnection, start: int, end: int, erased: set[int]) -> str | None:
    """Each record of seq start..end with a hidden digest against its stored hidden activations; the first
    problem found, or None. The records' digests were checked by the chain first. `erased`: the keys chained
    deletions destroyed; a record sealed under one has its hidden activations erased with its content."""
    if not has_hidden(cur):
        return None
    rows = cur.execute(
        f"""SELECT coalesce(r.seq, h.seq) AS seq, r.hidden_digest, h.salt, h.activations, r.seq IS NULL AS orphan,
                   count(*) OVER (PARTITION BY h.seq) AS copies, r.key_id
            FROM (SELECT seq, hidden_digest, key_id FROM audit_records
                  WHERE seq BETWEEN ? AND ? AND hidden_digest IS NOT NULL) r
            FULL OUTER JOIN (SELECT * FROM {HIDDEN_TABLE} WHERE seq BETWEEN ? AND ?) h ON r.seq = h.seq
            ORDER BY 1""", [start, end, start, end]).fetchall()
    for seq, stored, salt, activations, orphan, copies, key_id in rows:
        where = f"audit record seq={seq}"
        if orphan:
            return f"{where}: hidden activations stored for a record that has none (inserted)"
        if activations is None:
            if key_id in erased:
                continue
            return f"{where}: its hidden activations are missing (deleted)"
        if copies > 1:
            return f"{where}: its hidden activations are stored twice (inserted)"
        if digest(bytes(salt), activations) != bytes(stored):
            return f"{where}: its hidden activations differ from those the chain committed (edited)"
    return None


def erase_hidden(conn: duckdb.DuckDBPyConnection, key_ids: list[int]) -> None:
    """Delete the hidden activations of the records sealed under `key_ids` (a deleted session's, its
    deletion chained): they go with the session's content; the records and their digests stay."""
    if key_ids and has_hidden(conn):
        conn.execute(f"DELETE FROM {HIDDEN_TABLE} WHERE seq IN (SELECT seq FROM audit_records "
                     f"WHERE key_id IN ({', '.join(str(int(k)) for k in key_ids)}))")


def hidden_of(cur: duckdb.DuckDBPyConnection, seqs: list[int]) -> dict[int, dict[str, float]]:
    """The hidden activations of the records `seqs` that have any, by seq ({concept name: value})."""
    if not seqs or not has_hidden(cur):
        return {}
    rows = cur.execute(f"SELECT seq, activations FROM {HIDDEN_TABLE} WHERE seq BETWEEN ? AND ?",
                       [min(seqs), max(seqs)]).fetchall()
    wanted = set(seqs)
    return {int(seq): json.loads(text) for seq, text in rows if seq in wanted}
