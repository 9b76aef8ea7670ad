"""A bud's life: a candidate collects examples, becomes ready only with xdb.bud_min_examples of them, is
submitted with its evidence, and is grafted or rejected when the submission is resolved; any other move is
a Conflict naming the ones allowed, and each move is chained in the audit log. Buds stored under the names
used before (collecting, training, promoted, abandoned) read as their new ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest

from core.errors import Conflict
from xdb import XDB, TimestepRow
from xdb.owner import EVERY
from xdb.schema import EXPERIENCE_FILE, MIGRATIONS
from xdb.storage.fidelity import resolve_submission, submit_evidence
from xdb.tags import list_buds, set_bud_status


def recorded(xdb: XDB, n: int = 6) -> None:
    ticks = xdb.next_ticks("s", n)
    xdb.writer.submit([TimestepRow("s", t, "output", "assistant", f"w{t}") for t in ticks])
    xdb.writer.flush()


def status(xdb: XDB, name: str) -> str:
    return next(b["bud_status"] for b in xdb.read(list_buds) if b["name"] == name)


def test_a_bud_lives_candidate_ready_submitted_grafted(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        recorded(xdb)
        for tick in (0, 1):
            xdb.tag("moves-right", tag_type="bud", session_id="s", tick=tick, owner=EVERY)
        assert status(xdb, "moves-right") == "candidate"
        with pytest.raises(Conflict, match=r"has 2 examples; ready needs 3 \(xdb.bud_min_examples\)"):
            xdb.write(set_bud_status, "moves-right", "ready", 3)
        with pytest.raises(Conflict, match="is candidate: it may become ready, rejected, not submitted"):
            xdb.write(set_bud_status, "moves-right", "submitted", 3)
        with pytest.raises(Conflict, match="evidence is submitted for a ready bud"):
            xdb.write(submit_evidence, "moves-right", "sub-1")
        xdb.tag("moves-right", tag_type="bud", session_id="s", tick=2, owner=EVERY)
        assert xdb.write(set_bud_status, "moves-right", "ready", 3)["bud_status"] == "ready"
        assert len(xdb.write(submit_evidence, "moves-right", "sub-1")) == 3
        assert status(xdb, "moves-right") == "submitted"
        with pytest.raises(Conflict, match="is submitted: it may become none"):
            xdb.write(set_bud_status, "moves-right", "candidate", 3)
        xdb.write(resolve_submission, "sub-1", accepted=True)
        assert status(xdb, "moves-right") == "grafted"
        moves = [json.loads(r["content"])["action"] for r in xdb.audit_records(event_type="xdb_event", limit=100)]
        assert moves.count("rewrite_tag") == 1 and "submit_evidence" in moves and "resolve_submission" in moves


def test_a_rejected_bud_may_start_again(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        recorded(xdb)
        for name in ("blinks", "other"):
            xdb.tag(name, tag_type="bud", session_id="s", tick=0, owner=EVERY)
            xdb.write(set_bud_status, name, "ready", 1)
        xdb.write(submit_evidence, "blinks", "sub-2")
        with pytest.raises(Conflict, match="tag 'blinks' is submitted: evidence is submitted for a ready bud"):
            xdb.write(submit_evidence, "blinks", "sub-3")
        with pytest.raises(Conflict, match="submission 'sub-2' exists already"):
            xdb.write(submit_evidence, "other", "sub-2")
        xdb.write(resolve_submission, "sub-2", accepted=False)
        assert status(xdb, "blinks") == "rejected"
        assert xdb.write(set_bud_status, "blinks", "candidate", 1)["bud_status"] == "candidate"


def undo_migrations_after(con: duckdb.DuckDBPyConnection, version: int) -> None:
    """What the migrations after `version` created taken away again, newest first: the file as that version
    left it (its data changes aside)."""
    for _, statements in reversed([m for m in MIGRATIONS if m[0] > version]):
        for sql in reversed(statements):
            if found := re.match(r"\s*CREATE (TABLE|SEQUENCE) (\w+)", sql):
                con.execute(f"DROP {found[1]} {found[2]}")
            elif found := re.match(r"\s*ALTER TABLE (\w+) ADD COLUMN (\w+)", sql):
                con.execute(f"ALTER TABLE {found[1]} DROP COLUMN {found[2]}")


def test_buds_stored_before_read_as_their_new_statuses(tmp_path: Path) -> None:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        recorded(xdb)
        for name in ("a", "b", "c", "d"):
            xdb.tag(name, tag_type="bud", session_id="s", tick=0, owner=EVERY)
    con = duckdb.connect(str(data / EXPERIENCE_FILE))
    for name, old in (("a", "collecting"), ("b", "training"), ("c", "promoted"), ("d", "abandoned")):
        con.execute("UPDATE tags SET bud_status = ? WHERE name = ?", [old, name])
    undo_migrations_after(con, 8)
    con.execute("UPDATE xdb_meta SET value = '8' WHERE key = 'schema_version'")
    con.close()
    with XDB.open(data) as xdb:
        assert {b["name"]: b["bud_status"] for b in xdb.read(list_buds)} == {
            "a": "candidate", "b": "submitted", "c": "grafted", "d": "rejected"}
