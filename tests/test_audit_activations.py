"""Activations stored once (audit schema version 7): the log commits them by hash and keeps them only until
the experience file holds them; a change to them in the experience file is found and named, a change to
the log's hashes breaks its chain, and a crash between the two commits still replays them, checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_files import sql
from cli_runner import ahc

from xdb import XDB, TimestepRow, verify_audit
from xdb.audit.activations import activation_leaves, short


def record(xdb: XDB, session: str = "s", n: int = 6) -> None:
    ticks = xdb.next_ticks(session, n)
    xdb.writer.submit([TimestepRow(session, ticks[i], "output", "assistant", f"w{i}",
                                   concept_activations={"joy": i / 8, "fear": 1 - i / 8}) for i in range(n)])
    xdb.writer.flush()


def activations(xdb: XDB) -> list[tuple[int, list[float] | None]]:
    return xdb.conn.execute("SELECT id, concept_values[1:2] FROM timesteps ORDER BY id").fetchall()


def change(xdb: XDB, timestep_id: int) -> None:
    """An edit of one row's first activation in the experience file."""
    xdb.conn.execute("UPDATE timesteps_hot SET concept_values = [0.5] || concept_values[2:] WHERE id = ?",
                     [timestep_id])


@pytest.fixture
def logged(tmp_path: Path) -> Path:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        record(xdb)
        record(xdb, "t")
    return data


def test_the_log_holds_activations_as_hashes_alone(logged: Path) -> None:
    assert sql(logged, "SELECT count(*), count(concept_ids), count(concept_values), count(activation_leaf), "
                       "count(activation_root) FROM audit_records WHERE event_type = 'output'") == [(12, 0, 0, 12, 2)]
    assert sql(logged, "SELECT count(*) FROM audit_replay") == [(0,)]  # the experience file holds them all
    report = verify_audit(logged)
    assert report.ok and report.records_checked == 12, report.first_bad
    with XDB.open(logged) as xdb:
        assert xdb.verify_audit().ok
        assert [v for _, v in activations(xdb)][:2] == [[0.0, 1.0], [0.125, 0.875]]


def test_an_activation_changed_in_the_experience_file_is_named(logged: Path) -> None:
    with XDB.open(logged) as xdb:
        change(xdb, 3)
        report = xdb.verify_audit()
    assert not report.ok
    assert report.first_bad is not None and report.first_bad.startswith("timestep id=3 (audit record seq=3)")
    assert verify_audit(logged).ok  # the log itself is whole


def test_a_change_that_keeps_the_short_leaf_is_caught_by_the_root(logged: Path) -> None:
    with XDB.open(logged) as xdb:
        change(xdb, 8)
        assert xdb.audit is not None
        with xdb.audit.conn.cursor() as cur:  # the forger rewrites the record's short leaf to match
            row = xdb.conn.execute("SELECT concept_ids, concept_values FROM timesteps WHERE id = 8").to_arrow_table()
            cur.execute("UPDATE audit_records SET activation_leaf = ? WHERE timestep_id = 8",
                        [int(short(activation_leaves(row, 10))[0])])
        report = xdb.verify_audit()
    assert not report.ok and report.first_bad is not None
    assert report.first_bad.startswith("audit records seq 6..11: the activations"), report.first_bad


def test_a_rewritten_root_breaks_the_chain(logged: Path) -> None:
    sql(logged, "UPDATE audit_records SET activation_root = sha256('forged')::BLOB WHERE seq = 5")
    report = verify_audit(logged)
    assert not report.ok and report.first_bad is not None and "seq=5" in report.first_bad
    assert "the head of its batch (seq 0..5) differs" in report.first_bad


def crashed(data: Path) -> None:
    """Rows the log committed whose experience commit a crash lost: the log still holds their activations."""
    with XDB.open(data) as xdb:
        assert xdb.audit is not None
        xdb.audit.experience_holds = lambda timestep_id: None  # type: ignore[method-assign]
        record(xdb)
        xdb.conn.execute("DELETE FROM timesteps_hot WHERE id >= 2")
        xdb.conn.execute("UPDATE xdb_meta SET value = '1' WHERE key = 'last_timestep_id'")


def test_a_crash_replays_the_activations_the_log_kept(tmp_path: Path) -> None:
    data = tmp_path / "x"
    crashed(data)
    assert sql(data, "SELECT count(*) FROM audit_replay") == [(6,)]
    with XDB.open(data) as xdb:
        got = activations(xdb)
        assert [i for i, _ in got] == list(range(6))
        assert got[5][1] == [0.625, 0.375]
        assert xdb.verify_audit().ok
    assert sql(data, "SELECT count(*) FROM audit_replay") == [(0,)]


def test_a_changed_replay_row_is_refused_and_nothing_replayed(tmp_path: Path) -> None:
    data = tmp_path / "x"
    crashed(data)
    sql(data, "UPDATE audit_replay SET concept_values = [0.99] || concept_values[2:] WHERE timestep_id = 4")
    with pytest.raises(ValueError, match=r"record seq=4 do not hash to its leaf"):
        XDB.open(data)
    assert sql(data, "SELECT count(*) FROM audit_replay") == [(6,)]  # kept for whoever looks


def test_the_cli_checks_the_experience_file_when_it_can_open_it(logged: Path) -> None:
    result = ahc("xdb", "verify-audit", "--data-dir", str(logged))
    assert result.returncode == 0 and "activations in the experience file match the audit log" in result.stdout
    with XDB.open(logged) as xdb:
        change(xdb, 2)
    result = ahc("xdb", "verify-audit", "--data-dir", str(logged))
    assert result.returncode == 1 and result.stderr.strip().endswith(
        "timestep id=2 (audit record seq=2): its activations in the experience file differ from those the audit "
        "log committed (edited)"), result.stderr
