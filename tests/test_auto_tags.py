"""Automatic tags: a token whose concept activation reaches the lens pack's threshold is tagged (source
`auto`) as it is written, its parent concept gets an `inherited` range tag over the reply, and recall
by tag finds both; the thresholds travel in the pack."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lens.pack import LensPack, load_pack, save_pack
from xdb import XDB, TimestepRow
from xdb.owner import EVERY

HIERARCHY = [{"id": "motion", "name": "Motion", "parent": None, "threshold": None},
             {"id": "right", "name": "Moves right", "parent": "motion", "threshold": 0.5},
             {"id": "left", "name": "Moves left", "parent": "motion", "threshold": 0.5},
             {"id": "count", "name": "Counting", "parent": None, "threshold": None}]


def reply(xdb: XDB, session: str, request: str, acts: list[dict[str, float]]) -> None:
    xdb.writer.submit([TimestepRow(session, t, "output", "assistant", f"w{t}", request_id=request,
                                   concept_activations=a, activation_source="hidden_state")
                       for t, a in zip(xdb.next_ticks(session, len(acts)), acts)])


def test_tokens_over_a_threshold_are_tagged_as_written(xdb: XDB) -> None:
    reply(xdb, "s", "r0", [{"right": 0.9}])  # before the pack is registered: never tagged
    xdb.writer.flush()
    xdb.register_concepts(HIERARCHY)
    reply(xdb, "s", "r1", [{"right": 0.2, "count": 0.9}, {"right": 0.7}, {"left": 0.5}, {"right": 0.1}])
    reply(xdb, "s", "r2", [{"left": 0.4}, {"count": 3.0}])
    xdb.writer.flush()
    right = xdb.recall({"tags": "right"}, owner=EVERY)
    assert [(r["tick"], r["content"]) for r in right] == [(2, "w2")]
    assert [r["tick"] for r in xdb.recall({"tags": "left"}, owner=EVERY)] == [3]
    # The parent over the span of each reply where a child fired: ticks 2..3 of r1, nothing in r2.
    assert [r["tick"] for r in xdb.recall({"tags": "motion"}, owner=EVERY)] == [2, 3]
    assert xdb.recall({"tags": "count"}, owner=EVERY) == []  # no threshold: never automatic
    sources = xdb.conn.execute("SELECT source, target_type, count(*) FROM tag_applications "
                               "GROUP BY ALL ORDER BY ALL").fetchall()
    assert sources == [("auto", "timestep", 2), ("inherited", "range", 1)]
    assert "right" in xdb.recall({"session_id": "s", "tick_from": 2, "tick_to": 2}, owner=EVERY)[0]["tags"]


def test_a_batch_below_every_threshold_runs_no_tag_query(xdb: XDB, monkeypatch: pytest.MonkeyPatch) -> None:
    from xdb import auto_tags

    xdb.register_concepts([*HIERARCHY[:2], {**HIERARCHY[2], "threshold": 0.75}, HIERARCHY[3]])
    assert xdb.writer.auto_tag_floor == 0.5  # the lowest threshold
    queries: list[int] = []
    real = auto_tags.insert
    monkeypatch.setattr(auto_tags, "insert", lambda conn, fired: queries.append(len(fired)) or real(conn, fired))
    reply(xdb, "s", "r1", [{"right": 0.49, "count": 0.3}, {}])
    xdb.writer.flush()
    assert queries == [] and len(xdb.recall({"session_id": "s"}, owner=EVERY)) == 2
    reply(xdb, "s", "r2", [{"right": 0.5}])  # exactly the threshold: tagged
    xdb.writer.flush()
    assert queries == [1] and [r["tick"] for r in xdb.recall({"tags": "right"}, owner=EVERY)] == [2]


def test_thresholds_survive_a_restart_and_a_pack_without_them_turns_tagging_off(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        xdb.register_concepts(HIERARCHY)
    with XDB.open(tmp_path / "x") as xdb:
        reply(xdb, "s", "r", [{"right": 0.8}])
        xdb.writer.flush()
        assert len(xdb.recall({"tags": "right"}, owner=EVERY)) == 1
        xdb.register_concepts([{**c, "threshold": None} for c in HIERARCHY])
        reply(xdb, "s", "r2", [{"right": 0.8}])
        xdb.writer.flush()
        assert len(xdb.recall({"tags": "right"}, owner=EVERY)) == 1  # the new row is not tagged
        concepts = {c["name"]: c for c in xdb.concepts_list()}
        assert concepts["right"]["auto_tag_threshold"] is None


def pack(thresholds: list[float | None] | None) -> LensPack:
    return LensPack(concept_ids=["a", "b"], names=["A", "B"], layer=1, directions=np.eye(2, 4),
                    biases=np.zeros(2), model={"hidden_size": 4, "num_layers": 2, "config_sha256": "0" * 64},
                    thresholds=thresholds)


def test_a_pack_carries_its_thresholds(tmp_path: Path) -> None:
    loaded = load_pack(save_pack(pack([0.25, None]), tmp_path / "p"))
    assert loaded.thresholds == [0.25, None]
    assert [c["threshold"] for c in loaded.concept_hierarchy()] == [0.25, None]
    assert load_pack(save_pack(pack(None), tmp_path / "q")).thresholds is None
    for bad in ([0.1], [float("nan"), 0.2], [True, 0.2]):
        with pytest.raises(ValueError, match="thresholds"):
            pack(bad)  # type: ignore[arg-type]
