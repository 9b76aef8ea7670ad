"""One XDB service, several writers: the owner (which spawns and restarts the service) and processes attached
to it, each on a stream of its own, each told the commits of its own rows; an attached writer that closes or
dies ends nothing else, and one whose service is killed waits for the owner's next run and sends its rows again."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from core.config import XDBConfig
from xdb import XDB, RemoteXDB, TimestepRow, TokenBatch, WriterStopped, verify_audit
from xdb.owner import EVERY
from xdb.service import service as xdb_service
from xdb.service.link import ServiceLink, new_spec, remove_spec
from xdb.service.service import ServiceSpec

TEXT = "hello world, and hello again"


def rows(xdb: RemoteXDB | XDB, session: str, n: int) -> list[TimestepRow]:
    return [TimestepRow(session, t, "input", "user", f"{session}{t}") for t in xdb.next_ticks(session, n)]


def ticks(xdb: RemoteXDB, session: str) -> list[int]:
    return [r["tick"] for r in xdb.recall(session_id=session, limit=10_000, owner=EVERY)]


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def spawn_service(data_dir: Path) -> tuple[ServiceSpec, multiprocessing.process.BaseProcess]:
    """A run of the service with no owner's stream yet: the test stands in for the owner."""
    data_dir.mkdir(parents=True, exist_ok=True)
    spec = new_spec(data_dir, XDBConfig())
    ctx = multiprocessing.get_context("spawn")
    status, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=xdb_service.main, args=(spec, child), daemon=True)
    process.start()
    child.close()
    assert status.poll(60) and status.recv() == ("ready", None)
    return spec, process


@pytest.mark.process
def test_the_owner_and_an_attached_writer_write_at_once_each_row_stored_once(tmp_path: Path) -> None:
    with RemoteXDB(tmp_path / "x") as owner, RemoteXDB(tmp_path / "x", attach=owner.service_spec) as attached:
        assert attached.writer.process.spec == owner.service_spec
        accepted = {"owner": 0, "attached": 0}
        start = threading.Barrier(2)

        def write(xdb: RemoteXDB, name: str) -> None:
            start.wait()
            for i in range(60):
                xdb.writer.submit(rows(xdb, name, 1 + i % 3))
                accepted[name] += 1 + i % 3
                time.sleep(0.002)
            xdb.writer.flush(30)

        threads = [threading.Thread(target=write, args=(owner, "owner")),
                   threading.Thread(target=write, args=(attached, "attached"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert owner.writer.rows_written == accepted["owner"] and owner.writer.queue_depth() == 0
        assert attached.writer.rows_written == accepted["attached"] and attached.writer.queue_depth() == 0
        for name in accepted:
            assert ticks(owner, name) == list(range(accepted[name]))  # each once
        assert attached.writer.restarts == owner.writer.restarts == 0
    assert verify_audit(tmp_path / "x").ok


@pytest.mark.process
def test_an_attached_writer_closing_ends_its_stream_alone_and_the_owner_closing_ends_the_service(
        tmp_path: Path) -> None:
    owner = RemoteXDB(tmp_path / "x")
    spec = owner.service_spec
    service = owner.writer.process.process
    with RemoteXDB(tmp_path / "x", attach=spec) as attached:
        attached.writer.submit(rows(attached, "a", 3))
    assert attached.writer.rows_written == 3  # closing committed what it accepted
    time.sleep(0.3)
    assert service.is_alive()
    owner.writer.submit(rows(owner, "o", 2))
    owner.writer.flush(10)
    assert ticks(owner, "a") == [0, 1, 2] and ticks(owner, "o") == [0, 1]

    # An attached process killed outright: the rows it had sent are committed, and the service goes on.
    killed = ServiceLink(spec)
    killed.stream.send(("rows", [rows(owner, "k", 4)], False))
    killed.kill()
    wait_for(lambda: ticks(owner, "k") == [0, 1, 2, 3], 10)
    assert service.is_alive()

    late = RemoteXDB(tmp_path / "x", attach=spec, reconnect_timeout_s=0.5)
    owner.close()
    assert service.exitcode == 0 and not Path(spec.address).parent.exists()
    wait_for(lambda: late.writer.recording_state()[0] == "stopped", 10)  # its service is gone for good
    with pytest.raises(WriterStopped):
        late.close()


@pytest.mark.process
def test_a_killed_service_is_restarted_by_the_owner_and_both_writers_send_their_rows_again(
        tmp_path: Path, tokenizer: Any) -> None:
    config = XDBConfig(max_latency_s=60.0)  # nothing commits before the kill but what is flushed
    with RemoteXDB(tmp_path / "x", config) as owner, \
            RemoteXDB(tmp_path / "x", config, attach=owner.service_spec) as attached:
        # Only the attached writer ships ids without texts: it alone tells the next run its tokenizer.
        attached.decode_tokens_with(tokenizer.backend_tokenizer.to_str())
        ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
        owner.writer.submit(rows(owner, "o", 3))
        attached.writer.submit(TokenBatch("a", attached.next_ticks("a", len(ids)), None, token_ids=ids))
        owner.writer.flush(10)
        attached.writer.flush(10)
        first = owner.writer.process.process.pid
        for _ in range(10):  # held, uncommitted, when the service dies
            owner.writer.submit(rows(owner, "o", 2))
            attached.writer.submit(rows(attached, "b", 2))
        time.sleep(0.3)  # sent
        assert owner.writer.queue_depth() == attached.writer.queue_depth() == 20
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: attached.writer.restarts == 1 and owner.writer.restarts == 1)
        attached.writer.submit(TokenBatch("a", attached.next_ticks("a", len(ids)), None, token_ids=ids))
        owner.writer.submit(rows(owner, "o", 1))
        owner.writer.flush(30)
        attached.writer.flush(30)
        assert owner.writer.process.process.pid != first
        assert owner.writer.rows_written == 24 and attached.writer.rows_written == 2 * len(ids) + 20
        assert ticks(owner, "o") == list(range(24)) and ticks(owner, "b") == list(range(20))
        contents = [r["content"] for r in owner.recall(session_id="a", limit=1000, owner=EVERY)]
        assert "".join(contents) == TEXT * 2  # the held batch decoded by the next run too
        assert owner.writer.recording_state() == attached.writer.recording_state() == ("recording", None)
    assert verify_audit(tmp_path / "x").ok


@pytest.mark.process
def test_a_stream_may_connect_before_the_owners(tmp_path: Path) -> None:
    spec, process = spawn_service(tmp_path / "x")
    try:
        with RemoteXDB(tmp_path / "x", attach=spec) as early:
            early.writer.submit(rows(early, "e", 2))
            early.writer.flush(10)
            owner = ServiceLink(spec, owner=True)  # the owner's stream, after
            early.writer.submit(rows(early, "e", 2))
            early.writer.flush(10)
            assert early.writer.rows_written == 4
        assert process.is_alive()  # the attached writer's closing ended its stream alone
        owner.stop()  # the owner's closing ends the service
        process.join(30)
        assert process.exitcode == 0
    finally:
        if process.is_alive():
            process.kill()
        remove_spec(spec)
    with XDB.open(tmp_path / "x") as xdb:
        assert [r["tick"] for r in xdb.recall(session_id="e", owner=EVERY)] == [0, 1, 2, 3]


@pytest.mark.process
def test_an_attached_writer_whose_service_never_comes_back_stops_clearly(tmp_path: Path) -> None:
    spec, process = spawn_service(tmp_path / "x")
    try:
        attached = RemoteXDB(tmp_path / "x", attach=spec, reconnect_timeout_s=1.0)
        attached.writer.submit(rows(attached, "s", 2))
        attached.writer.flush(10)
        attached.writer.submit(rows(attached, "s", 2))
        process.kill()  # and no owner starts it again
        wait_for(lambda: attached.writer.recording_state()[0] == "stopped", 15)
        assert "no XDB service answered" in (attached.writer.recording_state()[1] or "")
        with pytest.raises(WriterStopped):
            attached.writer.submit(rows(attached, "s", 1))
        with pytest.raises(WriterStopped, match="no XDB service answered"):
            attached.close()
    finally:
        process.kill()
        remove_spec(spec)
    with pytest.raises(WriterStopped, match="no XDB service answered"):  # nor does attaching wait forever
        RemoteXDB(tmp_path / "x", attach=spec, reconnect_timeout_s=0.3)
