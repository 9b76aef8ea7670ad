"""The writer's columnar path (TokenBatch), batches cut across submits, the audit-before-experience
commit order under failure, the canonical record format, and recall's tag paths."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from core.config import XDBConfig
from xdb import XDB, TimestepRow, TokenBatch, WriterStopped, verify_audit
from xdb.audit.canonical import canonical_array
from xdb.audit.log import AuditLog
from xdb.concepts import ConceptIndex
from xdb.owner import EVERY
from xdb.rows import batch_to_arrow, rows_to_arrow, to_arrow

NAMES = ["joy", "fear", "calm"]


def token_batch(xdb: XDB, session: str, words: list[str], request: str, index=None, values=None,
                **kw) -> TokenBatch:
    ticks = xdb.next_ticks(session, len(words))
    return TokenBatch(session, ticks, words, token_ids=np.arange(len(words)), request_id=request,
                      concept_names=NAMES if index is not None else (),
                      concept_index=None if index is None else np.asarray(index),
                      concept_values=None if values is None else np.asarray(values, dtype=np.float32), **kw)


def test_token_batch_round_trip_matches_timestep_rows(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        xdb.writer.submit(token_batch(xdb, "s", ["Hel", "lo", "!"], "r1", index=[[0, 1], [2, -1], [-1, -1]],
                                      values=[[0.5, 0.25], [0.75, 0], [0, 0]], activation_source="hidden_state",
                                      steering=[{"hush": 1}]))
        xdb.writer.submit(token_batch(xdb, "s", ["x"], "r2"))
        xdb.writer.flush()
        rows = xdb.recall(session_id="s", owner=EVERY)
        assert [r["content"] for r in rows] == ["Hel", "lo", "!", "x"]
        assert [r["tick"] for r in rows] == [0, 1, 2, 3] and [r["token_id"] for r in rows] == [0, 1, 2, 0]
        assert [r["concept_activations"] for r in rows] == [{"joy": 0.5, "fear": 0.25}, {"calm": 0.75}, {}, {}]
        assert rows[0]["event_type"] == "output" and rows[0]["role"] == "assistant"
        assert rows[0]["request_id"] == "r1" and rows[3]["request_id"] == "r2"
        assert [c["name"] for c in xdb.concepts_list()] == ["calm", "fear", "joy"]
        assert len(xdb.recall(concept="calm", min_activation=0.7, owner=EVERY)) == 1
        assert xdb.verify_audit().ok
    with XDB.open(tmp_path / "x") as xdb:
        assert list(xdb.next_ticks("s", 1)) == [4]  # session_ticks saw the batch


@pytest.mark.parametrize("session", ["it's", "nul\x00inside", "back\\slash ' é 😀", "'", "\x00"])
def test_each_sessions_last_tick_and_the_last_id_survive_a_reopen_whatever_the_session_id(
        tmp_path: Path, session: str) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        xdb.writer.submit(token_batch(xdb, session, ["a", "b", "c"], "r1"))
        xdb.writer.submit(token_batch(xdb, "plain", ["d"], "r2"))
        xdb.writer.flush()
        xdb.writer.submit(token_batch(xdb, session, ["e"], "r3"))
        xdb.writer.flush()
    with XDB.open(tmp_path / "x") as xdb:
        assert list(xdb.next_ticks(session, 1)) == [4] and list(xdb.next_ticks("plain", 1)) == [1]
        xdb.writer.submit(token_batch(xdb, "plain", ["f"], "r4"))
        xdb.writer.flush()
        assert [r["id"] for r in xdb.recall(owner=EVERY)] == [0, 1, 2, 3, 4, 5]  # ids go on from the last
        assert [r["content"] for r in xdb.recall(session_id=session, owner=EVERY)] == ["a", "b", "c", "e"]


def test_token_batch_and_rows_make_the_same_arrow_table() -> None:
    index = np.array([[0, 1], [2, -1], [-1, -1]])
    values = np.array([[0.5, 0.25], [0.75, 0], [0, 0]], dtype=np.float32)
    batch = TokenBatch("s", range(3), ["a", "b", "c"], [1, 2, 3], "r", concept_names=NAMES, concept_index=index,
                       concept_values=values, activation_source="hidden_state", created_at=12.5,
                       metadata={"m": 1}, steering=[{"v": 2}])
    rows = [TimestepRow("s", t, "output", "assistant", c, token_id=t + 1, request_id="r",
                        concept_activations=acts, activation_source="hidden_state", created_at=12.5,
                        metadata={"m": 1}, steering=[{"v": 2}])
            for t, (c, acts) in enumerate(zip("abc", [{"joy": 0.5, "fear": 0.25}, {"calm": 0.75}, {}]))]
    concepts = ConceptIndex([])
    from_batch, added = batch_to_arrow(batch, 7, concepts)
    from_rows, _ = rows_to_arrow(rows, 7, concepts)
    assert added == [(0, "joy"), (1, "fear"), (2, "calm")]
    assert from_batch.schema == from_rows.schema and from_batch.to_pylist() == from_rows.to_pylist()


@pytest.mark.parametrize("change, message", [
    (dict(ticks=[0, 1]), "ticks"),
    (dict(ticks=[0, -1, 2]), "ticks"),
    (dict(token_ids=[1]), "token_ids"),
    (dict(concept_values=None), "together"),
    (dict(concept_index=np.zeros((3, 11), int), concept_values=np.zeros((3, 11))), "k=10"),
    (dict(concept_index=np.array([[0, 0], [1, 2], [-1, -1]])), "twice"),
    (dict(concept_index=np.array([[0, 3], [1, 2], [-1, -1]])), "index into"),
    (dict(concept_names=["joy", "joy", "calm"]), "distinct"),
    (dict(session_id=""), "session_id"),
])
def test_bad_token_batches_fail_at_submit(tmp_path: Path, change: dict, message: str) -> None:
    fields = dict(session_id="s", ticks=[0, 1, 2], contents=["a", "b", "c"], token_ids=[1, 2, 3],
                  concept_names=NAMES, concept_index=np.array([[0, 1], [1, 2], [-1, -1]]),
                  concept_values=np.ones((3, 2)))
    with XDB.open(tmp_path / "x") as xdb:
        with pytest.raises(ValueError, match=message):
            xdb.writer.submit(TokenBatch(**{**fields, **change}))
        assert xdb.writer.queue_depth() == 0


def test_batches_cut_across_mixed_submits_keep_order_and_chain(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(batch_rows=7, max_latency_s=30)) as xdb:
        expected = []
        for i in range(6):
            words = [f"w{i}.{j}" for j in range(5)]
            if i % 2:
                xdb.writer.submit(token_batch(xdb, "s", words, f"r{i}", index=[[i % 3]] * 5, values=[[0.5]] * 5))
            else:
                ticks = xdb.next_ticks("s", 5)
                xdb.writer.submit([TimestepRow("s", t, "output", "assistant", w, request_id=f"r{i}")
                                   for t, w in zip(ticks, words)])
            expected += words
        xdb.writer.flush()
        rows = xdb.recall(session_id="s", limit=100, owner=EVERY)
        assert [r["content"] for r in rows] == expected
        assert [r["id"] for r in rows] == list(range(30)) and [r["tick"] for r in rows] == list(range(30))
        with xdb.cursor() as cur:
            assert cur.execute("SELECT count(*) FROM timesteps").fetchone()[0] == 30
    report = verify_audit(tmp_path / "x")
    assert report.ok and report.records_checked == 30


def test_a_batch_the_audit_refuses_never_reaches_the_experience_file(tmp_path: Path, monkeypatch) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        xdb.writer.submit(token_batch(xdb, "s", ["kept"], "r0"))
        xdb.writer.flush()

        def refuse(self, prepared):
            raise OSError("audit disk full")

        monkeypatch.setattr(AuditLog, "commit", refuse)
        xdb.writer.submit(token_batch(xdb, "s", ["lost", "too"], "r1"))
        with pytest.raises(WriterStopped, match="audit disk full"):
            xdb.writer.flush(timeout=10)
        with xdb.cursor() as cur:
            assert cur.execute("SELECT list(content ORDER BY id) FROM timesteps").fetchone()[0] == ["kept"]
        monkeypatch.undo()
        with pytest.raises(WriterStopped):
            xdb.close()
    with XDB.open(tmp_path / "x") as xdb:
        assert [r["content"] for r in xdb.recall(session_id="s", owner=EVERY)] == ["kept"]
        assert xdb.verify_audit().ok


def test_canonical_record_bytes_are_pinned() -> None:
    # The chain's input format is a file format: this digest changing means old audit logs no
    # longer verify.
    rows = [TimestepRow("s", 3, "output", "assistant", "hé", token_id=7, request_id="r",
                        concept_activations={"joy": 0.5}, activation_source="hidden_state", created_at=1.25,
                        metadata={"a": 1}, steering=[{"b": 2}]),
            TimestepRow("s", 4, "input", None, "", created_at=2.0)]
    table, _ = rows_to_arrow(rows, 10, ConceptIndex([]))
    table = table.rename_columns(["timestep_id" if c == "id" else c for c in table.column_names])
    table = table.append_column("seq", pa.array([0, 1], pa.int64()))
    records = canonical_array(table, 10).to_pylist()
    assert [len(r) for r in records] == [198, 156]
    assert hashlib.sha256(b"".join(records)).hexdigest() == PINNED_CANONICAL_SHA256


# Computed with the original per-field numpy layout (commit 2b0b52b) and the Arrow join alike.
PINNED_CANONICAL_SHA256 = "c0e7bf101d0c73a3bd9695e6c45f626595f4b6b0a0458d6601fb762720ed90f2"


def test_recall_tag_paths_combine_with_filters_and_dedupe(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        xdb.writer.submit(token_batch(xdb, "a", ["a0", "a1", "a2", "a3"], "ra"))
        xdb.writer.submit(token_batch(xdb, "b", ["b0", "b1", "b2"], "rb"))
        xdb.writer.flush()
        assert xdb.recall(tags=["hot"], owner=EVERY) == []
        xdb.tag("hot", event_id="rb", owner=EVERY)                            # every row of reply rb
        xdb.tag("hot", session_id="a", tick=1, owner=EVERY)                    # one row
        xdb.tag("hot", session_id="a", tick_range=(1, 2), owner=EVERY)         # overlaps the row above
        tid = xdb.create_tag("cold")["id"]
        xdb.tag(tid, session_id="b", tick=2, owner=EVERY)
        assert [r["content"] for r in xdb.recall(tags=["hot"], owner=EVERY)] == ["a1", "a2", "b0", "b1", "b2"]
        assert [r["content"] for r in xdb.recall(tags=["hot"], limit=2, owner=EVERY)] == ["a1", "a2"]
        assert [r["content"] for r in xdb.recall(tags=["hot"], session_id="b", text="1", owner=EVERY)] == ["b1"]
        assert [r["content"] for r in xdb.recall(tags=[str(tid)], owner=EVERY)] == ["b2"]
        assert [r["content"] for r in xdb.recall(tags=["cold", "nope"], owner=EVERY)] == ["b2"]
        tags = {r["content"]: r["tags"] for r in xdb.recall(limit=100, owner=EVERY)}
        assert tags == {"a0": [], "a1": ["hot"], "a2": ["hot"], "a3": [], "b0": ["hot"], "b1": ["hot"],
                        "b2": ["cold", "hot"]}
        assert [r["content"] for r in xdb.recall(tags=["hot"], event_types=["input"], owner=EVERY)] == []


def test_a_batch_the_experience_file_refuses_is_replayed_from_the_audit(tmp_path: Path, monkeypatch) -> None:
    import xdb.writer as writer

    with XDB.open(tmp_path / "x") as xdb:
        xdb.writer.submit(token_batch(xdb, "s", ["kept"], "r0"))
        xdb.writer.flush()
        real = writer.insert_batch

        def refuse(conn, table, added, thresholds=None):
            raise OSError("experience disk full")

        monkeypatch.setattr(writer, "insert_batch", refuse)
        xdb.writer.submit(token_batch(xdb, "s", ["late", "too"], "r1", index=[[0], [1]], values=[[0.5], [0.25]]))
        with pytest.raises(WriterStopped, match="experience disk full"):
            xdb.writer.flush(timeout=10)
        monkeypatch.setattr(writer, "insert_batch", real)
        with pytest.raises(WriterStopped):
            xdb.close()
    with XDB.open(tmp_path / "x") as xdb:  # the audit committed it: the open replays it
        rows = xdb.recall(session_id="s", owner=EVERY)
        assert [r["content"] for r in rows] == ["kept", "late", "too"]
        assert rows[1]["concept_activations"] == {"joy": 0.5} and rows[2]["concept_activations"] == {"fear": 0.25}
        assert xdb.verify_audit().ok


def test_token_batch_without_created_at_is_stamped_at_submit(tmp_path: Path) -> None:
    import datetime
    import time

    with XDB.open(tmp_path / "x", XDBConfig(max_latency_s=30)) as xdb:
        before = time.time()
        batch = token_batch(xdb, "s", ["a", "b"], "r")
        xdb.writer.submit(batch)
        assert batch.created_at is None  # the caller's batch is left as it was
        time.sleep(0.3)
        xdb.writer.flush()
        stamps = [datetime.datetime.fromisoformat(r["created_at"].rstrip("Z")).replace(
            tzinfo=datetime.UTC).timestamp() for r in xdb.recall(session_id="s", owner=EVERY)]
        assert all(before - 1 <= t <= before + 0.25 for t in stamps), (before, stamps)


def test_rows_into_an_idle_writer_commit_within_the_latency_bound(tmp_path: Path) -> None:
    import time

    with XDB.open(tmp_path / "x", XDBConfig(max_latency_s=0.25)) as xdb:
        time.sleep(0.3)  # the writer is idle, asleep without a timeout
        xdb.writer.submit(token_batch(xdb, "s", ["a"], "r"))
        deadline = time.monotonic() + 2.0
        while xdb.writer.rows_written < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert xdb.writer.rows_written == 1  # no flush: the 250 ms bound alone committed it


def test_flushes_during_a_commit_share_the_next_batch(tmp_path: Path, monkeypatch) -> None:
    import threading
    import time

    gate, batch_sizes = threading.Event(), []
    real = AuditLog.commit

    def slow(self, prepared, *args, **kwargs):
        gate.wait(10)
        batch_sizes.append(prepared.seq_end - prepared.seq_start + 1)
        return real(self, prepared, *args, **kwargs)

    with XDB.open(tmp_path / "x", XDBConfig(max_latency_s=30)) as xdb:
        monkeypatch.setattr(AuditLog, "commit", slow)
        xdb.writer.submit(token_batch(xdb, "s", ["first"], "r0"))
        xdb.writer.request_flush()
        time.sleep(0.2)  # the first batch is taken and held in its commit
        for i in range(3):  # three replies end while it commits
            xdb.writer.submit(token_batch(xdb, f"s{i}", ["a", "b"], f"r{i + 1}"))
            xdb.writer.request_flush()
            time.sleep(0.05)
        gate.set()
        xdb.writer.flush(timeout=10)
        assert batch_sizes == [1, 6]  # one commit for all three, not one each
        assert xdb.writer.rows_written == 7


@pytest.mark.process
def test_interleaved_streams_convert_in_arrival_order_in_one_table() -> None:
    names = ["a", "b", "c"]

    def token(stream: str, tick: int, acts: bool) -> TokenBatch:
        index = np.array([[tick % 3, (tick + 1) % 3]], dtype=np.int32) if acts else None
        values = np.array([[tick + 0.5, -tick]], dtype=np.float32) if acts else None
        return TokenBatch(stream, [tick], [f"{stream}{tick}"], token_ids=[tick], request_id=f"r-{stream}",
                          concept_names=names if acts else (), concept_index=index, concept_values=values,
                          activation_source="hidden_state" if acts else None, created_at=1000.0 + tick)

    parts = [token("s", 0, True), token("t", 0, False), token("s", 1, True), token("t", 1, False),
             [TimestepRow(session_id="s", tick=2, event_type="tool_call", role="assistant", content="call")],
             token("s", 3, True), token("t", 2, False), token("s", 4, True)]
    table, _ = to_arrow(parts, 1, ConceptIndex([]))
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == list(range(1, 9))
    assert [(r["session_id"], r["tick"]) for r in rows] == [
        ("s", 0), ("t", 0), ("s", 1), ("t", 1), ("s", 2), ("s", 3), ("t", 2), ("s", 4)]
    by_tick = {(r["session_id"], r["tick"]): r for r in rows}
    assert by_tick[("s", 3)]["concept_values"][:2] == [3.5, -3.0] and by_tick[("s", 3)]["token_id"] == 3
    assert by_tick[("t", 1)]["concept_ids"] is None and by_tick[("t", 1)]["content"] == "t1"
    assert [r["event_type"] for r in rows].index("tool_call") == 4  # nothing crossed the row list
