"""The XDB service process (RemoteXDB): the same answers as the in-process XDB, errors that keep their
type across the process boundary, callbacks into the caller, back-pressure counted without a round
trip, and a service killed mid-stream that is started again with every accepted row stored once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from core.config import XDBConfig
from lens.side_channel import ActivationSender, StepActivations
from xdb import (
    XDB,
    RecallFilterError,
    RemoteXDB,
    TimestepRow,
    TokenBatch,
    WriterBackpressure,
    WriterStopped,
    verify_audit,
)
from xdb.documents import list_documents
from xdb.owner import EVERY
from xdb.run_history import HISTORY_TABLES
from xdb.runs import list_interactions, log_interaction, purge_run
from xdb.service.link import ServiceProcess, ServiceUnavailable

# A run's purge also counts its history across runs (xdb/run_history.py): none in these tests.
NO_HISTORY = dict.fromkeys(HISTORY_TABLES, 0)

NAMES = ["joy", "fear"]


def batch(xdb: RemoteXDB | XDB, session: str, words: list[str], activations: bool = False) -> TokenBatch:
    ticks = xdb.next_ticks(session, len(words))
    n = len(words)
    return TokenBatch(session, ticks, words, token_ids=np.arange(n), request_id="r",
                      concept_names=NAMES if activations else (),
                      concept_index=np.tile([[0, 1]], (n, 1)) if activations else None,
                      concept_values=np.full((n, 2), 0.5, np.float32) if activations else None)


@pytest.mark.process
def test_rows_calls_and_errors_go_through_the_service(tmp_path: Path) -> None:
    with RemoteXDB(tmp_path / "x") as xdb:
        assert xdb.writer.process.process.pid != os.getpid()
        xdb.writer.submit(batch(xdb, "s", ["Hel", "lo"], activations=True))
        xdb.writer.submit([TimestepRow("s", t, "input", "user", "hi") for t in xdb.next_ticks("s", 1)])
        xdb.writer.flush(10)
        assert xdb.writer.queue_depth() == 0 and xdb.writer.rows_written == 3
        rows = xdb.recall(session_id="s", owner=EVERY)
        assert [(r["tick"], r["content"]) for r in rows] == [(0, "Hel"), (1, "lo"), (2, "hi")]
        assert rows[0]["concept_activations"] == {"joy": 0.5, "fear": 0.5}
        # A tag on a row submitted just now: the call sees every row submitted before it.
        xdb.writer.submit(batch(xdb, "s", ["!"]))
        assert xdb.tag("t", session_id="s", tick=3, owner=EVERY)["timestep_id"] == 3
        with pytest.raises(RecallFilterError) as bad:
            xdb.recall(limit=0, owner=EVERY)
        assert bad.value.param == "limit" and isinstance(bad.value, ValueError)
        seen: list[str] = []
        report = xdb.compact("s", compress_released=True, summarize=lambda text: seen.append(text) or "summary")
        assert report["compaction"]["summary"] == "summary" and seen  # the summarizer ran here
        assert xdb.verify_audit().ok
    # Closed: everything committed, and the files open in-process as before.
    with XDB.open(tmp_path / "x") as xdb:
        assert list(xdb.next_ticks("s", 1)) == [4]
    assert verify_audit(tmp_path / "x").ok


def _unmarked(cur: object) -> int:
    return 1


@pytest.mark.parametrize("where", ["in-process", "service"])
@pytest.mark.process
def test_the_generic_entry_runs_marked_module_functions_and_nothing_else(tmp_path: Path, where: str) -> None:
    """`read` / `write` run an XDB module's marked function (by reference across the process boundary),
    hand a write the audit hook, and refuse any other function, and a read function given as a write."""
    with (RemoteXDB(tmp_path / "x") if where == "service" else XDB.open(tmp_path / "x")) as xdb:
        turn = xdb.write(log_interaction, "run", journal_entry="tried a collision")
        assert [(t["turn_id"], t["journal_entry"]) for t in xdb.read(list_interactions, "run")] == [
            (turn, "tried a collision")]
        assert xdb.read(list_documents, owner=EVERY) == []
        with pytest.raises(TypeError, match="_unmarked is not marked @reads"):
            xdb.read(_unmarked)
        with pytest.raises(TypeError, match="list_interactions is not marked @writes"):
            xdb.write(list_interactions, "run")  # type: ignore[arg-type]
        before, _ = xdb.audit_head()
        assert xdb.write(purge_run, "run") == {"interaction_log": 1, "meta_knowledge": 0, **NO_HISTORY}
        after, _ = xdb.audit_head()
    assert after == before + 1 and verify_audit(tmp_path / "x").ok  # the purge was chained through the hook


@pytest.mark.process
def test_closing_commits_what_was_never_flushed(tmp_path: Path) -> None:
    with RemoteXDB(tmp_path / "x") as xdb:
        for _ in range(50):
            xdb.writer.submit(batch(xdb, "s", ["a", "b"]))
    with XDB.open(tmp_path / "x") as xdb:
        assert len(xdb.recall(session_id="s", limit=1000, owner=EVERY)) == 100


@pytest.mark.process
def test_a_killed_service_is_restarted_and_loses_no_accepted_row(tmp_path: Path) -> None:
    restarts: list[int] = []
    with RemoteXDB(tmp_path / "x", on_restart=lambda: restarts.append(1)) as xdb:
        first = xdb.writer.process.process.pid
        for i in range(300):
            xdb.writer.submit(batch(xdb, "s", ["a", "b", "c"], activations=i % 2 == 0))
            if i == 150:
                os.kill(first, signal.SIGKILL)
            time.sleep(0.001)
        xdb.writer.flush(60)
        assert restarts == [1] and xdb.writer.process.process.pid != first
        rows = xdb.recall(session_id="s", limit=10_000, owner=EVERY)
        assert [r["tick"] for r in rows] == list(range(900))  # each once, in order
        assert sum(1 for r in rows if r["concept_activations"]) == 450
        assert xdb.state()["writer"]["process_restarts"] == 1
        assert xdb.verify_audit().ok


def keyed(xdb: RemoteXDB, key: str, first: int, n: int) -> TokenBatch:
    """Tokens whose activations the writer joins from the side channel (the server's way)."""
    return TokenBatch("s", xdb.next_ticks("s", n), ["w"] * n, token_ids=np.arange(n), request_id=key,
                      concept_names=NAMES, activation_key=key, first_position=first)


def activations(key: str, positions: list[int]) -> StepActivations:
    n = len(positions)
    return StepActivations([key] * n, positions, np.tile(np.array([[1, 0]], np.int32), (n, 1)),
                           np.full((n, 2), 0.25, np.float32), "emulated")


@pytest.mark.process
def test_the_service_joins_activations_sent_to_it_and_binds_again_after_a_restart(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/lens"
    with RemoteXDB(tmp_path / "x", XDBConfig(max_latency_s=0.05)) as xdb:
        xdb.capture_activations(address, 2, 2.0)
        sender = ActivationSender(address)  # as the engine's worker: connected once, for the whole run
        try:
            sender.send(activations("a", [0, 1]))
            xdb.writer.submit(keyed(xdb, "a", 0, 2))
            xdb.writer.flush(10)
            os.kill(xdb.writer.process.process.pid, signal.SIGKILL)
            xdb.writer.submit([TimestepRow("s", t, "system", None, "x") for t in xdb.next_ticks("s", 1)])
            deadline = time.monotonic() + 60
            while xdb.writer.restarts == 0 and time.monotonic() < deadline:  # the submit finds it dead
                time.sleep(0.05)
            xdb.writer.submit(keyed(xdb, "b", 0, 1))  # to the service started next
            time.sleep(0.5)  # the worker's socket reconnects to the new service on its own
            sender.send(activations("b", [0]))
            xdb.writer.flush(30)
        finally:
            sender.close()
        rows = xdb.recall(session_id="s", owner=EVERY)
    assert [(r["request_id"], r["activation_source"]) for r in rows] == \
        [("a", "emulated"), ("a", "emulated"), (None, None), ("b", "emulated")]
    assert rows[0]["concept_activations"] == {"fear": 0.25, "joy": 0.25}


@pytest.mark.process
def test_back_pressure_is_counted_here_and_released_when_the_service_catches_up(tmp_path: Path) -> None:
    config = XDBConfig(max_queue_rows=10, submit_timeout_s=0.3)
    with RemoteXDB(tmp_path / "x", config) as xdb:
        pid = xdb.writer.process.process.pid
        xdb.start_session("s")  # a new session's ticks need no call to the service
        os.kill(pid, signal.SIGSTOP)  # a service that stops taking rows, like a disk that stalls
        try:
            assert xdb.writer.try_submit(batch(xdb, "s", list("abcdefgh")))
            assert not xdb.writer.try_submit(batch(xdb, "s", list("xyz")))
            with pytest.raises(WriterBackpressure):
                xdb.writer.submit(batch(xdb, "s", list("xyz")))
            assert xdb.writer.queue_depth() == 8
        finally:
            os.kill(pid, signal.SIGCONT)
        xdb.writer.submit(batch(xdb, "s", list("xyz")), timeout=10)  # room again once the first rows commit
        xdb.writer.flush(10)
        # The refused batches reserved ticks 8-13 and were never stored; the accepted one follows them.
        assert [r["tick"] for r in xdb.recall(session_id="s", owner=EVERY)] == [*range(8), 14, 15, 16]


@pytest.mark.process
def test_a_corrupt_database_fails_the_start_and_is_left_untouched(tmp_path: Path) -> None:
    data = tmp_path / "x"
    data.mkdir()
    (data / "experience.duckdb").write_bytes(b"not a database" * 100)
    with pytest.raises(ValueError):
        RemoteXDB(data)
    assert (data / "experience.duckdb").read_bytes() == b"not a database" * 100


@pytest.mark.process
def test_the_service_stops_when_its_server_goes_away(tmp_path: Path) -> None:
    process = ServiceProcess(tmp_path / "x", XDBConfig())
    process.stream.close()  # as when the server's process dies: the connection ends
    process.process.join(30)
    assert process.process.exitcode == 0
    process.kill()


@pytest.mark.process
def test_a_service_that_keeps_dying_stops_recording_instead_of_restarting_forever(tmp_path: Path) -> None:
    xdb = RemoteXDB(tmp_path / "x")
    xdb.start_session("s")
    for restarts in range(1, 5):
        xdb.writer.submit(batch(xdb, "s", ["a"]))
        xdb.writer.flush(10)
        os.kill(xdb.writer.process.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while xdb.writer.restarts < restarts and xdb.writer.alive and time.monotonic() < deadline:
            time.sleep(0.05)
    assert xdb.writer.restarts == 3 and not xdb.writer.alive  # the fourth death in a minute is final
    with pytest.raises(WriterStopped):
        xdb.writer.submit(batch(xdb, "s", ["b"]))
    with pytest.raises(WriterStopped):  # closing reports why recording stopped
        xdb.close()
    # Each row was committed before its service died, and none twice.
    with XDB.open(tmp_path / "x") as reopened:
        assert [r["tick"] for r in reopened.recall(session_id="s", owner=EVERY)] == [0, 1, 2, 3]


@pytest.mark.process
def test_a_service_waits_for_a_closing_owner_to_release_the_files(tmp_path: Path) -> None:
    holder = XDB.open(tmp_path / "x")  # the files' lock, as a killed server's service still closing holds it
    holder.writer.submit([TimestepRow("s", t, "input", "user", "kept") for t in holder.next_ticks("s", 2)])
    release = threading.Timer(1.5, holder.close)
    release.start()
    started = time.monotonic()
    with RemoteXDB(tmp_path / "x") as xdb:
        assert time.monotonic() - started >= 1.0  # it waited instead of failing
        assert [r["content"] for r in xdb.recall(session_id="s", owner=EVERY)] == ["kept", "kept"]
    release.join()


@pytest.mark.process
def test_a_connection_that_closes_or_stalls_ends_nothing(tmp_path: Path) -> None:
    """One connect-and-close ended the accept loop for good (every later connection hung while /health
    said 200); a connection that never answers the handshake holds only its own thread."""
    import socket

    with RemoteXDB(tmp_path / "x") as xdb:
        address = xdb.writer.process.spec.address
        with socket.socket(socket.AF_UNIX) as stray:
            stray.connect(address)  # and closed at once
        stalled = socket.socket(socket.AF_UNIX)
        stalled.connect(address)  # sends nothing
        try:
            for _ in range(3):
                xdb.writer.process._pool.clear()  # a new connection for each call
                started = time.monotonic()
                assert xdb.state()["writer"] is not None
                assert time.monotonic() - started < 5
        finally:
            stalled.close()


@pytest.mark.process
def test_a_service_that_stops_answering_is_killed_and_started_again(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import xdb.service.link
    import xdb.service.service

    monkeypatch.setattr(xdb.service.link, "CALL_TIMEOUT_S", 1.0)
    monkeypatch.setattr(xdb.service.service, "HANDSHAKE_TIMEOUT_S", 1.0)  # a new connection's (this side's)
    with RemoteXDB(tmp_path / "x") as store:
        hung = store.writer.process.process.pid
        os.kill(hung, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            store.state()
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 30  # the writer sees it dead and starts another
        while store.writer.process.process.pid == hung:
            assert time.monotonic() < deadline, "the service was not started again"
            time.sleep(0.1)
        store.writer.submit(batch(store, "s", ["a", "b"]))
        store.writer.flush(60)
        assert [r["content"] for r in store.recall(session_id="s", owner=EVERY)] == ["a", "b"]


@pytest.mark.process
def test_a_row_utf8_cannot_hold_is_stored_with_a_replacement_not_the_writers_death(tmp_path: Path) -> None:
    """A lone surrogate (half an emoji, escaped in a client's JSON) killed the service's writer, and every
    restart resent the same row first, so nothing committed again."""
    with RemoteXDB(tmp_path / "x") as xdb:
        ticks = xdb.next_ticks("s", 3)
        xdb.writer.submit([TimestepRow("s", ticks[0], "input", "user", "half \ud83d", metadata={"k": "\udc00"})])
        xdb.writer.submit(TokenBatch("s", ticks[1:], ["ok", "\ud800"], token_ids=[1, 2], request_id="r"))
        xdb.writer.flush(30)
        rows = xdb.recall(session_id="s", owner=EVERY)
        assert [r["content"] for r in rows] == ["half \ufffd", "ok", "\ufffd"]
        assert rows[0]["metadata"] == {"k": "\ufffd"}
        assert xdb.state()["writer"]["process_restarts"] == 0


class Unjsonable:
    """Pickles, but JSON cannot encode it: a row whose metadata holds one passes every check where rows are
    accepted and kills the writer, as a fault that no check foresaw would."""


@pytest.mark.process
def test_a_part_that_kills_the_writer_is_dropped_after_it_kills_a_second_run_alone(tmp_path: Path) -> None:
    """The service exits when its writer dies (it used to go on accepting rows it could never commit, every
    flush timing out). Its next run commits the suspect part alone and dies again; the run after drops that
    part, logged and chained in the audit, and keeps every other row."""
    import duckdb

    from xdb.writer_failure import FILE

    with RemoteXDB(tmp_path / "x") as xdb:
        xdb.writer.submit([TimestepRow("s", t, "input", "user", "before") for t in xdb.next_ticks("s", 2)])
        xdb.writer.flush(10)
        xdb.writer.submit([TimestepRow("p", 0, "input", "user", "poison", metadata={"x": Unjsonable()})])
        xdb.writer.submit(batch(xdb, "s", ["af", "ter"]))
        xdb.writer.flush(60)
        assert xdb.writer.alive and xdb.writer.restarts == 2  # a run per death, the part dropped in the third
        rows = xdb.recall(owner=EVERY)
        assert [(r["session_id"], r["content"]) for r in rows] == [("s", "before")] * 2 + [("s", "af"), ("s", "ter")]
        xdb.writer.submit(batch(xdb, "s", ["on"]))  # recording goes on
        xdb.writer.flush(10)
    assert not (tmp_path / "x" / FILE).exists()
    assert verify_audit(tmp_path / "x").ok
    with duckdb.connect(str(tmp_path / "x" / "audit" / "audit.duckdb"), read_only=True) as audit:
        events = [json.loads(c) for (c,) in audit.execute(
            "SELECT content FROM audit_records WHERE content LIKE '%rows_dropped%'").fetchall()]
    assert [(e["rows"], e["spans"]) for e in events] == [(1, [["p", 0, 0]])]


def poison_value() -> Unjsonable:
    return Unjsonable()


@pytest.mark.process
def test_only_the_row_that_kills_the_writer_alone_is_dropped_not_the_rest_of_its_part(tmp_path: Path) -> None:
    """A part of three rows, the middle one poison: the run after the part killed a run alone commits it a
    row a batch; the one row that kills that run is the only one dropped."""
    with RemoteXDB(tmp_path / "x") as xdb:
        rows = [TimestepRow("p", t, "input", "user", f"row{t}") for t in xdb.next_ticks("p", 3)]
        rows[1].metadata = {"x": poison_value()}
        xdb.writer.submit(rows)
        xdb.writer.flush(90)
        assert xdb.writer.alive and xdb.writer.restarts == 3
        assert [r["content"] for r in xdb.recall(session_id="p", owner=EVERY)] == ["row0", "row2"]
    assert verify_audit(tmp_path / "x").ok


def fill_disk_while(marker: str) -> int:
    """Run where the row is unpickled (the XDB service): from then on, while `marker` exists, the writer's
    insert fails as on a full disk (ENOSPC), the way the kernel answers a write there."""
    import errno

    from xdb import writer

    if not hasattr(writer, "disk_full_marker"):
        insert = writer.insert_batch

        def full_disk_insert(*args: object, **kwargs: object) -> object:
            if Path(writer.disk_full_marker).exists():  # type: ignore[attr-defined]
                raise OSError(errno.ENOSPC, "No space left on device")
            return insert(*args, **kwargs)  # type: ignore[arg-type]

        writer.insert_batch = full_disk_insert  # type: ignore[assignment]
    writer.disk_full_marker = marker  # type: ignore[attr-defined]
    return 1


class FullDisk:
    """A metadata value that fills the service's disk where it is unpickled while its marker exists."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return fill_disk_while, (self.marker,)


@pytest.mark.process
def test_a_disk_fault_pauses_recording_and_drops_nothing(tmp_path: Path) -> None:
    from xdb.writer_failure import FILE, is_disk_fault

    assert is_disk_fault(OSError(28, "No space left on device"))
    assert not is_disk_fault(ValueError("bad row"))
    marker = tmp_path / "disk-full"
    marker.touch()
    with RemoteXDB(tmp_path / "x") as xdb:
        xdb.writer.submit([TimestepRow("s", 0, "input", "user", "kept", metadata={"a": FullDisk(marker)})])
        deadline = time.monotonic() + 60
        while xdb.writer.recording_state()[0] != "paused" and time.monotonic() < deadline:
            time.sleep(0.05)
        state, why = xdb.writer.recording_state()
        assert state == "paused" and "failed" in (why or "")
        assert not (tmp_path / "x" / FILE).exists()  # no row is suspected of a disk's fault
        time.sleep(2.5)  # it keeps failing: still paused, however often, never stopped
        assert xdb.writer.recording_state()[0] == "paused" and xdb.writer.alive
        marker.unlink()  # the disk has room again
        xdb.writer.flush(60)
        assert xdb.writer.recording_state() == ("recording", None)
        assert [r["content"] for r in xdb.recall(session_id="s", owner=EVERY)] == ["kept"]
