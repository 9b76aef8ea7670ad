"""The audit log's smaller layout (schema version 5): a batch's records of one session sealed as one blob
in its first record. The chain still covers every record and names the first bad one, a deleted session's
blobs are erased with its key, and a log written before (one sealed payload a record) still opens,
verifies and reads back, its new records in the new layout from the marked seq on."""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from audit_files import sql

from xdb import XDB, TimestepRow, verify_audit
from xdb.audit.log import AuditLog
from xdb.audit.seal import _crypt, open_blobs, seal_batch


def record(xdb: XDB, sessions: list[str], n: int = 4, text: str = "w") -> None:
    """n rows of each session, interleaved, in one batch."""
    ticks = {s: xdb.next_ticks(s, n) for s in sessions}
    xdb.writer.submit([TimestepRow(s, ticks[s][i], "output", "assistant", f"{text}{s}{i}", token_id=i,
                                   metadata={"i": i} if i % 2 else None, concept_activations={"joy": i / 10})
                       for i in range(n) for s in sessions])
    xdb.writer.flush()



@pytest.fixture
def logged(tmp_path: Path) -> Path:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        record(xdb, ["a", "b"])
        record(xdb, ["a", "b", "c"], text="v")
    return data


def test_one_blob_a_session_a_batch_verifies_and_reads_back(logged: Path) -> None:
    assert verify_audit(logged).ok
    # 2 sessions in the first batch, 3 in the second: 5 blobs for 20 records
    assert sql(logged, "SELECT count(*), count(sealed), count(key_id), count(content) FROM audit_records") == \
        [(20, 5, 20, 0)]
    assert sql(logged, "SELECT value FROM audit_meta WHERE key = 'batch_sealed_from'") == [("0",)]
    with XDB.open(logged) as xdb:
        rows = xdb.audit_records(session_id="b", limit=100)
        assert [r["content"] for r in rows] == [f"wb{i}" for i in range(4)] + [f"vb{i}" for i in range(4)]
        assert [r["token_id"] for r in rows] == [0, 1, 2, 3] * 2
        assert rows[1]["metadata"] == '{"i":1}' and rows[0]["metadata"] is None
        # a page that starts after the blob's record still opens (its blob is fetched)
        later = xdb.audit_records(session_id="c", after_seq=rows[-1]["seq"] - 2, limit=100)
        assert [r["content"] for r in later][-1] == "vc3"


@pytest.mark.parametrize("statement, target", [
    ("UPDATE audit_records SET sealed = sealed || '\\x00'::BLOB WHERE sealed IS NOT NULL AND seq > 8", "blob"),
    ("UPDATE audit_records SET tick = tick + 100 WHERE seq = 13", "record"),
    ("UPDATE audit_records SET key_id = NULL WHERE seq = 14", "record"),
])
def test_a_tampered_record_is_named(logged: Path, statement: str, target: str) -> None:
    seq = 13 if target == "record" else sql(logged, "SELECT min(seq) FROM audit_records WHERE sealed IS NOT NULL "
                                                    "AND seq > 8")[0][0]
    seq = 14 if "seq = 14" in statement else seq
    sql(logged, statement)
    report = verify_audit(logged)
    assert not report.ok and report.first_bad is not None
    assert report.first_bad.startswith(f"audit record seq={seq} ")
    assert "hash mismatch" in report.first_bad


def test_a_deleted_sessions_blobs_are_erased_and_the_chain_verifies(logged: Path) -> None:
    with XDB.open(logged) as xdb:
        xdb.delete_session("b")
        record(xdb, ["a"], text="after")
        assert all(r["erased"] for r in xdb.audit_records(session_id="b", limit=100) if r["event_type"] != "xdb_event")
        assert [r["content"] for r in xdb.audit_records(session_id="a", limit=100)][-1] == "aftera3"
    report = verify_audit(logged)
    assert report.ok, report.first_bad
    [erased] = report.erased
    assert erased.startswith("session 'b': 8 records erased by policy")
    assert not any(b"wb1" in p.read_bytes() for p in (logged / "audit").iterdir())


def test_a_log_written_a_record_a_payload_migrates_and_keeps_verifying(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "x"
    original = AuditLog.__init__

    def as_version_4(self: AuditLog, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        self.batch_sealed_from = None  # seals as version 4 did

    monkeypatch.setattr(AuditLog, "__init__", as_version_4)
    with XDB.open(data) as xdb:
        record(xdb, ["a", "b"], text="old")
    monkeypatch.setattr(AuditLog, "__init__", original)
    sql(data, "DELETE FROM audit_meta WHERE key = 'batch_sealed_from'")
    sql(data, "UPDATE audit_meta SET value = '4' WHERE key = 'schema_version'")
    assert sql(data, "SELECT count(sealed) FROM audit_records") == [(8,)]  # one payload a record
    assert verify_audit(data).ok
    with XDB.open(data) as xdb:
        record(xdb, ["a", "b"], text="new")
        rows = xdb.audit_records(session_id="a", limit=100)
        assert [r["content"] for r in rows] == [f"olda{i}" for i in range(4)] + [f"newa{i}" for i in range(4)]
        xdb.delete_session("b")
    assert sql(data, "SELECT value FROM audit_meta WHERE key = 'batch_sealed_from'") == [("8",)]
    assert sql(data, "SELECT count(sealed) FROM audit_records WHERE seq >= 8") == [(2,)]
    report = verify_audit(data)
    assert report.ok, report.first_bad
    assert report.erased and report.erased[0].startswith("session 'b': 8 records erased by policy")


def test_a_crash_replays_batch_sealed_rows_from_the_log(tmp_path: Path) -> None:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        record(xdb, ["a", "b"])
        # as if the experience file lost its tail: the audit holds rows it never committed
        xdb.conn.execute("DELETE FROM timesteps_hot WHERE id >= 3")
        xdb.conn.execute("UPDATE xdb_meta SET value = '2' WHERE key = 'last_timestep_id'")
    with XDB.open(data) as xdb:
        got = xdb.conn.execute("SELECT content FROM timesteps WHERE session_id = 'b' ORDER BY tick").fetchall()
        assert [c for (c,) in got] == [f"wb{i}" for i in range(4)]


def test_a_batch_blob_opens_in_either_layout() -> None:
    """The byte-plane layout `seal_batch` writes, and the zlib one of logs written before it."""
    key = bytes(range(32))
    records = pa.table({"seq": pa.array([10, 11, 13, 14], pa.int64()), "session_id": ["s", "s", "t", "s"],
                        "event_type": ["output"] * 4, "token_id": pa.array([5, None, 7, 31999], pa.int32()),
                        "content": ["é", "", "x", None], "metadata": [None, '{"a":1}', None, None],
                        "steering": pa.nulls(4, pa.string())})
    sealed = seal_batch(records, lambda names: {n: (1 if n == "s" else 2, key) for n in names}, "xdb_event")
    blobs = sealed.column("sealed").combine_chunks()
    assert blobs.is_valid().to_pylist() == [True, False, True, False]  # one blob a session
    want = {10: (5, "é", None, None), 11: (None, "", '{"a":1}', None), 14: (31999, None, None, None)}
    opened = open_blobs(np.array([10, 13]), np.array([1, 2]), blobs.filter(blobs.is_valid()), {1: key})
    assert opened == want  # the other session's key is gone: its blob stays shut
    # The zlib layout: offsets, token ids, then each field's lengths (-1: null) and bytes.
    offsets, tokens, texts = [0, 1, 4], [5, -1, 31999], [["é", "", None], [None, '{"a":1}', None], [None] * 3]
    plain = struct.pack("<I", 3) + np.array(offsets, "<i4").tobytes() + np.array(tokens, "<i4").tobytes()
    for values in texts:
        plain += np.array([-1 if v is None else len(v.encode()) for v in values], "<i4").tobytes()
        plain += b"".join(v.encode() for v in values if v is not None)
    old = _crypt(pa.array([zlib.compress(plain, 6)], pa.large_binary()), np.array([10]), np.array([1]), {1: key},
                 np.array([True]))
    assert open_blobs(np.array([10]), np.array([1]), old, {1: key}) == want


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
