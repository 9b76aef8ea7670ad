"""XDB on real DuckDB files: writing, recall filters, tags, documents, fidelity, compression, reopen."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest

from core.config import XDBConfig
from core.errors import InvalidRequest
from xdb import XDB, DocumentTooLarge, NotFound, QuotaExceeded, RecallFilterError, TimestepRow
from xdb.documents import document_versions, get_document, list_documents
from xdb.owner import EVERY
from xdb.run_history import HISTORY_TABLES
from xdb.runs import list_interactions, log_interaction, meta_knowledge, purge_run, save_meta_knowledge
from xdb.session_state import KEEP_VERSIONS
from xdb.storage.compression import cold_records
from xdb.storage.fidelity import resolve_submission, submit_evidence
from xdb.tags import list_buds, set_bud_status

# A run's purge also counts its history across runs (xdb/run_history.py): none in these tests.
NO_HISTORY = dict.fromkeys(HISTORY_TABLES, 0)


def reply(xdb: XDB, session: str, words: list[str], request: str, acts: dict | None = None) -> list[TimestepRow]:
    ticks = xdb.next_ticks(session, len(words))
    return [TimestepRow(session, t, "output", "assistant", w, token_id=i, request_id=request,
                        concept_activations=dict(acts or {}), activation_source="hidden_state" if acts else None)
            for i, (t, w) in enumerate(zip(ticks, words))]


def test_rows_round_trip_with_activations_and_reply_concatenates(xdb: XDB) -> None:
    [tick] = xdb.next_ticks("s1", 1)
    xdb.writer.submit([TimestepRow("s1", tick, "input", "user", "Hi there", request_id="r1", metadata={"n": 1})])
    xdb.writer.submit(reply(xdb, "s1", ["Hel", "lo", " world"], "r1", {"joy": 0.75, "fear": 0.25}))
    xdb.writer.flush()
    rows = xdb.recall(session_id="s1", owner=EVERY)
    assert [r["tick"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["concept_activations"] == {} and rows[0]["metadata"] == {"n": 1}
    assert rows[1]["concept_activations"] == {"joy": 0.75, "fear": 0.25}
    assert "".join(r["content"] for r in rows if r["event_type"] == "output") == "Hello world"
    assert {"id", "session_id", "tick", "event_type", "content", "concept_activations", "tags", "role",
            "token_id", "request_id"} <= set(rows[0])
    assert xdb.writer.rows_written == 4 and xdb.writer.queue_depth() == 0


def test_each_recall_filter(xdb: XDB) -> None:
    xdb.writer.submit(reply(xdb, "a", ["alpha", "Beta", "gamma"], "ra", {"joy": 0.9}))
    xdb.writer.submit(reply(xdb, "b", ["delta", "50%_off"], "rb", {"fear": 0.4, "joy": 0.2}))
    [t] = xdb.next_ticks("b", 1)
    xdb.writer.submit([TimestepRow("b", t, "tool_call", "assistant", "run_prediction()")])
    xdb.writer.flush()
    assert len(xdb.recall(session_id="a", owner=EVERY)) == 3
    assert [r["content"] for r in xdb.recall(event_types=["tool_call"], owner=EVERY)] == ["run_prediction()"]
    assert [r["content"] for r in xdb.recall(text="beta", owner=EVERY)] == ["Beta"]
    assert [r["content"] for r in xdb.recall(text="%_", owner=EVERY)] == ["50%_off"]  # LIKE characters are literal
    assert [r["tick"] for r in xdb.recall(session_id="a", tick_from=1, tick_to=1, owner=EVERY)] == [1]
    assert len(xdb.recall(concept="fear", owner=EVERY)) == 2
    assert [r["session_id"] for r in xdb.recall(concept="joy", min_activation=0.5, owner=EVERY)] == ["a"] * 3
    assert xdb.recall(concept="no-such-concept", owner=EVERY) == []
    assert len(xdb.recall(limit=2, owner=EVERY)) == 2
    xdb.tag("odd", session_id="a", tick=1, owner=EVERY)
    assert [r["content"] for r in xdb.recall(tags=["odd"], owner=EVERY)] == ["Beta"]
    assert xdb.recall(tags=["never-made"], owner=EVERY) == []


@pytest.mark.parametrize("bad, param", [({"limit": 0}, "limit"), ({"tick_from": -1}, "tick_from"),
                                        ({"tick_from": 5, "tick_to": 2}, "tick_from"), ({"colour": "red"}, "colour"),
                                        ({"min_activation": "high"}, "min_activation"), ({"text": " "}, "text")])
def test_bad_recall_filter_names_it(xdb: XDB, bad: dict, param: str) -> None:
    with pytest.raises(RecallFilterError) as err:
        xdb.recall(bad, owner=EVERY)
    assert err.value.param == param and param in str(err.value)


def test_tags_by_name_or_id_events_ranges_and_missing_targets(xdb: XDB) -> None:
    xdb.writer.submit(reply(xdb, "s", ["a", "b", "c", "d"], "r1"))
    app = xdb.tag("curious", session_id="s", tick=2, owner=EVERY)  # still queued: tag flushes the writer first
    assert app["target_type"] == "timestep"
    same = xdb.tag(app["tag"]["id"], event_id="r1", owner=EVERY)
    assert same["tag"]["name"] == "curious"
    xdb.tag("later", session_id="s", tick_range=(2, 3), owner=EVERY)
    tags = {r["tick"]: r["tags"] for r in xdb.recall(session_id="s", owner=EVERY)}
    assert tags == {0: ["curious"], 1: ["curious"], 2: ["curious", "later"], 3: ["curious", "later"]}
    with pytest.raises(NotFound):
        xdb.tag("x", timestep_id=10_000, owner=EVERY)
    with pytest.raises(NotFound):
        xdb.tag("x", session_id="s", tick=99, owner=EVERY)
    with pytest.raises(NotFound):
        xdb.comment("hm", event_id="no-such-request", owner=EVERY)
    with pytest.raises(ValueError):
        xdb.tag("x", owner=EVERY)
    assert xdb.comment("worth a look", session_id="s", tick_range=(0, 1), owner=EVERY)["target_type"] == "range"


def test_buds_and_concepts(xdb: XDB) -> None:
    xdb.writer.submit(reply(xdb, "s", ["x"], "r", {"honesty": 0.5}))
    xdb.writer.flush()
    xdb.tag("curiosity-x", tag_type="bud", session_id="s", tick=0, owner=EVERY)
    buds = xdb.read(list_buds)
    assert [(b["name"], b["bud_status"], b["examples"]) for b in buds] == [("curiosity-x", "candidate", 1)]
    xdb.write(set_bud_status, "curiosity-x", "ready", 1)
    assert [b["name"] for b in xdb.read(list_buds, "ready")] == ["curiosity-x"]
    assert xdb.read(list_buds, "candidate") == []
    with pytest.raises(ValueError):
        xdb.read(list_buds, "ripe")
    assert [c["name"] for c in xdb.concepts_list()] == ["honesty"]


def test_documents_are_versioned_with_sha256_and_size_limited(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "d", XDBConfig(max_document_bytes=100)) as xdb:
        doc = xdb.add_document("policy", "be kind", doc_type="tribal_policy", path="policies/kind.md", owner=EVERY)
        assert doc["version"] == 1 and len(doc["content_hash"]) == 64
        new = xdb.update_document(doc["id"], "be kind, always")
        assert new["version"] == 2 and new["content_hash"] != doc["content_hash"] and new["path"] == "policies/kind.md"
        assert xdb.read(get_document, doc["id"], version=1)["content"] == "be kind"
        assert xdb.read(get_document, path="policies/kind.md")["content"] == "be kind, always"
        assert [d["version"] for d in xdb.read(list_documents, owner=EVERY)] == [2]
        assert [v["version"] for v in xdb.read(document_versions, doc["id"])] == [1, 2]
        with pytest.raises(DocumentTooLarge):
            xdb.add_document("big", "x" * 101, owner=EVERY)
        with pytest.raises(NotFound):
            xdb.read(get_document, "doc-missing")
        with pytest.raises(ValueError):
            xdb.add_document("bad", "x", doc_type="poem", owner=EVERY)


def test_ticks_resume_after_reopen_and_asubmit(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        asyncio.run(xdb.writer.asubmit(reply(xdb, "s", ["a", "b", "c"], "r")))
    with XDB.open(tmp_path / "x") as xdb:
        assert list(xdb.next_ticks("s", 2)) == [3, 4]
        assert list(xdb.next_ticks("new", 1)) == [0]
        assert len(xdb.recall(session_id="s", owner=EVERY)) == 3


def test_backpressure_blocks_then_raises(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "bp", XDBConfig(max_queue_rows=10, max_latency_s=30, batch_rows=1000)) as xdb:
        xdb.writer.submit(reply(xdb, "s", ["w"] * 8, "r"))
        assert not xdb.writer.try_submit(reply(xdb, "s", ["w"] * 5, "r"))
        from xdb import WriterBackpressure
        with pytest.raises(WriterBackpressure):
            xdb.writer.submit(reply(xdb, "s", ["w"] * 5, "r"), timeout=0.2)
        xdb.writer.flush()
        assert xdb.writer.try_submit(reply(xdb, "s", ["w"] * 5, "r"))


def test_too_many_activations_rejected_at_submit(xdb: XDB) -> None:
    with pytest.raises(ValueError, match="k=10"):
        xdb.writer.submit([TimestepRow("s", 0, "output", content="x",
                                       concept_activations={f"c{i}": 0.1 for i in range(11)})])


def test_foreign_and_corrupt_files_are_refused_untouched(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    con = duckdb.connect(str(foreign / "experience.duckdb"))
    con.execute("CREATE TABLE invoices (id INTEGER)")
    con.close()
    with pytest.raises(ValueError, match="another program"):
        XDB.open(foreign)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "experience.duckdb").write_bytes(b"not a database at all" * 500)
    before = (corrupt / "experience.duckdb").read_bytes()
    with pytest.raises(ValueError, match="refusing"):
        XDB.open(corrupt)
    assert (corrupt / "experience.duckdb").read_bytes() == before


def test_pin_quota_compaction_and_compression(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "c", XDBConfig(quota_bytes=10_000_000, warm_quota_bytes=2_000)) as xdb:
        for i in range(4):
            xdb.writer.submit(reply(xdb, "old", [f"Word{i} number {j}. " for j in range(10)], f"r{i}",
                                    {"joy": 0.5, f"c{i}": 0.2}))
        xdb.writer.flush()
        pinned = xdb.pin("old", 0, 9, "bud:joy")  # the first reply stays at full detail
        assert pinned["fidelity"] == "warm"
        with pytest.raises(QuotaExceeded):
            xdb.pin("old", 10, 39)
        xdb.tag("keep-me", session_id="old", tick=15, owner=EVERY)
        tiers = xdb.state()["fidelity"]
        assert (tiers["warm"], tiers["hot"], tiers["released"]) == (10, 30, 0)  # nothing compacted yet
        out = xdb.compact("old", up_to_tick=29, compress_released=True)
        assert out["compaction"]["range_end"] == 29
        # replies 2 and 3 (ticks 10..29) compress; the pinned reply and the still-HOT one stay
        assert len(out["compressed_record_ids"]) == 2
        ticks = [r["tick"] for r in xdb.recall(session_id="old", limit=1000, owner=EVERY)]
        assert ticks == list(range(10)) + list(range(30, 40))
        cold = xdb.read(cold_records, "old")
        assert [c["level"] for c in cold] == ["reply", "reply"]
        assert cold[0]["top_k_activations"]["joy"] == pytest.approx(5.0) and cold[0]["significant_tags"] == ["keep-me"]
        assert cold[0]["summary"] and cold[0]["token_count"] == 10
        # Over a tiny quota, REPLY records merge into a SESSION record, then coarser.
        xdb.quota_bytes = 1
        xdb.compact()
        levels = [c["level"] for c in xdb.read(cold_records)]
        assert levels and all(level not in ("reply",) for level in levels)
        assert len(xdb.recall(session_id="old", limit=1000, owner=EVERY)) == 20  # protected rows survive any quota


def test_submission_evidence_locks_then_releases(xdb: XDB) -> None:
    xdb.writer.submit(reply(xdb, "s", ["a", "b", "c"], "r"))
    xdb.tag("bud-1", tag_type="bud", session_id="s", tick_range=(0, 2), owner=EVERY)
    xdb.write(set_bud_status, "bud-1", "ready", 1)
    [window] = xdb.write(submit_evidence, "bud-1", "sub-9")
    assert window["fidelity"] == "submitted" and window["submission_ids"] == ["sub-9"]
    xdb.compact("s", compress_released=True)
    assert len(xdb.recall(session_id="s", owner=EVERY)) == 3  # evidence is never compressed
    [released] = xdb.write(resolve_submission, "sub-9", accepted=False)
    assert released["fidelity"] == "warm" and not released["pinned"]
    xdb.compact(compress_released=True)
    assert xdb.recall(session_id="s", owner=EVERY) == []


def test_session_state_and_agent_tables(xdb: XDB) -> None:
    assert xdb.load_session_state("s") is None
    assert xdb.save_session_state("s", '{"blocks": 1}') == 1
    assert xdb.save_session_state("s", '{"blocks": 1}') == 1  # unchanged: no new version
    assert xdb.save_session_state("s", '{"blocks": 2}') == 2
    assert xdb.load_session_state("s") == '{"blocks": 2}' and xdb.load_session_state("s", 1) == '{"blocks": 1}'
    for n in range(3, 3 + KEEP_VERSIONS):  # an hours-long session keeps only its recent snapshots
        xdb.save_session_state("s", f'{{"blocks": {n}}}')
    last = 2 + KEEP_VERSIONS
    assert xdb.load_session_state("s") == f'{{"blocks": {last}}}'
    assert xdb.load_session_state("s", last - KEEP_VERSIONS + 1) is not None
    assert xdb.load_session_state("s", last - KEEP_VERSIONS) is None and xdb.load_session_state("s", 1) is None
    first = xdb.write(log_interaction, "run", journal_entry="saw AA_BB", token_count=5)
    xdb.write(log_interaction, "run", tool_call_json='{"tool": "observe"}')
    assert [t["turn_id"] for t in xdb.read(list_interactions, "run", pattern="AA_BB")] == [first]
    assert len(xdb.read(list_interactions, "run", last=1)) == 1
    xdb.write(save_meta_knowledge, "run", theorems_json="[]", last_compacted_turn=first)
    v2 = xdb.write(save_meta_knowledge, "run", theorems_json='["A moves right"]')
    assert xdb.read(meta_knowledge, "run")[0]["version_id"] == v2


def test_purge_run_deletes_only_that_run(xdb: XDB) -> None:
    xdb.write(log_interaction, "gone", journal_entry="a")
    xdb.write(log_interaction, "gone", journal_entry="b")
    xdb.write(save_meta_knowledge, "gone", theorems_json="[]")
    kept = xdb.write(log_interaction, "kept", journal_entry="c")
    xdb.write(save_meta_knowledge, "kept", theorems_json="[]")
    assert xdb.write(purge_run, "gone") == {"interaction_log": 2, "meta_knowledge": 1, **NO_HISTORY}
    assert xdb.read(list_interactions, "gone") == [] and xdb.read(meta_knowledge, "gone") == []
    assert [t["turn_id"] for t in xdb.read(list_interactions, "kept")] == [kept]
    assert len(xdb.read(meta_knowledge, "kept")) == 1
    assert xdb.write(purge_run, "gone") == {"interaction_log": 0, "meta_knowledge": 0, **NO_HISTORY}


def test_a_tag_is_named_by_a_str_and_identified_by_an_int(xdb: XDB) -> None:
    xdb.writer.submit(reply(xdb, "s", ["a", "b"], "r1"))
    first = xdb.tag("first", session_id="s", tick=0, owner=EVERY)["tag"]
    digits = xdb.tag(str(first["id"]), session_id="s", tick=1, owner=EVERY)["tag"]
    assert digits["name"] == str(first["id"]) and digits["id"] != first["id"]
    assert xdb.write(set_bud_status, first["id"], "candidate")["name"] == "first"
    assert xdb.write(set_bud_status, str(first["id"]), "candidate")["id"] == digits["id"]
    with pytest.raises(InvalidRequest):
        xdb.write(set_bud_status, True, "candidate")  # type: ignore[arg-type]


def test_tick_counters_are_bounded_and_a_dropped_session_resumes_after_its_last_tick(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "xdb", XDBConfig(max_tick_sessions=2)) as xdb:
        for i in range(6):
            ticks = xdb.next_ticks(f"s{i}", 3)
            xdb.writer.submit([TimestepRow(f"s{i}", t, "output", "assistant", "w") for t in ticks])
            xdb.writer.flush()
        assert len(xdb._ticks) <= 2
        assert xdb.next_ticks("s0", 2) == range(3, 5)  # s0 was dropped: resumed from the file's last tick
        # Ticks reserved but not yet committed keep their session in memory past the bound.
        pending = xdb.next_ticks("s1", 1)
        for i in range(6, 9):
            xdb.next_ticks(f"s{i}", 1)
        assert xdb.next_ticks("s1", 1) == range(pending.stop, pending.stop + 1)
    with XDB.open(tmp_path / "xdb", XDBConfig(max_tick_sessions=2)) as reopened:
        assert reopened.next_ticks("s5", 1) == range(3, 4)


def test_a_session_just_made_starts_at_tick_0_without_a_lookup(xdb: XDB, monkeypatch: pytest.MonkeyPatch) -> None:
    xdb.writer.submit(reply(xdb, "known", ["a", "b", "c"], "r1"))
    xdb.writer.flush()
    lookups: list[str] = []
    committed = xdb.committed_tick
    monkeypatch.setattr(xdb._ticks, "_lookup", lambda sid: lookups.append(sid) or committed(sid))
    xdb.start_session("fresh")
    assert list(xdb.next_ticks("fresh", 2)) == [0, 1] and lookups == []
    xdb.start_session("fresh")  # a second call never rewinds a session's ticks
    assert list(xdb.next_ticks("fresh", 1)) == [2]
    xdb.start_session("known")  # nor does one on a session with rows
    assert list(xdb.next_ticks("known", 1)) == [3]
