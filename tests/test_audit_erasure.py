"""Deleting a session removes its content from the audit log while the chain still verifies: the records
stay, sealed under a key the deletion destroys; verification names the erasure, and a key removed
without a chained deletion is caught as tampering."""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import cli_runner
import duckdb
import pytest

from xdb import XDB, TimestepRow, verify_audit
from xdb.audit.keys import KEYS_FILE

WORD = "xyzzyplughquux"


def record(xdb: XDB, session: str, text: str, n: int = 4) -> None:
    xdb.writer.submit([TimestepRow(session, t, "output", "assistant", f"{text}{t}", token_id=t,
                                   metadata={"note": text}, steering=[{"hush": 1}])
                       for t in xdb.next_ticks(session, n)])
    xdb.writer.flush()


def files_holding(folder: Path, needle: bytes) -> list[str]:
    """The files under `folder` holding `needle`: in their bytes, or (a segment, whose strings DuckDB
    compresses) in any of its rows once read."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and (needle in p.read_bytes() or segment_holds(p, needle.decode())))


def segment_holds(path: Path, text: str) -> bool:
    if path.parent.name != "segments" or path.suffix != ".duckdb":
        return False
    with duckdb.connect(str(path), read_only=True) as conn:  # each row as its text, every column in it
        found = conn.execute("SELECT count(*) FROM timesteps t WHERE contains(t::VARCHAR, ?)", [text]).fetchone()
    return found is not None and found[0] > 0


@pytest.fixture
def deleted(tmp_path: Path) -> Path:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        record(xdb, "victim", WORD)
        record(xdb, "keeper", "kept")
        record(xdb, "victim", WORD)
        assert files_holding(data / "audit", WORD.encode()) == []  # sealed from the first commit
        xdb.delete_session("victim")
        record(xdb, "keeper", "later")
    return data


def test_a_deleted_sessions_content_leaves_the_audit_log_and_the_chain_verifies(deleted: Path) -> None:
    assert files_holding(deleted / "audit", WORD.encode()) == []
    assert b"victim" not in (deleted / "audit" / KEYS_FILE).read_bytes()  # its key's row is gone, bytes and all
    report = verify_audit(deleted)
    assert report.ok, report.first_bad
    [erased] = report.erased
    assert erased.startswith("session 'victim': 8 records erased by policy, by the deletion at record seq=")
    result = cli_runner.ahc("xdb", "verify-audit", "--data-dir", str(deleted))
    assert result.returncode == 0 and f"deleted by policy: {erased}" in result.stdout
    assert stat.S_IMODE((deleted / "audit" / KEYS_FILE).stat().st_mode) == 0o600


def test_the_log_reads_back_in_clear_for_kept_sessions_and_erased_for_deleted_ones(deleted: Path) -> None:
    with XDB.open(deleted) as xdb:
        kept = xdb.audit_records(session_id="keeper")
        gone = xdb.audit_records(session_id="victim", event_type="output")
        [deletion] = [r for r in xdb.audit_records(session_id="victim") if r["event_type"] == "xdb_event"]
    assert [r["content"] for r in kept] == [f"kept{t}" for t in range(4)] + [f"later{t}" for t in range(4, 8)]
    assert kept[1]["token_id"] == 1 and json.loads(kept[0]["metadata"]) == {"note": "kept"}
    assert not any(r["erased"] for r in kept)
    assert len(gone) == 8 and all(r["erased"] and r["content"] is None and r["token_id"] is None for r in gone)
    event = json.loads(deletion["content"])
    assert event["action"] == "delete_session" and len(event["keys_destroyed"]) == 1
    assert event["through_timestep"] >= 0


def test_a_key_removed_without_a_chained_deletion_is_tampering(deleted: Path) -> None:
    with sqlite3.connect(deleted / "audit" / KEYS_FILE) as keys:
        keys.execute("DELETE FROM keys WHERE session_id = 'keeper'")
    report = verify_audit(deleted)
    assert not report.ok
    assert "session 'keeper'" in report.first_bad and "tampering" in report.first_bad
    result = cli_runner.ahc("xdb", "verify-audit", "--data-dir", str(deleted))
    assert result.returncode == 1 and "tampering" in result.stderr


def test_a_forged_deletion_record_is_caught(deleted: Path) -> None:
    """Rewriting the deletion to name the kept session's key breaks the chain at that record."""
    con = duckdb.connect(str(deleted / "audit" / "audit.duckdb"))
    con.execute("UPDATE audit_records SET content = replace(content, '\"keys_destroyed\":[', "
                "'\"keys_destroyed\":[2,') WHERE event_type = 'xdb_event'")
    con.close()
    report = verify_audit(deleted)
    assert not report.ok and "hash mismatch" in report.first_bad


def test_a_missing_keys_file_fails_verification(deleted: Path) -> None:
    (deleted / "audit" / KEYS_FILE).unlink()
    report = verify_audit(deleted)
    assert not report.ok and "audit.keys is missing" in report.first_bad


def test_a_deletion_a_crash_cut_short_is_carried_through_at_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        record(xdb, "victim", WORD)
    keys = (data / "audit" / KEYS_FILE).read_bytes()
    with XDB.open(data) as xdb:
        xdb.delete_session("victim")
    (data / "audit" / KEYS_FILE).write_bytes(keys)  # as if the process died between the event and the key's end
    with XDB.open(data) as xdb:
        assert xdb.audit_records(session_id="victim", event_type="output")[0]["erased"]
    assert b"victim" not in (data / "audit" / KEYS_FILE).read_bytes()
    assert verify_audit(data).ok


def test_a_session_that_comes_back_after_deletion_gets_a_new_key(tmp_path: Path) -> None:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        record(xdb, "s", WORD)
        xdb.delete_session("s")
        record(xdb, "s", "again")
        rows = xdb.audit_records(session_id="s", event_type="output")
    assert [r["content"] for r in rows] == [None] * 4 + [f"again{t}" for t in range(4, 8)]
    report = verify_audit(data)
    assert report.ok and len(report.erased) == 1


def test_after_a_vacuum_the_deleted_text_is_in_no_file_under_the_data_dir(deleted: Path) -> None:
    """DuckDB keeps a deleted row in its row group's blocks; the vacuum rewrites the experience file."""
    with XDB.open(deleted) as xdb:
        before = xdb.recall({"session_id": "keeper"}, owner="*")
    assert files_holding(deleted, WORD.encode()) == ["experience.duckdb"]
    result = cli_runner.ahc("xdb", "vacuum", "--data-dir", str(deleted))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["bytes_after"] > 0
    assert files_holding(deleted, WORD.encode()) == []
    with XDB.open(deleted) as xdb:
        assert xdb.recall({"session_id": "keeper"}, owner="*") == before
        record(xdb, "keeper", "after")  # the rewritten file takes new rows, ids going on
    assert verify_audit(deleted).ok


@pytest.mark.process
def test_vacuum_refuses_a_missing_or_busy_data_dir(tmp_path: Path) -> None:
    result = cli_runner.ahc("xdb", "vacuum", "--data-dir", str(tmp_path))
    assert result.returncode == 1 and "holds no experience.duckdb" in result.stderr
    with XDB.open(tmp_path / "x"):  # a server holds it: DuckDB's lock is per process
        busy = subprocess.run([str(Path(sys.executable).with_name("ahc")), "xdb", "vacuum", "--data-dir",
                               str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert busy.returncode == 1 and "in use" in busy.stderr and len(busy.stderr.strip().splitlines()) == 1


def test_a_session_deleted_over_http_leaves_no_file_once_vacuumed(config, vllm_config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """As a user does it: a chat turn with a unique word, `DELETE /v1/context/sessions/{id}`, the server
    stopped; the audit log is clean at once, the experience file after `ahc xdb vacuum`."""
    from fake_app import serving

    with serving(config, vllm_config, tmp_path) as (client, _):
        said = client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": f"The code is {WORD}."}],
            "context": {"session_id": "lab", "identity": "You are terse."}})
        assert said.status_code == 200, said.text
        assert client.delete("/v1/context/sessions/lab").status_code == 200
    data = tmp_path / "xdb"
    assert files_holding(data / "audit", WORD.encode()) == []
    assert cli_runner.ahc("xdb", "vacuum", "--data-dir", str(data)).returncode == 0
    assert files_holding(data, WORD.encode()) == []
    report = verify_audit(data)
    assert report.ok and report.erased and report.erased[0].startswith("session 'lab': ")


def test_sealing_round_trips_a_mixed_batch_and_leaves_events_in_clear() -> None:
    """A batch of two sessions and a system event: the sessions' payloads come back exactly under their
    keys, the event is untouched, and a missing key opens nothing."""
    import numpy as np
    import pyarrow as pa

    from xdb.audit.seal import open_sealed, seal
    from xdb.concepts import ConceptIndex
    from xdb.rows import rows_to_arrow

    rows = [TimestepRow("a", 0, "output", "assistant", "héllo", token_id=7, metadata={"k": 1}),
            TimestepRow("", -1, "xdb_event", "system", '{"action":"x"}'),
            TimestepRow("b", 0, "input", "user", "x" * 40, steering=[{"v": 2}]),
            TimestepRow("a", 1, "output", "assistant", "", token_id=None)]
    table, _ = rows_to_arrow(rows, 0, ConceptIndex([]))
    table = table.rename_columns(["timestep_id" if c == "id" else c for c in table.column_names])
    table = table.append_column("seq", pa.array(np.arange(10, 14)))
    keys = {"a": (3, bytes(range(32))), "b": (5, bytes(range(1, 33)))}
    sealed = seal(table, lambda names: {n: keys[n] for n in names}, "xdb_event")
    assert sealed.column("key_id").to_pylist() == [3, None, 5, 3]
    assert sealed.column("content").to_pylist() == [None, '{"action":"x"}', None, None]
    assert b"h\xc3\xa9llo" not in sealed.column("sealed").to_pylist()[0]
    opened = open_sealed(np.arange(10, 14), np.array([3, -1, 5, 3]), sealed.column("sealed").combine_chunks(),
                         {3: keys["a"][1], 5: keys["b"][1]})
    assert opened == [(7, "héllo", '{"k":1}', None), None, (None, "x" * 40, None, '[{"v":2}]'), (None, "", None, None)]
    partial = open_sealed(np.arange(10, 14), np.array([3, -1, 5, 3]), sealed.column("sealed").combine_chunks(),
                          {5: keys["b"][1]})
    assert partial[0] is None and partial[2] == opened[2]
