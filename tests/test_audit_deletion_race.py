"""A session deleted while it records, over and over under another tenant's load, leaves an audit log that
verifies whole, and every row of it still in the experience file opens in the log. The audit's files survive
a torn tail, and its keys cost what a deletion touches, not what the log holds."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import duckdb

from core.config import XDBConfig
from core.errors import NotFound
from xdb import XDB, TimestepRow, verify_audit
from xdb.audit.keys import KEYS_FILE, SessionKeys

FAST = XDBConfig(max_latency_s=0.005)


def keep_recording(xdb: XDB, session: str, stop: threading.Event, prefix: str) -> None:
    n = 0
    while not stop.is_set():
        [tick] = xdb.next_ticks(session, 1)
        xdb.writer.submit([TimestepRow(session, tick, "output", "assistant", f"{prefix}{n}", token_id=n)])
        n += 1
        time.sleep(0.0005)


def experience_texts(data: Path, session: str) -> set[str]:
    con = duckdb.connect(str(data / "experience.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT content FROM timesteps WHERE session_id = ?", [session]).fetchall()
        return {row[0] for row in rows}
    finally:
        con.close()


def test_deleting_a_session_while_it_streams_never_reads_as_tampering(tmp_path: Path) -> None:
    data = tmp_path / "x"
    stop = threading.Event()
    deletions = 0
    with XDB.open(data, FAST) as xdb:
        streams = [threading.Thread(target=keep_recording, args=(xdb, s, stop, p))
                   for s, p in (("streamer", "mine-"), ("other", "theirs-"))]
        for thread in streams:
            thread.start()
        try:
            for _ in range(60):
                time.sleep(0.01)
                try:
                    xdb.delete_session("streamer")
                    deletions += 1
                except NotFound:
                    continue
        finally:
            stop.set()
            for thread in streams:
                thread.join()
        xdb.writer.flush()
        report = xdb.verify_audit()
        opened = {r["content"] for r in _all_records(xdb, "streamer") if not r["erased"]}
        assert report.ok, report.first_bad
    assert deletions >= 10  # most of the 60 tries find rows recorded since the last deletion
    remaining = experience_texts(data, "streamer")
    assert remaining <= opened, sorted(remaining - opened)[:5]  # every kept row opens in the log
    assert experience_texts(data, "other")  # the other tenant's rows are all kept
    after_restart = verify_audit(data)
    assert after_restart.ok, after_restart.first_bad
    assert len(after_restart.erased) >= 1


def _all_records(xdb: XDB, session: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    after = -1
    while page := xdb.audit_records(session_id=session, event_type="output", after_seq=after, limit=1000):
        out += page
        after = int(page[-1]["seq"])
    return out


def test_a_deletion_cut_short_before_the_experience_file_committed_is_finished_at_start(tmp_path: Path) -> None:
    """The deletion's record is chained first; a crash before the experience file's commit leaves the rows
    and the keys: the next start deletes the rows, then destroys the keys, and the log verifies."""
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        xdb.writer.submit([TimestepRow("victim", t, "output", "assistant", f"secret{t}")
                           for t in xdb.next_ticks("victim", 3)])
        xdb.writer.flush()
        retired = xdb.audit.retire_keys("victim")  # type: ignore[union-attr]
        through = xdb.audit.last_timestep_before(retired)  # type: ignore[union-attr]
        xdb.audit_event("delete_session", {"session_id": "victim", "reason": "request",
                                           "keys_destroyed": retired.keys, "through_timestep": through})
        # ... and the process dies here: the experience file still has the rows, audit.keys the key.
    assert len(experience_texts(data, "victim")) == 3
    with XDB.open(data) as xdb:
        assert all(r["erased"] for r in xdb.audit_records(session_id="victim", event_type="output"))
    assert experience_texts(data, "victim") == set()
    assert b"victim" not in (data / "audit" / KEYS_FILE).read_bytes()
    assert verify_audit(data).ok


def test_a_torn_head_line_is_cut_logged_and_chained(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        xdb.writer.submit([TimestepRow("s", 0, "output", "assistant", "a")])
        xdb.writer.flush()
    head = data / "audit" / "audit.head"
    with head.open("a") as f:
        f.write("41 3fa9")  # a crash between the line's write and its fsync
    assert verify_audit(data).ok  # a line not yet ended is not an anchor
    with caplog.at_level("WARNING", logger="ahc.xdb.audit"), XDB.open(data) as xdb:
        events = [json.loads(r["content"]) for r in xdb.audit_records(event_type="xdb_event")]
    assert "torn line" in caplog.text
    assert events[-1]["action"] == "audit_head_repaired" and events[-1]["dropped"] == "41 3fa9"
    assert head.read_text().endswith("\n") and "41 3fa9" not in head.read_text()
    assert verify_audit(data).ok


def test_a_text_keys_file_is_converted_and_a_torn_last_key_dropped(tmp_path: Path) -> None:
    """Logs from before kept the keys as text lines; a start converts them, and a line a crash cut short
    (no record was sealed under it: a key is fsynced before its records commit) is dropped and chained."""
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        xdb.writer.submit([TimestepRow("s", 0, "output", "assistant", "kept words")])
        xdb.writer.flush()
    keys_file = data / "audit" / KEYS_FILE
    with sqlite3.connect(keys_file) as db:
        rows = db.execute("SELECT id, key, session_id FROM keys ORDER BY id").fetchall()
    text = "next 7\n" + "".join(f"{k} {key.hex()} {json.dumps(s)}\n" for k, key, s in rows) + "6 00ab"
    for suffix in ("-wal", "-shm"):
        keys_file.with_name(keys_file.name + suffix).unlink(missing_ok=True)
    keys_file.write_text(text)
    with XDB.open(data) as xdb:
        assert [r["content"] for r in xdb.audit_records(session_id="s", event_type="output")] == ["kept words"]
        events = [json.loads(r["content"]) for r in xdb.audit_records(event_type="xdb_event")]
        xdb.writer.submit([TimestepRow("t", 0, "output", "assistant", "new")])
        xdb.writer.flush()
        new_key = xdb.audit.keys.session_keys("t")  # type: ignore[union-attr]
    assert keys_file.read_bytes().startswith(b"SQLite format 3")
    assert events[-1] == {"action": "audit_keys_repaired", "file": KEYS_FILE, "dropped_bytes": 6}
    assert new_key and new_key[0] >= 7  # a destroyed key's id is never given again
    assert verify_audit(data).ok


def _io(field: str) -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        name, value = line.split(":")
        if name == field:
            return int(value)
    raise AssertionError(field)


def test_opening_and_destroying_keys_touch_what_they_need_not_the_whole_file(tmp_path: Path) -> None:
    """50,000 sessions' keys (~4 MB): opening reads a few pages, a deletion writes a few pages."""
    path = tmp_path / KEYS_FILE
    keys = SessionKeys(path)
    for start in range(0, 50_000, 5_000):
        keys.keys_for([f"session-{n}" for n in range(start, start + 5_000)])
    keys.close()
    assert path.stat().st_size > 3_000_000
    read_before = _io("rchar")
    keys = SessionKeys(path)
    assert _io("rchar") - read_before < 200_000
    doomed = keys.retire("session-25000")
    written_before = _io("wchar")
    keys.destroy(doomed)
    assert _io("wchar") - written_before < 200_000
    assert keys.session_keys("session-25000") == [] and keys.count() == 49_999
    assert keys.keys_for(["session-3"])["session-3"][0] == 4  # found by its index, not a scan held in memory
    keys.close()
