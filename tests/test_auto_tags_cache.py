"""The writer's cached auto-tag map (xdb/auto_tags.py) follows every change to what it caches: a
threshold changed mid-run, a concept tag made a bud, a concept first seen after the map was loaded."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

from xdb import XDB, TimestepRow, auto_tags
from xdb.owner import EVERY
from xdb.tags import set_bud_status

HIERARCHY: list[dict[str, Any]] = [{"id": "motion", "name": "Motion", "parent": None, "threshold": None},
             {"id": "right", "name": "Moves right", "parent": "motion", "threshold": 0.5},
             {"id": "left", "name": "Moves left", "parent": "motion", "threshold": 0.5}]


def write(xdb: XDB, request: str, acts: dict[str, float]) -> int:
    """One token of session s with these activations, committed; returns its tick."""
    (tick,) = xdb.next_ticks("s", 1)
    writer = xdb.writer
    assert writer is not None
    writer.submit([TimestepRow("s", tick, "output", "assistant", f"w{tick}", request_id=request,
                                   concept_activations=acts, activation_source="hidden_state")])
    writer.flush()
    return tick


def tagged(xdb: XDB, tag: str) -> list[int]:
    return [r["tick"] for r in xdb.recall({"tags": tag}, owner=EVERY)]


@pytest.fixture(autouse=True)
def concepts(xdb: XDB) -> None:
    xdb.register_concepts(HIERARCHY)


def test_a_threshold_changed_mid_run_changes_what_fires_next(xdb: XDB) -> None:
    first = write(xdb, "r1", {"right": 0.6})
    xdb.register_concepts([{**HIERARCHY[1], "threshold": 0.7}])
    write(xdb, "r2", {"right": 0.6})  # under the new threshold
    third = write(xdb, "r3", {"right": 0.75})
    assert tagged(xdb, "right") == [first, third]
    xdb.register_concepts([{**HIERARCHY[1], "parent": None}])  # no parent any more: nothing inherited
    fourth = write(xdb, "r4", {"right": 0.8})
    assert tagged(xdb, "right") == [first, third, fourth]
    assert tagged(xdb, "motion") == [first, third]


def test_a_concept_tag_made_a_bud_stops_firing(xdb: XDB) -> None:
    first = write(xdb, "r1", {"right": 0.9})
    xdb.write(set_bud_status, "right", "candidate")
    write(xdb, "r2", {"right": 0.9})
    assert tagged(xdb, "right") == [first]
    assert tagged(xdb, "motion") == [first]


def test_a_concept_first_seen_after_the_map_was_loaded_fires(xdb: XDB) -> None:
    first = write(xdb, "r1", {"right": 0.9})  # loads the map: `left` is in no activation yet
    second = write(xdb, "r2", {"left": 0.9})
    assert tagged(xdb, "right") == [first] and tagged(xdb, "left") == [second]
    assert tagged(xdb, "motion") == [first, second]


def test_a_change_committed_during_a_batch_is_loaded_by_the_next() -> None:
    """A tag made while the writer's transaction is open is not in that transaction's snapshot: the
    map loaded there must not count as current past it."""
    conn = duckdb.connect()
    conn.execute("CREATE TABLE concepts (id INTEGER, name VARCHAR)")
    conn.execute("CREATE TABLE concept_hierarchy (concept VARCHAR, parent VARCHAR, threshold DOUBLE)")
    conn.execute("CREATE TABLE tags (id BIGINT, tag_type VARCHAR, concept_id VARCHAR)")
    conn.execute("INSERT INTO concepts VALUES (0, 'right')")
    conn.execute("INSERT INTO concept_hierarchy VALUES ('right', NULL, 0.5)")
    other = conn.cursor()
    auto_tags.beginning(conn)
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM tags").fetchall()  # the batch's first statement: its snapshot
    other.execute("INSERT INTO tags VALUES (7, 'concept', 'right')")  # committed while the batch is open
    auto_tags.forget(conn)
    assert auto_tags.tag_map(conn).tag_ids.tolist() == []  # the batch's snapshot
    conn.execute("COMMIT")
    auto_tags.beginning(conn)
    conn.execute("BEGIN")
    assert auto_tags.tag_map(conn).tag_ids.tolist() == [7]
    conn.execute("COMMIT")
