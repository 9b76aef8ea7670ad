"""The XDB bench's generated load is a valid XDB: rows, ticks, concepts and tags that recall reads as
if the writer had written them (the bench itself runs at 10M rows in `make bench`)."""

from __future__ import annotations

from pathlib import Path

from cli_runner import ahc

from bench.xdb import SESSIONS, TURN, generate_rows
from xdb import XDB, TimestepRow
from xdb.owner import EVERY


def test_generated_rows_are_an_xdb_the_writer_can_continue(tmp_path: Path) -> None:
    n = TURN * SESSIONS * 10
    generate_rows(tmp_path / "x", n)
    with XDB.open(tmp_path / "x") as xdb:
        s3 = xdb.recall({"session_id": "s3", "limit": 10_000}, owner=EVERY)
        assert len(s3) == n // SESSIONS and [r["tick"] for r in s3] == list(range(n // SESSIONS))
        assert len(s3[0]["concept_activations"]) == 10
        assert xdb.recall({"concept": "concept-5", "min_activation": 0.0, "limit": 5}, owner=EVERY)
        older = xdb.recall({"time_to": s3[5]["created_at"], "session_id": "s3"}, owner=EVERY)
        assert [r["tick"] for r in older] == list(range(6))
        xdb.writer.submit([TimestepRow("s3", t, "output", content="next") for t in xdb.next_ticks("s3", 1)])
        xdb.writer.flush()
        last = xdb.recall({"session_id": "s3", "after_id": n - 1}, owner=EVERY)
        assert [(r["id"], r["tick"]) for r in last] == [(n, n // SESSIONS)]


def test_the_cli_recalls_by_time_and_pages_by_id(tmp_path: Path) -> None:
    import json

    generate_rows(tmp_path / "x", TURN * SESSIONS)

    def recall(*args: str) -> list[dict]:
        # In this process (cli_runner): the same exit codes and output, without four cold starts.
        done = ahc("xdb", "recall", "--data-dir", str(tmp_path / "x"), "--session-id", "s1", *args)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    first = recall("--limit", "10")
    assert [r["tick"] for r in recall("--after-id", str(first[-1]["id"]), "--limit", "3")] == [10, 11, 12]
    assert [r["tick"] for r in recall("--time-to", first[2]["created_at"])] == [0, 1, 2]
    bad = ahc("xdb", "recall", "--data-dir", str(tmp_path / "x"), "--time-from", "soon")
    assert bad.returncode == 1 and "time_from" in bad.stderr
