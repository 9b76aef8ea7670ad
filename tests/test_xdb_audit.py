"""The audit chain catches edits, deletions, insertions and reordering; its anchor (audit.head) catches a
cut-off tail and a recomputed chain; deletions are chained as events; kill -9 loses no commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cli_runner
import duckdb
import pyarrow as pa
import pytest

from xdb import XDB, TimestepRow, verify_audit
from xdb.audit.chain import EVENT_TYPE, GENESIS, RECORD_COLUMNS, checkpoint_hash, stamp
from xdb.owner import EVERY
from xdb.run_history import HISTORY_TABLES
from xdb.runs import log_interaction, purge_run, save_meta_knowledge
from xdb.tags import set_bud_status

# A run's purge also counts its history across runs (xdb/run_history.py): none in these tests.
NO_HISTORY = dict.fromkeys(HISTORY_TABLES, 0)

AHC = str(Path(sys.executable).with_name("ahc"))
REPO = Path(__file__).resolve().parents[1]


def write(data_dir: Path, batches: int = 3, per_batch: int = 5) -> None:
    with XDB.open(data_dir) as xdb:
        for b in range(batches):
            ticks = xdb.next_ticks("s", per_batch)
            xdb.writer.submit([TimestepRow("s", t, "output", "assistant", f"t{t}", token_id=t, request_id=f"r{b}",
                                           concept_activations={"joy": t / 10}, steering=[{"hush": b}])
                               for t in ticks])
            xdb.writer.flush()  # one batch, one checkpoint each


def tamper(data_dir: Path, sql: str) -> None:
    con = duckdb.connect(str(data_dir / "audit" / "audit.duckdb"))
    con.execute(sql)
    con.close()


@pytest.fixture
def logged(tmp_path: Path) -> Path:
    write(tmp_path / "x")
    assert verify_audit(tmp_path / "x").ok
    return tmp_path / "x"


@pytest.mark.parametrize("sql, seq, what", [
    ("UPDATE audit_records SET content = 'forged' WHERE seq = 7", 7, "hash mismatch"),
    ("UPDATE audit_records SET concept_values = [0.99, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL]"
     " WHERE seq = 4", 4, "hash mismatch"),
    # A batch's records of a session are sealed as one blob in its first record (seq 10 of the third batch).
    ("UPDATE audit_records SET sealed = sealed || '\\x00'::BLOB WHERE seq = 10", 10, "hash mismatch"),
    ("DELETE FROM audit_records WHERE seq = 6", 6, "missing"),
    ("INSERT INTO audit_records SELECT * FROM audit_records WHERE seq = 3", 3, "twice"),
    ("UPDATE audit_records SET seq = CASE seq WHEN 8 THEN 9 ELSE 8 END WHERE seq IN (8, 9)", 8, "hash mismatch"),
])
def test_tampering_is_found_and_named(logged: Path, sql: str, seq: int, what: str) -> None:
    tamper(logged, sql)
    report = verify_audit(logged)
    assert not report.ok
    assert f"seq={seq}" in report.first_bad and what in report.first_bad


def test_truncated_tail_and_edited_concepts_are_found(logged: Path, tmp_path: Path) -> None:
    tamper(logged, "DELETE FROM audit_records WHERE seq >= 13")
    assert "missing" in verify_audit(logged).first_bad
    other = tmp_path / "y"
    write(other)
    tamper(other, "UPDATE audit_concepts SET name = 'fear'")
    assert "concept" in verify_audit(other).first_bad


def test_range_verification_reads_from_the_nearest_checkpoint(logged: Path) -> None:
    tamper(logged, "UPDATE audit_records SET content = 'forged' WHERE seq = 1")
    report = verify_audit(logged, seq_from=10, seq_to=14)
    assert report.ok and report.records_checked == 5  # only the last batch's segment was read
    assert not verify_audit(logged).ok


@pytest.mark.process
def test_cli_verify_audit_exit_codes(logged: Path) -> None:
    ok = subprocess.run([AHC, "xdb", "verify-audit", "--data-dir", str(logged)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    tamper(logged, "UPDATE audit_records SET tick = 99 WHERE seq = 2")
    bad = subprocess.run([AHC, "xdb", "verify-audit", "--data-dir", str(logged)], capture_output=True, text=True)
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "seq=2" in lines[0]


def test_cli_recall_prints_json_lines(logged: Path) -> None:
    out = cli_runner.ahc("xdb", "recall", "--data-dir", str(logged), "--tick-from", "3", "--tick-to", "4")
    assert out.returncode == 0, out.stderr
    import json
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["tick"] for r in rows] == [3, 4] and rows[0]["concept_activations"] == {"joy": pytest.approx(0.3)}
    bad = cli_runner.ahc("xdb", "recall", "--data-dir", str(logged), "--limit", "0")
    assert bad.returncode == 1 and "limit" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from xdb import XDB, TimestepRow
    xdb = XDB.open({data!r})
    for b in range(3):
        xdb.writer.submit([TimestepRow("s", t, "output", content=f"t{{t}}", concept_activations={{"c": 1.0}})
                           for t in xdb.next_ticks("s", 1000)])
        xdb.writer.flush()
    print("flushed", flush=True)
    while True:  # keep writing until killed, so the kill lands mid-stream
        xdb.writer.submit([TimestepRow("s", t, "output", content="more") for t in xdb.next_ticks("s", 100)])
        time.sleep(0.001)
""")


@pytest.mark.process
def test_kill_9_keeps_every_committed_batch_and_the_chain(tmp_path: Path) -> None:
    data = tmp_path / "crash"
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(repo=str(REPO), data=str(data))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "flushed"
        time.sleep(0.6)  # a few more batches commit, some are in flight
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with XDB.open(data) as xdb:
        with xdb.cursor() as cur:
            count, distinct, top = cur.execute("SELECT count(*), count(DISTINCT tick), max(tick) FROM timesteps "
                                               "WHERE session_id = 's'").fetchone()
        assert count >= 3000 and count == distinct == top + 1  # every flushed row, batches whole and in order
        rows = xdb.recall(session_id="s", tick_to=2999, limit=10_000, owner=EVERY)
        assert [r["tick"] for r in rows] == list(range(3000))
        assert xdb.verify_audit().ok
        [next_tick] = xdb.next_ticks("s", 1)
        assert next_tick == top + 1
    assert verify_audit(data).ok


# -- the anchor: every tamper vector, seen by `ahc xdb verify-audit` -----------------------------------

def verify_cli(data_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    # In this process (cli_runner), the same exit codes and stderr: test_cli_verify_audit_exit_codes runs
    # the real `ahc` process.
    return cli_runner.ahc("xdb", "verify-audit", "--data-dir", str(data_dir), *extra)


def head_lines(data_dir: Path) -> list[str]:
    return (data_dir / "audit" / "audit.head").read_text().splitlines()


def recompute_chain(data_dir: Path) -> None:
    """What a careful forger does after an edit: rewrite every record hash and checkpoint so the
    file is consistent with itself again."""
    con = duckdb.connect(str(data_dir / "audit" / "audit.duckdb"))
    records = con.execute(f"SELECT {', '.join(RECORD_COLUMNS)} FROM audit_records ORDER BY seq").to_arrow_table()
    ends = [end for (end,) in con.execute("SELECT seq_end FROM audit_checkpoints ORDER BY seq_end").fetchall()]
    roots = dict(con.execute("SELECT seq, activation_root FROM audit_records "
                             "WHERE activation_root IS NOT NULL").fetchall())
    leaves, hashes = stamp(GENESIS, records, ends, acts=roots)  # batch by batch, as the writer chains them
    con.register("fixed", pa.table({"seq": records.column("seq"), "l": pa.array(leaves, pa.int32()),
                                    "h": pa.array(hashes, pa.binary())}))
    con.execute("UPDATE audit_records SET leaf = fixed.l, record_hash = fixed.h FROM fixed "
                "WHERE audit_records.seq = fixed.seq")
    prev = GENESIS
    for start, end, count, chead in con.execute("SELECT seq_start, seq_end, concept_count, concepts_head "
                                                "FROM audit_checkpoints ORDER BY seq_end").fetchall():
        ckpt = checkpoint_hash(prev, start, end, hashes[end], count, bytes(chead))
        con.execute("UPDATE audit_checkpoints SET chain_head = ?, prev_hash = ?, checkpoint_hash = ? WHERE seq_end = ?",
                    [hashes[end], prev, ckpt, end])
        prev = ckpt
    con.close()


def test_head_file_anchors_every_commit(logged: Path) -> None:
    lines = head_lines(logged)
    assert [line.split()[0] for line in lines] == ["4", "9", "14"]  # one `SEQ HASH` line per checkpoint
    with duckdb.connect(str(logged / "audit" / "audit.duckdb"), read_only=True) as con:
        [(h,)] = con.execute("SELECT record_hash FROM audit_records WHERE seq = 14").fetchall()
    assert lines[-1] == f"14 {bytes(h).hex()}"
    ok = verify_cli(logged)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("sql, needle", [
    ("UPDATE audit_records SET content = 'forged' WHERE seq = 7", "seq=7"),                       # edit
    ("DELETE FROM audit_records WHERE seq = 6", "seq=6"),                                        # delete
    ("INSERT INTO audit_records SELECT * FROM audit_records WHERE seq = 3", "seq=3"),            # insert
    ("UPDATE audit_records SET seq = CASE seq WHEN 8 THEN 9 ELSE 8 END WHERE seq IN (8, 9)", "seq=8"),  # reorder
    ("DELETE FROM audit_records WHERE seq >= 10", "seq=10"),                       # tail cut, checkpoint left
    ("DELETE FROM audit_records WHERE seq >= 10; DELETE FROM audit_checkpoints WHERE seq_end >= 10",
     "head mismatch at seq=14"),                                                   # tail cut with its checkpoint
])
def test_cli_catches_every_tamper_vector(logged: Path, sql: str, needle: str) -> None:
    tamper(logged, sql)
    bad = verify_cli(logged)
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_cli_catches_a_recomputed_chain(logged: Path) -> None:
    tamper(logged, "UPDATE audit_records SET content = 'forged' WHERE seq = 7")
    recompute_chain(logged)
    assert verify_audit(logged).first_bad.startswith("audit head mismatch at seq=9")  # the chain itself is whole
    bad = verify_cli(logged)
    assert bad.returncode == 1 and "head mismatch at seq=9" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_cli_catches_a_recomputed_chain_with_a_forged_head_line(logged: Path) -> None:
    tamper(logged, "UPDATE audit_records SET content = 'forged' WHERE seq = 12")
    recompute_chain(logged)
    with duckdb.connect(str(logged / "audit" / "audit.duckdb"), read_only=True) as con:
        [(h,)] = con.execute("SELECT record_hash FROM audit_records WHERE seq = 14").fetchall()
    with (logged / "audit" / "audit.head").open("a") as f:  # the last line agrees now; the history does not
        f.write(f"15 {bytes(h).hex()}\n")
    assert verify_cli(logged).returncode == 1


def test_missing_head_file_fails_a_non_empty_log(logged: Path) -> None:
    (logged / "audit" / "audit.head").unlink()
    bad = verify_cli(logged)
    assert bad.returncode == 1 and "missing" in bad.stderr and "seq=14" in bad.stderr


def test_expect_head(logged: Path) -> None:
    with XDB.open(logged) as xdb:
        seq, digest = xdb.audit_head()
    assert seq == 14 and head_lines(logged)[-1] == f"{seq} {digest}"
    assert verify_cli(logged, "--expect-head", f"{seq}:{digest}").returncode == 0
    assert verify_cli(logged, "--expect-head", f"9:{head_lines(logged)[1].split()[1]}").returncode == 0  # earlier
    wrong = verify_cli(logged, "--expect-head", f"{seq}:{'ab' * 32}")
    assert wrong.returncode == 1 and "head mismatch at seq=14" in wrong.stderr
    gone = verify_cli(logged, "--expect-head", f"99:{digest}")
    assert gone.returncode == 1 and "seq=99" in gone.stderr
    assert verify_cli(logged, "--expect-head", "14:nothex").returncode == 2
    assert verify_cli(logged.parent / "nowhere").returncode == 2
    assert verify_cli(logged, "--seq-from", "5", "--seq-to", "2").returncode == 2


def test_open_refuses_a_broken_tail_and_modifies_nothing(logged: Path) -> None:
    """A start verifies the log's last checkpoint (10..14) and its anchor before anything builds on it."""
    tamper(logged, "UPDATE audit_records SET content = 'forged' WHERE seq = 12")
    before = head_lines(logged)
    with pytest.raises(ValueError, match="seq=12"):
        XDB.open(logged)
    recompute_chain(logged)
    with pytest.raises(ValueError, match="head mismatch at seq=14"):
        XDB.open(logged)
    assert head_lines(logged) == before
    with XDB.open(logged, read_only=True) as xdb:
        assert len(xdb.recall(session_id="s", limit=100, owner=EVERY)) == 15


def test_a_break_before_the_tail_is_found_by_the_background_verification(logged: Path, caplog) -> None:
    """Older records are re-hashed after the start, recording going on meanwhile: the verdict is an
    error in the log and `audit_verified()` False."""
    tamper(logged, "UPDATE audit_records SET content = 'forged' WHERE seq = 7")
    with caplog.at_level("ERROR", logger="ahc.xdb.audit"), XDB.open(logged) as xdb:
        deadline = time.monotonic() + 30
        while xdb.audit_verified() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert xdb.audit_verified() is False
        xdb.writer.submit([TimestepRow("s", t, "input", "user", "still recording") for t in xdb.next_ticks("s", 1)])
        xdb.writer.flush()  # recording goes on
    assert "is broken" in caplog.text and "seq=7" in caplog.text
    assert not verify_audit(logged).ok


def test_the_background_verification_of_an_intact_log_says_so(logged: Path) -> None:
    with XDB.open(logged) as xdb:
        deadline = time.monotonic() + 30
        while xdb.audit_verified() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert xdb.audit_verified() is True


def test_a_crash_between_commit_and_anchor_is_repaired_at_open(logged: Path, caplog) -> None:
    head = logged / "audit" / "audit.head"
    head.write_text("\n".join(head_lines(logged)[:-1]) + "\n")  # the last commit's line never landed
    bad = verify_cli(logged)
    assert bad.returncode == 1 and "head mismatch at seq=14" in bad.stderr and "never anchored" in bad.stderr
    with caplog.at_level("INFO", logger="ahc.xdb.audit"), XDB.open(logged) as xdb:
        assert xdb.audit_head()[0] == 14
    assert "not anchored" in caplog.text
    assert verify_cli(logged).returncode == 0
    head.write_text("\n".join(head_lines(logged)[:-2]) + "\n")  # two unanchored commits are no crash
    with pytest.raises(ValueError, match="head mismatch at seq=4.*names no checkpoint at the log's end"):
        XDB.open(logged)


def test_a_log_from_before_anchoring_is_anchored_once(logged: Path) -> None:
    (logged / "audit" / "audit.head").unlink()
    tamper(logged, "DELETE FROM audit_meta WHERE key = 'head_file'; "
                   "UPDATE audit_meta SET value = '1' WHERE key = 'schema_version'")
    assert verify_cli(logged).returncode == 1  # not anchored yet
    with XDB.open(logged) as xdb:
        assert xdb.audit_head()[0] == 14
    assert [line.split()[0] for line in head_lines(logged)] == ["14"]
    assert verify_cli(logged).returncode == 0


def test_commits_are_logged_and_the_gauge_reads_the_head(tmp_path: Path, caplog) -> None:
    from prometheus_client import generate_latest

    from server.metrics import AHCMetrics

    metrics = AHCMetrics(model_name="tiny")
    with caplog.at_level("INFO", logger="ahc.xdb.audit"), XDB.open(tmp_path / "x") as xdb:
        metrics.one(metrics.audit_head_seq).set_function(lambda: xdb.audit_head()[0])
        assert xdb.audit_head() == (-1, GENESIS.hex())
        xdb.writer.submit([TimestepRow("s", t, "output", content="x") for t in xdb.next_ticks("s", 3)])
        xdb.writer.flush()
        assert 'ahc_audit_head_seq{model_name="tiny"} 2.0' in generate_latest(metrics.registry).decode()
        seq, digest = xdb.audit_head()
    assert f"audit head seq=2 hash={digest}" in caplog.text


# -- deletions are audit events ----------------------------------------------------------------------

def events(data_dir: Path) -> list[dict]:
    import json
    with duckdb.connect(str(data_dir / "audit" / "audit.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT content FROM audit_records WHERE event_type = ? ORDER BY seq",
                           [EVENT_TYPE]).fetchall()
    return [json.loads(c) for (c,) in rows]


def test_deletions_and_rewrites_are_chained_as_events(tmp_path: Path) -> None:
    data = tmp_path / "x"
    with XDB.open(data, summarize=lambda text: "gist") as xdb:
        for b in range(2):
            ticks = xdb.next_ticks("s", 5)
            xdb.writer.submit([TimestepRow("s", t, "output", content=f"t{t}", request_id=f"r{b}", created_at=0.0)
                               for t in ticks])
        xdb.writer.flush()
        xdb.write(log_interaction, "run", journal_entry="a")
        xdb.write(log_interaction, "run", journal_entry="b")
        xdb.write(save_meta_knowledge, "run", theorems_json="[]")
        assert xdb.write(purge_run, "run") == {"interaction_log": 2, "meta_knowledge": 1, **NO_HISTORY}
        for n in range(20):
            xdb.save_session_state("s", f'{{"n": {n}}}')
        xdb.create_tag("idea")
        xdb.write(set_bud_status, "idea", "candidate")
        xdb.compact("s", compress_released=True)
        assert xdb.verify_audit().ok
    got = events(data)
    actions = [e["action"] for e in got]
    assert actions.count("purge_run") == 1 and actions.count("prune_session_states") == 4
    assert "rewrite_tag" in actions and actions.count("compress_timesteps") == 2
    purge = got[actions.index("purge_run")]
    assert purge["deleted"] == {"interaction_log": 2, "meta_knowledge": 1, **NO_HISTORY}
    assert purge["id_ranges"]["interaction_log.turn_id"] is not None
    compressed = [e for e in got if e["action"] == "compress_timesteps"]
    assert [e["timestep_ids"] for e in compressed] == [[0, 4], [5, 9]] and all(e["deleted"] == 5 for e in compressed)
    with XDB.open(data) as xdb:  # events are chained, never replayed as timesteps
        with xdb.cursor() as cur:
            assert cur.execute("SELECT count(*) FROM timesteps").fetchone()[0] == 0
        [tick] = xdb.next_ticks("s", 1)
        assert tick == 10
    assert verify_cli(data).returncode == 0


def test_writers_keep_committing_while_a_large_chain_is_verified(tmp_path: Path) -> None:
    """A verification reads a snapshot: commits go on while it re-hashes (they used to wait for all of it)."""
    import threading

    with XDB.open(tmp_path / "big") as xdb:
        for _ in range(15):
            xdb.writer.submit([TimestepRow("s", t, "output", content=f"t{t}", concept_activations={"c": 0.5})
                               for t in xdb.next_ticks("s", 10_000)])
        # The committing session exists before (its tick counter and its audit key, made with an fsync that
        # a loaded disk can stretch): what is timed is commits, not a first session's set-up.
        xdb.writer.submit([TimestepRow("w", t, "output", content="x") for t in xdb.next_ticks("w", 1)])
        xdb.writer.flush()
        done: list[object] = []
        verifier = threading.Thread(target=lambda: done.append(xdb.audit.verify()))  # type: ignore[union-attr]
        started = time.perf_counter()
        verifier.start()
        commits: list[float] = []
        while verifier.is_alive():
            t0 = time.perf_counter()
            xdb.writer.submit([TimestepRow("w", t, "output", content="x") for t in xdb.next_ticks("w", 10)])
            xdb.writer.flush()
            commits.append(time.perf_counter() - t0)
        verifier.join()
        took = time.perf_counter() - started
        report = done[0]
        assert report.ok and report.records_checked >= 150_000, report  # type: ignore[attr-defined]
        # Holding the commit lock, the first commit waited for the whole verification and no other fit.
        assert len(commits) >= 5, (len(commits), took)
        assert max(commits) < took / 2, (max(commits), took)
        assert xdb.verify_audit().ok  # what was committed meanwhile chains on
