"""`xdb.backend: ducklake`: replicas shipping to one shared DuckLake, on a real PostgreSQL catalog
(LocalPostgres), real DuckLake files and real XDB data dirs: recall across replicas, exactly-once shipping,
sessions resumed and deleted across replicas, a lake that goes away, and the config."""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest
from lake_replica import close_observers, config, lake_sql, record  # noqa: F401 - close_observers: a fixture
from postgres import require_postgres

from core.config import LakeConfig, XDBConfig
from core.errors import NotFound
from server.cluster.catalog import LocalPostgres
from server.cluster.server_process import free_port
from xdb import XDB, RemoteXDB, TimestepRow, TokenBatch
from xdb.lake.lake import LakeUnavailable
from xdb.lake.purge import lost_a_race
from xdb.lake.schema import attach_lake
from xdb.owner import EVERY
from xdb.runs import log_interaction, purge_run
from xdb.session_state import state_versions

ROOT = Path(__file__).resolve().parents[1]


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.process
def test_two_replicas_ship_and_recall_sees_both(lake: LakeConfig, tmp_path: Path) -> None:
    with XDB.open(tmp_path / "a", config(lake, "A")) as a, XDB.open(tmp_path / "b", config(lake, "B")) as b:
        record(a, "sa", 50, "alpha")
        record(b, "sb", 30, "beta")
        b.writer.submit([TimestepRow("sb", b.next_ticks("sb")[0], "input", "user", "hello from b")])
        b.writer.flush()
        # Nobody asks: the shippers' threads bring both replicas' rows within their interval.
        wait_for(lambda: len(a.lake_recall(limit=1000, owner=EVERY)) == 81)

        rows = a.lake_recall(session_id="sb", limit=1000, owner=EVERY)
        assert {r["replica"] for r in rows} == {"B"} and len(rows) == 31
        assert [r["tick"] for r in rows] == list(range(31))
        hello = b.lake_recall(text="hello", owner=EVERY)
        assert [(r["replica"], r["content"], r["event_type"], r["tick"]) for r in hello] == [
            ("B", "hello from b", "input", 30)]
        ranged = a.lake_recall(session_id="sa", tick_from=10, tick_to=12, owner=EVERY)
        assert [(r["replica"], r["tick"], r["content"]) for r in ranged] == [("A", t, f"alpha{t}")
                                                                             for t in (10, 11, 12)]
        assert len(a.lake_recall(event_types=["output"], limit=1000, owner=EVERY)) == 80
        assert len(a.lake_recall(limit=7, owner=EVERY)) == 7
        # Each replica's ids are its own: (replica, id) names a row.
        ids = lake_sql(lake, "SELECT replica, count(*), count(DISTINCT id), min(id), max(id) FROM lake.timesteps "
                             "GROUP BY 1 ORDER BY 1")
        assert ids == [("A", 50, 50, 0, 49), ("B", 31, 31, 0, 30)]
        status = a.lake_status()
        assert status is not None and status["replica"] == "A" and status["last_error"] is None
        assert a.state()["lake"]["watermarks"]["timesteps"] == 49


@pytest.mark.process
def test_concepts_and_tags_across_replicas(lake: LakeConfig, tmp_path: Path) -> None:
    high_low = np.array([[0.9, 0.2], [0.9, 0.2], [0.1, 0.8], [0.1, 0.8]], dtype=np.float32)
    index = np.array([[0, 1]] * 4, dtype=np.int32)
    with XDB.open(tmp_path / "a", config(lake, "A")) as a, XDB.open(tmp_path / "b", config(lake, "B")) as b:
        # The same concept names in another order: each replica gives "alpha" a different id.
        for xdb, session, names in ((a, "ca", ("alpha", "beta")), (b, "cb", ("beta", "alpha"))):
            ticks = xdb.next_ticks(session, 4)
            xdb.writer.submit(TokenBatch(session, ticks, ["w"] * 4, concept_names=names, concept_index=index,
                                         concept_values=high_low))
            xdb.writer.flush()
        a.tag("hot", session_id="ca", tick_range=(0, 1), owner=EVERY)
        b.tag("hot", session_id="cb", tick=3, owner=EVERY)
        a.register_concepts([{"id": "alpha", "name": "Alpha", "parent": None}])
        a.lake_ship_now()
        a.register_concepts([{"id": "alpha", "name": "Alpha (v2)", "parent": None}])  # rewritten in place
        a.lake_ship_now()
        b.lake_ship_now()

        strong = a.lake_recall(concept="alpha", min_activation=0.5, owner=EVERY)
        assert sorted((r["replica"], r["tick"]) for r in strong) == [("A", 0), ("A", 1), ("B", 2), ("B", 3)]
        assert sorted(round(r["concept_activations"]["alpha"], 3) for r in strong) == [0.8, 0.8, 0.9, 0.9]
        assert len(a.lake_recall(concept="alpha", max_activation=0.5, owner=EVERY)) == 4
        assert len(a.lake_recall(concept="alpha", owner=EVERY)) == 8
        assert a.lake_recall(concept="nobody", owner=EVERY) == []

        hot = a.lake_recall(tags=["hot"], owner=EVERY)
        assert sorted((r["replica"], r["tick"]) for r in hot) == [("A", 0), ("A", 1), ("B", 3)]
        assert all(r["tags"] == ["hot"] for r in hot)

        concepts = {c["name"]: c for c in a.lake_concepts()}
        assert concepts["alpha"]["replicas"] == ["A", "B"] and concepts["alpha"]["display_name"] == "Alpha (v2)"
        assert concepts["beta"]["replicas"] == ["A", "B"]
        tags = {t["name"]: t for t in a.lake_tags()}
        assert tags["hot"]["applications"] == 2 and {r["replica"] for r in tags["hot"]["replicas"]} == {"A", "B"}
        # The rewrite is a second version; idle cycles add nothing.
        a.lake_ship_now()
        assert lake_sql(lake, "SELECT count(*) FROM lake.concept_hierarchy WHERE replica = 'A'") == [(2,)]


KILLED = textwrap.dedent("""
    import sys, time
    from core.config import LakeConfig, XDBConfig
    from xdb import XDB, TokenBatch
    data_dir, dsn, data_path, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lake = LakeConfig(catalog=dsn, data_path=data_path, replica_id="K", ship_interval_s=0.01, ship_batch_rows=500)
    xdb = XDB.open(data_dir, XDBConfig(backend="ducklake", lake=lake, batch_rows=5_000))
    for start in range(0, n, 5_000):
        ticks = xdb.next_ticks("killed", 5_000)
        xdb.writer.submit(TokenBatch("killed", ticks, [f"t{t}" for t in ticks]))
    xdb.writer.flush()
    print("committed", flush=True)
    time.sleep(120)
""")


@pytest.mark.process
def test_shipping_is_exactly_once_across_a_kill(lake: LakeConfig, tmp_path: Path) -> None:
    n = 40_000
    assert lake.catalog is not None and lake.data_path is not None
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path / "k"), lake.catalog, lake.data_path, str(n)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "committed"

        def shipped() -> int:
            return int(lake_sql(lake, "SELECT count(*) FROM lake.timesteps")[0][0])  # type: ignore[call-overload]
        wait_for(lambda: shipped() >= 2_000, timeout=60)
    finally:
        child.send_signal(signal.SIGKILL)  # mid-way: between cycles, or inside one
        child.wait()
    before = shipped()
    assert before < n, "the child shipped everything before it was killed: nothing was tested"

    with XDB.open(tmp_path / "k", config(lake, "K", ship_batch_rows=10_000)) as again:
        again.lake_ship_now()
        reports = again.verify_lake_audit()
    counts = lake_sql(lake, "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM lake.timesteps "
                            "WHERE replica = 'K'")
    assert counts == [(n, n, 0, n - 1)]
    audit = lake_sql(lake, "SELECT count(*), count(DISTINCT seq) FROM lake.audit_records WHERE replica = 'K'")
    assert audit == [(n, n)]
    assert lake_sql(lake, "SELECT max(last_tick) FROM lake.session_ticks WHERE session_id = 'killed'") == [(n - 1,)]
    assert reports["K"].ok and reports["K"].records_checked == n


@pytest.mark.process
def test_out_of_order_commits_deletes_and_renumbered_versions_ship_once(lake: LakeConfig, tmp_path: Path) -> None:
    with XDB.open(tmp_path / "a", config(lake, "A", ship_interval_s=3600.0)) as a:
        assert a.lake is not None and a.lake.shipper is not None
        record(a, "s", 5)
        tag = a.create_tag("late")["id"]
        insert = ("INSERT INTO tag_applications (tag_id, session_id, target_type, range_start, range_end, confidence, "
                  f"source, created_at) VALUES ({tag}, 's', 'range', ?, ?, 1.0, 'manual', now()) RETURNING id")
        with a.cursor() as slow, a.cursor() as fast:
            # A transaction takes the smaller id but commits after one that took the next.
            slow.execute("BEGIN")
            first = slow.execute(insert, [0, 1]).fetchall()[0][0]
            second = fast.execute(insert, [2, 3]).fetchall()[0][0]
            assert second == first + 1
            a.lake_ship_now()  # ships `second`; `first` is an open gap below the watermark
            slow.execute("COMMIT")
        a.lake.shipper.reload()  # as after a restart: the open gap comes back from the lake
        a.lake_ship_now()
        assert lake_sql(lake, "SELECT id FROM lake.tag_applications ORDER BY id") == [(first,), (second,)]

        # The newest rows deleted and the file checkpointed: new ids still follow the shipped ones.
        for turn in range(3):
            a.write(log_interaction, "run", journal_entry=f"turn {turn}")
        a.lake_ship_now()
        a.write(purge_run, "run")
        with a.cursor() as cur:
            cur.execute("CHECKPOINT")
        a.write(log_interaction, "run", journal_entry="after the purge")
        # A deleted session's State versions are numbered from 1 again: a new version all the same.
        a.save_session_state("s", '{"turn": 1}')
        a.delete_session("s")
        a.save_session_state("s", '{"turn": "again"}')
        a.lake_ship_now()
        a.lake_ship_now()
    entries = lake_sql(lake, "SELECT journal_entry FROM lake.interaction_log ORDER BY turn_id")
    assert entries == [("turn 0",), ("turn 1",), ("turn 2",), ("after the purge",)]
    states = lake_sql(lake, "SELECT version, state_json FROM lake.session_states ORDER BY created_at")
    assert states == [(1, '{"turn": "again"}')]  # the deletion's tombstone took the first one from the lake
    # The session's tokens went with it: its deletion reached the lake.
    assert lake_sql(lake, "SELECT count(*) FROM lake.timesteps WHERE session_id = 's'") == [(0,)]


class LakeThatGoesAway:
    """A lake on a PostgreSQL of the test's own, stopped and started again on the same port."""

    def __init__(self, tmp_path: Path) -> None:
        require_postgres()
        self.directory = Path(tempfile.mkdtemp(prefix="ahc-test-pg-down-"))
        self.directory.chmod(0o755)  # as root the cluster runs as `postgres`
        self.server = LocalPostgres(self.directory).start()
        self.port = self.server.port
        self.lake = LakeConfig(catalog=self.server.dsn, data_path=str(tmp_path / "lake-data"), ship_interval_s=0.1)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server = LocalPostgres(self.directory, port=self.port).start()

    def __enter__(self) -> LakeThatGoesAway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.mark.process
def test_a_lake_that_goes_away_misses_nothing_and_doubles_nothing(tmp_path: Path) -> None:
    with LakeThatGoesAway(tmp_path) as pg:
        with XDB.open(tmp_path / "a", config(pg.lake, "A")) as a:
            record(a, "s", 100)
            a.save_session_state("s", '{"turn": 1}')
            pg.stop()
            record(a, "s", 100)  # the writer goes on: the local files take everything
            with pytest.raises(LakeUnavailable):
                a.save_session_state("s", '{"turn": 2}')
            assert a.load_session_state("s", version=2) == '{"turn": 2}'  # stored here all the same
            assert a.lake_status()["last_error"]  # type: ignore[index]
            pg.start()
            wait_for(lambda: a.lake_status()["last_error"] is None, timeout=30)  # type: ignore[index]
            a.lake_ship_now()
            assert a.lake.session_resume("s").state.state_json == '{"turn": 2}'  # type: ignore[union-attr]
        counts = lake_sql(pg.lake, "SELECT count(*), count(DISTINCT id) FROM lake.timesteps WHERE replica = 'A'")
        assert counts == [(200, 200)]
        assert lake_sql(pg.lake, "SELECT count(*) FROM lake.session_states") == [(2,)]


@pytest.mark.process
def test_a_session_resumes_on_another_replica_with_its_ticks(lake: LakeConfig, tmp_path: Path) -> None:
    with XDB.open(tmp_path / "a", config(lake, "A")) as a, XDB.open(tmp_path / "b", config(lake, "B")) as b:
        assert b.load_session_state("s") is None
        assert record(a, "s", 10) == range(0, 10)
        a.save_session_state("s", '{"turn": 1}')  # in the lake when this returns: no waiting below

        assert b.load_session_state_verified("s") == ('{"turn": 1}', [])
        assert record(b, "s", 3) == range(10, 13)  # after A's ticks, not from 0
        b.save_session_state("s", '{"turn": 2}')

        # Back on A, which still holds the session's ticks in memory: they move past B's.
        assert a.load_session_state("s") == '{"turn": 2}'
        assert a.next_ticks("s", 2) == range(13, 15)
        assert a.committed_tick("s") == 12

        # A State whose bytes no longer match its SHA-256 is skipped for the newest intact one.
        lake_sql(lake, "UPDATE lake.session_states SET state_json = '{\"turn\": 666}' WHERE replica = 'B'")
        assert a.load_session_state("s") == '{"turn": 1}'
        rows = a.lake_recall(session_id="s", limit=100, owner=EVERY)
        assert [(r["replica"], r["tick"]) for r in rows] == ([("A", t) for t in range(10)]
                                                             + [("B", t) for t in (10, 11, 12)])


@pytest.mark.process
def test_a_deleted_session_stays_deleted_on_every_replica(lake: LakeConfig, tmp_path: Path) -> None:
    """A session served on A then B, deleted on B: the lake loses its rows, no replica resumes its old
    State, A's own copies go, and the session can start again under the same id."""
    # A applies other replicas' deletions only when the test says (not on its own every 2 s).
    with XDB.open(tmp_path / "a", config(lake, "A", tombstone_poll_s=3600.0)) as a, \
            XDB.open(tmp_path / "b", config(lake, "B")) as b:
        record(a, "s", 10, "secret")
        a.save_session_state("s", '{"turn": 1, "said": "secret"}')
        assert b.load_session_state("s") == '{"turn": 1, "said": "secret"}'
        record(b, "s", 5, "secret")
        b.save_session_state("s", '{"turn": 2, "said": "secret"}')
        record(a, "other", 3)
        a.save_session_state("other", '{"kept": true}')

        deleted = b.delete_session("s")
        assert deleted["timesteps"] == 5 and deleted["session_states"] == 1
        b.lake_ship_now()  # the tombstone, and the lake's rows of the session gone with it
        assert lake_sql(lake, "SELECT count(*) FROM lake.timesteps WHERE session_id = 's'") == [(0,)]
        assert lake_sql(lake, "SELECT count(*) FROM lake.session_states WHERE session_id = 's'") == [(0,)]
        assert b.lake_recall(text="secret", owner=EVERY) == []
        assert b.load_session_state("s") is None  # neither the lake's State nor A's

        # A has not polled yet: its local State is older than the tombstone, so it is not resumed.
        assert a.load_session_state("s") is None
        assert a.lake.follow_tombstones() == 1  # type: ignore[union-attr]
        assert a.recall(session_id="s", owner=EVERY) == []
        with pytest.raises(NotFound):
            a.read(state_versions, "s")
        assert a.lake.follow_tombstones() == 0  # type: ignore[union-attr]  # once
        assert a.load_session_state("other") == '{"kept": true}'
        assert len(a.recall(session_id="other", owner=EVERY)) == 3
        assert a.audit is not None
        events = [json.loads(c) for (c,) in a.audit.conn.execute(
            "SELECT content FROM audit_records WHERE event_type = 'xdb_event' ORDER BY seq").fetchall()]
        [event] = [e for e in events if e["action"] == "delete_session"]
        assert event["reason"] == "tombstone" and event["tombstone"]["replica"] == "B"

        # The same id starts afresh: a new State, ticks after the deleted ones.
        assert record(a, "s", 2, "fresh") == range(15, 17)
        a.save_session_state("s", '{"turn": 1, "said": "fresh"}')
        assert b.load_session_state("s") == '{"turn": 1, "said": "fresh"}'
        assert [r["content"] for r in b.lake_recall(session_id="s", owner=EVERY)] == ["fresh15", "fresh16"]


@pytest.mark.process
def test_deletions_racing_another_replicas_ships_still_stick(lake: LakeConfig, tmp_path: Path) -> None:
    """DuckLake aborts a delete from a table another writer inserted into meanwhile. While another
    replica ships without pause, each deletion still ships its tombstone (lake reads leave the session
    out when delete_session returns); its rows go from the lake once a purge wins, and the purge is
    recorded, so a restart owes nothing."""
    sessions = [f"s{i}" for i in range(4)]
    with XDB.open(tmp_path / "a", config(lake, "A")) as a:
        for session in sessions:
            record(a, session, 3, "secret")
        a.lake_ship_now()
        stop, inserted = threading.Event(), itertools.count()

        def other_replica_ships() -> None:
            conn = duckdb.connect()
            attach_lake(conn, lake.catalog or "", lake.data_path)
            try:
                while not stop.is_set():
                    try:
                        conn.execute("INSERT INTO lake.timesteps (replica, id, session_id, tick, event_type, "
                                     "created_at) VALUES ('B', ?, 'busy', 0, 'token', now())", [next(inserted)])
                    except duckdb.TransactionException as exc:  # lost to A's purge: a shipper tries again
                        assert lost_a_race(exc), exc
                    time.sleep(0.01)  # a ship every 10 ms: a busy cluster's dozens of replicas
            finally:
                conn.close()

        busy = threading.Thread(target=other_replica_ships)
        busy.start()
        try:
            wait_for(lambda: lake_sql(lake, "SELECT count(*) FROM lake.timesteps WHERE replica = 'B'")[0][0] > 0)
            for session in sessions:
                a.delete_session(session)
                assert a.lake_recall(session_id=session, owner=EVERY) == [], f"{session} is still read from the lake"
            assert a.lake.shipper.last_error is None  # type: ignore[union-attr]
        finally:
            stop.set()
            busy.join()
        a.lake_ship_now()
        assert lake_sql(lake, "SELECT count(*) FROM lake.timesteps WHERE session_id LIKE 's%'") == [(0,)]
        assert a.state()["lake"]["purges_pending"] == 0
        [(stones,)] = lake_sql(lake, "SELECT max(id) FROM lake.session_tombstones WHERE replica = 'A'")
    with XDB.open(tmp_path / "a", config(lake, "A")) as a:
        assert a.lake.shipper.purger.purged_to == stones  # type: ignore[union-attr]
        assert a.state()["lake"]["purges_pending"] == 0


@pytest.mark.process
def test_a_deletion_made_while_the_lake_is_down_still_sticks(tmp_path: Path) -> None:
    with LakeThatGoesAway(tmp_path) as pg, XDB.open(tmp_path / "a", config(pg.lake, "A")) as a:
        record(a, "s", 4)
        a.save_session_state("s", '{"turn": 1}')
        pg.stop()
        a.delete_session("s")  # here at once; the tombstone waits for the lake
        pg.start()
        a.lake.shipper.reload()  # type: ignore[union-attr]
        # Before the tombstone is shipped, the lake's older State is not taken.
        assert a.load_session_state("s") is None
        a.lake_ship_now()
        assert lake_sql(pg.lake, "SELECT count(*) FROM lake.session_states WHERE session_id = 's'") == [(0,)]


@pytest.mark.process
def test_remote_xdb_serves_the_lake(lake: LakeConfig, tmp_path: Path) -> None:
    with RemoteXDB(tmp_path / "r", config(lake, "R")) as remote, XDB.open(tmp_path / "b", config(lake, "B")) as b:
        assert remote.lake_status() is not None and remote.has_lake and b.has_lake  # what scope=cluster asks
        ticks = remote.next_ticks("rs", 5)
        remote.writer.submit(TokenBatch("rs", ticks, [f"r{t}" for t in ticks]))
        remote.writer.flush()  # as the server does before a reply's last chunk
        remote.save_session_state("rs", '{"on": "R"}')  # ships the rows with the State, in the service
        assert [r["replica"] for r in remote.lake_recall(session_id="rs", owner=EVERY)] == ["R"] * 5

        assert b.load_session_state("rs") == '{"on": "R"}'
        assert record(b, "rs", 4) == range(5, 9)
        b.save_session_state("rs", '{"on": "B"}')
        assert remote.load_session_state("rs") == '{"on": "B"}'
        assert remote.next_ticks("rs", 1) == range(9, 10)  # the server's own tick book moved on
        assert remote.verify_lake_audit()["R"].ok
        assert remote.lake_status()["replica"] == "R"


@pytest.mark.process
def test_bad_lake_config_is_a_clear_value_error(lake: LakeConfig, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="xdb.backend ducklake needs xdb.lake.replica_id"):
        XDBConfig(backend="ducklake", lake=lake)
    with pytest.raises(ValueError, match="replica_id"):
        XDBConfig(backend="ducklake", lake=lake.model_copy(update={"replica_id": "bad id!"}).model_dump())
    unreachable = LakeConfig(catalog=f"dbname=ahc host=127.0.0.1 port={free_port()} user=ahc connect_timeout=2",
                             data_path=str(tmp_path / "nowhere"), replica_id="r")
    with pytest.raises(ValueError, match="cannot attach the DuckLake catalog"):
        XDB.open(tmp_path / "u", XDBConfig(backend="ducklake", lake=unreachable))
    XDB.open(tmp_path / "u").close()  # the local files were closed again

    with XDB.open(tmp_path / "a", config(lake, "A")) as a:
        record(a, "s", 5)
    with pytest.raises(ValueError, match="each data dir needs a replica id of its own"):
        XDB.open(tmp_path / "fresh", config(lake, "A"))
    with pytest.raises(ValueError, match="does not match existing data path"):
        XDB.open(tmp_path / "c", config(lake, "C", data_path=str(tmp_path / "elsewhere")))


@pytest.mark.process
def test_the_duckdb_backend_has_no_lake(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        assert xdb.lake is None and xdb.lake_status() is None and "lake" not in xdb.state() and not xdb.has_lake
        with pytest.raises(ValueError, match="backend is duckdb"):
            xdb.lake_recall(owner=EVERY)
    with RemoteXDB(tmp_path / "r") as remote:
        assert not remote.has_lake


def test_open_gaps_follow_the_ids_seen() -> None:
    from xdb.lake.shipper import advance

    ids = np.array
    assert advance(0, [], ids([1, 2, 3]), 9.0) == (3, [])
    # 4 and 6..7 skipped: open; a later read finds 6 in its gap and 9 past the watermark.
    wm, gaps = advance(3, [], ids([5, 8]), 9.0)
    assert (wm, gaps) == (8, [(4, 4, 9.0), (6, 7, 9.0)])
    wm, gaps = advance(wm, gaps, ids([6, 9]), 20.0)
    assert (wm, sorted(gaps)) == (9, [(4, 4, 9.0), (7, 7, 9.0)])
    assert advance(9, [(4, 4, 9.0)], ids([4]), 30.0) == (9, [])
    assert advance(-1, [], ids([], dtype=np.int64), 1.0) == (-1, [])
