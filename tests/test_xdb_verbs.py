"""The rest of XDB's verbs over HTTP on a real XDB: recall by time, paged, by activation range, with
comments; one timestep; surprising tokens; related concepts and the hierarchy; comments, windows,
unpin, evidence, cold records; documents by path."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from core.config import XDBConfig
from server.http.gateway import install_gateway
from server.routes.xdb_routes import xdb_router
from xdb import XDB, TimestepRow

SPIKE = 30  # the tick whose top activation stands out


@pytest.fixture
def xdb(tmp_path: Path) -> Iterator[XDB]:
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=0)) as db:
        rows = []
        for t in db.next_ticks("s1", 40):
            joy = 0.9 if t == SPIKE else 0.2 + 0.01 * (t % 3)
            acts = {"joy": joy, "fear": 0.1, **({"surprise": 0.05} if t % 2 else {})}
            rows.append(TimestepRow("s1", t, "output", "assistant", f"w{t}", request_id=f"r{t // 10}",
                                    concept_activations=acts, activation_source="hidden_state"))
        db.writer.submit(rows)
        db.writer.submit([TimestepRow("s2", t, "output", content="x", concept_activations={"fear": 0.7})
                          for t in db.next_ticks("s2", 5)])
        db.writer.flush()
        db.register_concepts([{"id": "emotion", "name": "Emotion", "parent": None},
                              {"id": "joy", "name": "Joy", "parent": "emotion"},
                              {"id": "fear", "name": "Fear", "parent": "emotion"}])
        yield db


@pytest.fixture
def client(xdb: XDB) -> Iterator[TestClient]:
    app = FastAPI()
    install_gateway(app)
    app.include_router(xdb_router(xdb, bud_min_examples=1))
    with TestClient(app) as c:
        yield c


def test_recall_pages_with_a_cursor_and_an_offset(client: TestClient) -> None:
    first = client.get("/v1/xdb/recall", params={"session_id": "s1", "limit": 15}).json()
    assert [r["tick"] for r in first["data"]] == list(range(15)) and first["has_more"]
    second = client.get("/v1/xdb/recall", params={"session_id": "s1", "limit": 30,
                                                  "after_id": first["next_after_id"]}).json()
    assert [r["tick"] for r in second["data"]] == list(range(15, 40))
    assert second["has_more"] is False and second["next_after_id"] is None
    skipped = client.get("/v1/xdb/recall", params={"session_id": "s1", "limit": 5, "offset": 35}).json()
    assert [r["tick"] for r in skipped["data"]] == list(range(35, 40))


def test_recall_by_time_range_and_activation_bounds(client: TestClient, xdb: XDB) -> None:
    xdb.conn.execute("UPDATE timesteps_hot SET created_at = TIMESTAMP '2026-01-01 00:00:00' WHERE session_id = 's2'")
    early = client.get("/v1/xdb/recall", params={"time_to": "2026-06-01T00:00:00Z"}).json()["data"]
    assert {r["session_id"] for r in early} == {"s2"}
    late = client.get("/v1/xdb/recall", params={"time_from": (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
                                                .isoformat()}).json()["data"]
    assert {r["session_id"] for r in late} == {"s1"}
    bad = client.get("/v1/xdb/recall", params={"time_from": "2026-02-01", "time_to": "2026-01-01"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "time_from"
    # year 1 at +00:07 is before year 1 in UTC: a 400, not a datetime overflow
    overflow = client.get("/v1/xdb/recall", params={"time_from": "0001-01-01T00:00:00+00:07"})
    assert overflow.status_code == 400 and overflow.json()["error"]["param"] == "time_from"
    band = client.get("/v1/xdb/recall", params={"concept": "joy", "min_activation": 0.205,
                                                "max_activation": 0.5}).json()["data"]
    assert {r["tick"] % 3 for r in band} == {1, 2} and SPIKE not in [r["tick"] for r in band]
    top = client.get("/v1/xdb/recall", params={"max_activation": 0.3, "session_id": "s1"}).json()["data"]
    assert len(top) == 39  # every token but the spike


def test_one_timestep_and_comments_in_recall(client: TestClient) -> None:
    client.post("/v1/xdb/comment", json={"session_id": "s1", "tick": 3, "content": "look here"})
    client.post("/v1/xdb/comment", json={"session_id": "s1", "tick_range": [2, 4], "content": "this stretch"})
    rows = client.get("/v1/xdb/recall", params={"session_id": "s1", "tick_from": 3, "tick_to": 5}).json()["data"]
    assert [[c["content"] for c in r["comments"]] for r in rows] == [["look here", "this stretch"],
                                                                     ["this stretch"], []]
    one = client.get(f"/v1/xdb/timesteps/{rows[0]['id']}").json()
    assert one["tick"] == 3 and one["concept_activations"]["joy"] == pytest.approx(0.2)
    assert [c["content"] for c in one["comments"]] == ["look here", "this stretch"]
    assert client.get("/v1/xdb/timesteps/999999").status_code == 404
    listed = client.get("/v1/xdb/comments", params={"session_id": "s1"}).json()["data"]
    assert [c["content"] for c in listed] == ["look here", "this stretch"]


def test_surprising_tokens_stand_out_from_the_running_mean(client: TestClient) -> None:
    found = client.get("/v1/xdb/surprising", params={"session_id": "s1", "limit": 3}).json()["data"]
    assert found[0]["tick"] == SPIKE and found[0]["concept"] == "joy" and found[0]["z"] > 5
    assert client.get("/v1/xdb/surprising", params={"session_id": "nobody"}).status_code == 404


def test_related_concepts_and_browsing_by_parent(client: TestClient) -> None:
    related = client.get("/v1/xdb/concepts/joy/related").json()["data"]
    assert [(r["concept"], r["relation"]) for r in related] == [
        ("emotion", "parent"), ("fear", "sibling"), ("fear", "co_activated"), ("surprise", "co_activated")]
    assert related[0]["display_name"] == "Emotion"
    together = client.get("/v1/xdb/concepts/joy/related", params={"relation": "co_activated"}).json()["data"]
    assert together[0]["together"] == 40 and together[1]["share"] == pytest.approx(0.5)
    missing = client.get("/v1/xdb/concepts/unknown/related")
    assert missing.status_code == 404 and "unknown" in missing.json()["error"]["message"]
    children = client.get("/v1/xdb/concepts", params={"parent": "emotion"}).json()["data"]
    assert sorted(c["name"] for c in children) == ["fear", "joy"]
    roots = client.get("/v1/xdb/concepts", params={"parent": ""}).json()["data"]
    assert "emotion" in [c["name"] for c in roots] and "joy" not in [c["name"] for c in roots]


def test_typed_relations_children_and_the_ancestors_chain(client: TestClient, xdb: XDB) -> None:
    xdb.register_concepts([{"id": "feeling", "name": "Feeling", "parent": None},
                           {"id": "emotion", "name": "Emotion", "parent": "feeling"},
                           {"id": "dread", "name": "Dread", "parent": "fear"}])
    # A concept only in the hierarchy (no token carries it) has its hierarchy relations and no co-activation.
    emotion = client.get("/v1/xdb/concepts/emotion/related").json()["data"]
    assert [(r["concept"], r["relation"]) for r in emotion] == [("feeling", "parent"), ("fear", "child"),
                                                                ("joy", "child")]
    fear = client.get("/v1/xdb/concepts/fear/related", params={"relation": "child"}).json()["data"]
    assert [(r["concept"], r["display_name"]) for r in fear] == [("dread", "Dread")]
    siblings = client.get("/v1/xdb/concepts/fear/related", params={"relation": "sibling"}).json()["data"]
    assert [r["concept"] for r in siblings] == ["joy"]
    # A concept only in the tokens has co-activations and no hierarchy.
    surprise = client.get("/v1/xdb/concepts/surprise/related").json()["data"]
    assert {r["relation"] for r in surprise} == {"co_activated"} and surprise[0]["together"] == 20
    children = client.get("/v1/xdb/concepts/emotion/children").json()
    assert children["concept"] == "emotion" and [c["concept"] for c in children["data"]] == ["fear", "joy"]
    assert client.get("/v1/xdb/concepts/dread/children").json()["data"] == []
    parents = client.get("/v1/xdb/concepts/dread/parents").json()["data"]
    assert [(p["concept"], p["relation"]) for p in parents] == [("fear", "parent"), ("emotion", "parent"),
                                                                ("feeling", "parent")]
    assert client.get("/v1/xdb/concepts/feeling/parents").json()["data"] == []
    for path in ("children", "parents"):
        unknown = client.get(f"/v1/xdb/concepts/nowhere/{path}")
        assert unknown.status_code == 404 and "nowhere" in unknown.json()["error"]["message"]
    bad = client.get("/v1/xdb/concepts/joy/related", params={"relation": "cousin"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "relation"


def test_a_cycle_in_the_hierarchy_ends_the_ancestors_chain(client: TestClient, xdb: XDB) -> None:
    xdb.register_concepts([{"id": "a", "name": "A", "parent": "b"}, {"id": "b", "name": "B", "parent": "a"}])
    assert [p["concept"] for p in client.get("/v1/xdb/concepts/a/parents").json()["data"]] == ["b"]


def test_windows_unpin_evidence_and_cold_records(client: TestClient, xdb: XDB) -> None:
    pinned = client.post("/v1/xdb/pin", json={"session_id": "s1", "tick_from": 0, "tick_to": 9}).json()
    assert [w["id"] for w in client.get("/v1/xdb/windows").json()["data"]] == [pinned["id"]]
    client.post("/v1/xdb/tag", json={"tag": "bud-x", "tag_type": "bud", "session_id": "s1", "tick_range": [10, 19]})
    assert client.post("/v1/xdb/buds", json={"tag": "bud-x", "status": "ready"}).status_code == 200
    submitted = client.post("/v1/xdb/evidence", json={"bud": "bud-x", "submission_id": "sub-1"}).json()["data"]
    assert [w["fidelity"] for w in submitted] == ["submitted"]
    resolved = client.post("/v1/xdb/evidence/sub-1/resolve", json={"accepted": False})
    assert resolved.status_code == 200, resolved.text
    unpinned = client.delete(f"/v1/xdb/pin/{pinned['id']}")
    assert unpinned.status_code == 200 and unpinned.json()["pinned"] is False
    assert client.delete("/v1/xdb/pin/424242").status_code == 404
    client.post("/v1/xdb/compact", json={"session_id": "s1", "compress_released": True})
    cold = client.get("/v1/xdb/cold_records", params={"session_id": "s1"}).json()["data"]
    assert cold and all(c["session_id"] == "s1" for c in cold)
    assert client.post("/v1/xdb/evidence", json={"bud": "bud-x"}).json()["error"]["param"] == "submission_id"


def test_a_document_by_path(client: TestClient) -> None:
    client.post("/v1/xdb/documents", json={"name": "tools", "content": "observe()", "path": "docs/tools.md"})
    found = client.get("/v1/xdb/documents", params={"path": "docs/tools.md"}).json()["data"]
    assert [d["content"] for d in found] == ["observe()"]
    assert client.get("/v1/xdb/documents", params={"path": "docs/none.md"}).json()["data"] == []
