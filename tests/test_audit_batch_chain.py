"""The audit chain a batch at a time (schema version 6): a record stores a 4-byte leaf, a batch's last record
the batch's head. Tampering is still named to the record, an edit that keeps its short leaf is named by its
batch, a batch's end moved is caught, and a log written before (a 32-byte hash a record) migrates, keeps
verifying and names a bad record on either side of the change."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from audit_files import sql

from xdb import XDB, TimestepRow, verify_audit
from xdb.audit.chain import RECORD_COLUMNS, chain, leaves, short_leaves


def record(xdb: XDB, n: int = 5, text: str = "t") -> None:
    ticks = xdb.next_ticks("s", n)
    xdb.writer.submit([TimestepRow("s", t, "output", "assistant", f"{text}{t}", token_id=t,
                                   concept_activations={"joy": t / 10}) for t in ticks])
    xdb.writer.flush()  # one batch, one checkpoint


@pytest.fixture
def logged(tmp_path: Path) -> Path:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        for _ in range(3):
            record(xdb)
    return data


def test_a_leaf_a_record_and_a_head_a_batch(logged: Path) -> None:
    assert verify_audit(logged).ok
    assert sql(logged, "SELECT count(leaf), count(record_hash), count(prev_hash) FROM audit_records") == [(15, 3, 0)]
    heads = sql(logged, "SELECT seq FROM audit_records WHERE record_hash IS NOT NULL ORDER BY seq")
    assert heads == [(4,), (9,), (14,)]  # the checkpoints' ends, whose heads audit.head anchors
    assert [line.split()[0] for line in (logged / "audit" / "audit.head").read_text().splitlines()] == ["4", "9", "14"]


@pytest.mark.parametrize("statement, seq, what", [
    ("UPDATE audit_records SET leaf = leaf + 1 WHERE seq = 6", 6, "hash mismatch"),  # the stored leaf alone
    ("UPDATE audit_records SET record_hash = NULL WHERE seq = 9", 9, "head is missing"),  # a batch's end removed
    ("UPDATE audit_records SET record_hash = (SELECT record_hash FROM audit_records WHERE seq = 9) WHERE seq = 7",
     7, "hash mismatch"),  # a batch's end added
    ("UPDATE audit_records SET record_hash = '\\x00'::BLOB || record_hash[2:] WHERE seq = 14", 14, "head of its batch"),
])
def test_the_stored_hashes_are_checked_too(logged: Path, statement: str, seq: int, what: str) -> None:
    sql(logged, statement)
    report = verify_audit(logged)
    assert not report.ok and f"seq={seq}" in report.first_bad and what in report.first_bad, report.first_bad


def test_an_edit_that_keeps_its_leaf_is_named_by_its_batch(logged: Path) -> None:
    sql(logged, "UPDATE audit_records SET tick = 99 WHERE seq = 7")
    records = pa.Table.from_pylist(
        [dict(zip(RECORD_COLUMNS, row)) for row in sql(logged, f"SELECT {', '.join(RECORD_COLUMNS)} FROM audit_records "
                                                             "WHERE seq = 7")],
        schema=pa.schema([(c, t) for c, t in zip(RECORD_COLUMNS, _types(logged))]))
    forged = int(short_leaves(leaves(records))[0])  # the leaf rewritten to match: the head still differs
    sql(logged, f"UPDATE audit_records SET leaf = {forged} WHERE seq = 7")
    report = verify_audit(logged)
    assert not report.ok and "seq=9" in report.first_bad and "seq 5..9" in report.first_bad, report.first_bad


def _types(data: Path) -> list[pa.DataType]:
    types = {"BIGINT": pa.int64(), "INTEGER": pa.int32(), "VARCHAR": pa.string(), "TIMESTAMP": pa.timestamp("us"),
             "BLOB": pa.binary(), "INTEGER[10]": pa.list_(pa.int32(), 10), "FLOAT[10]": pa.list_(pa.float32(), 10)}
    kinds = dict(sql(data, "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'audit_records'"))
    return [types[kinds[c]] for c in RECORD_COLUMNS]


def test_a_log_chained_a_record_at_a_time_migrates_and_keeps_verifying(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "x"

    def as_version_5(prev: bytes, records: pa.Table, ends: list[int], k: int = 10,
                     acts: object = None) -> tuple[np.ndarray, list[bytes]]:
        return np.array([None] * records.num_rows, dtype=object), chain(prev, records, k)

    monkeypatch.setattr("xdb.audit.log.stamp", as_version_5)
    with XDB.open(data) as xdb:
        assert xdb.audit is not None
        xdb.audit.activations_apart = False  # activations in the record, as before version 7
        record(xdb, text="old")
        record(xdb, text="old")
    monkeypatch.undo()
    # As version 5 left it: no leaf column, a hash in every record.
    sql(data, "ALTER TABLE audit_records DROP COLUMN hidden_digest")
    sql(data, "DROP TABLE audit_hidden")
    sql(data, "ALTER TABLE audit_records DROP COLUMN activation_root")
    sql(data, "ALTER TABLE audit_records DROP COLUMN activation_leaf")
    sql(data, "DROP TABLE audit_replay")
    sql(data, "ALTER TABLE audit_records DROP COLUMN leaf")
    sql(data, "ALTER TABLE audit_records ALTER COLUMN record_hash SET NOT NULL")
    sql(data, "UPDATE audit_meta SET value = '5' WHERE key = 'schema_version'")
    assert verify_audit(data).ok  # read-only: not migrated
    with XDB.open(data) as xdb:
        record(xdb, text="new")
        record(xdb, text="new")
        assert [r["content"] for r in xdb.audit_records(session_id="s", limit=100)] == \
            [f"old{t}" for t in range(10)] + [f"new{t}" for t in range(10, 20)]
    assert sql(data, "SELECT count(leaf), count(record_hash) FROM audit_records") == [(10, 12)]
    report = verify_audit(data)
    assert report.ok and report.records_checked == 20, report.first_bad
    for seq in (3, 13):
        copy = tmp_path / f"bad{seq}"
        copy.mkdir()
        (copy / "audit").mkdir()
        for f in (data / "audit").iterdir():
            (copy / "audit" / f.name).write_bytes(f.read_bytes())
        sql(copy, f"UPDATE audit_records SET tick = 99 WHERE seq = {seq}")
        report = verify_audit(copy)
        assert not report.ok and f"seq={seq}" in report.first_bad and "hash mismatch" in report.first_bad


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
