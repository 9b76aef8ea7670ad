"""/v1/xdb/* on a real XDB through FastAPI's test client: results and OpenAI-shaped errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from core.config import XDBConfig
from core.limits import (
    COMMENT_MAX_CHARS,
    DOCUMENT_NAME_MAX_CHARS,
    DOCUMENT_SUMMARY_MAX_CHARS,
    NOTE_MAX_CHARS,
    TAG_MAX_CHARS,
)
from server.http.gateway import install_gateway
from server.routes.agent_routes import agent_router
from server.routes.xdb_routes import xdb_router
from xdb import XDB, TimestepRow


@pytest.fixture
def client(tmp_path: Path):
    xdb = XDB.open(tmp_path / "xdb", XDBConfig(max_document_bytes=1000))
    ticks = xdb.next_ticks("s1", 3)
    xdb.writer.submit([TimestepRow("s1", t, "output", "assistant", w, request_id="r1",
                                   concept_activations={"joy": 0.5 + t / 10})
                       for t, w in zip(ticks, ["Hel", "lo", "!"])])
    xdb.writer.flush()
    app = FastAPI()
    app.state.xdb = xdb
    install_gateway(app)
    app.include_router(xdb_router(xdb, bud_min_examples=1))
    app.include_router(agent_router(xdb))
    with TestClient(app) as c:
        yield c
    xdb.close()


@pytest.fixture
def xdb_of_client(client: TestClient) -> XDB:
    xdb: XDB = client.app.state.xdb
    return xdb


def error(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def test_recall_and_its_filters(client: TestClient) -> None:
    data = client.get("/v1/xdb/recall", params={"session_id": "s1", "tick_from": 1}).json()["data"]
    assert [r["content"] for r in data] == ["lo", "!"]
    recalled = client.get("/v1/xdb/recall", params={"concept": "joy", "min_activation": 0.65}).json()["data"]
    assert recalled[0]["tick"] == 2
    assert len(client.get("/v1/xdb/recall?event_types=output&event_types=input").json()["data"]) == 3


@pytest.mark.parametrize("query, param", [("limit=-3", "limit"), ("tick_from=abc", "tick_from"),
                                          ("tick_from=4&tick_to=1", "tick_from"), ("flavour=x", "flavour")])
def test_bad_recall_filter_is_400_naming_it(client: TestClient, query: str, param: str) -> None:
    err = error(client.get(f"/v1/xdb/recall?{query}"), 400)
    assert err["param"] == param and param in err["message"] and err["type"] == "invalid_request_error"


def test_tag_comment_and_missing_timestep(client: TestClient) -> None:
    ok = client.post("/v1/xdb/tag", json={"tag": "greeting", "session_id": "s1", "tick": 0})
    assert ok.status_code == 200 and ok.json()["tag"]["name"] == "greeting"
    assert client.get("/v1/xdb/recall", params={"tags": "greeting"}).json()["data"][0]["tags"] == ["greeting"]
    err = error(client.post("/v1/xdb/tag", json={"tag": "x", "timestep_id": 424242}), 404)
    assert err["type"] == "not_found_error" and "424242" in err["message"]
    assert error(client.post("/v1/xdb/tag", json={"tag": "x", "session_id": "s1", "tick": 77}), 404)
    assert error(client.post("/v1/xdb/tag", json={"session_id": "s1"}), 400)["param"] == "tag"
    assert client.post("/v1/xdb/comment", json={"content": "hm", "event_id": "r1"}).status_code == 200


def test_documents_versions_and_413(client: TestClient) -> None:
    doc = client.post("/v1/xdb/documents", json={"name": "tools", "content": "observe()",
                                                 "doc_type": "tool_documentation"}).json()
    assert doc["version"] == 1
    assert client.post(f"/v1/xdb/documents/{doc['id']}", json={"content": "observe(n)"}).json()["version"] == 2
    assert client.get(f"/v1/xdb/documents/{doc['id']}", params={"version": 1}).json()["content"] == "observe()"
    assert [d["name"] for d in client.get("/v1/xdb/documents").json()["data"]] == ["tools"]
    err = error(client.post("/v1/xdb/documents", json={"name": "big", "content": "x" * 5000}), 413)
    assert "limit" in err["message"]
    assert error(client.get("/v1/xdb/documents/doc-nope"), 404)["type"] == "not_found_error"


@pytest.mark.parametrize("method, path, kwargs", [
    ("GET", "/v1/xdb/documents", {"params": {"doc_type": "3"}}),
    ("POST", "/v1/xdb/documents", {"json": {"name": "n", "content": "", "doc_type": ""}}),
])
def test_unknown_doc_type_is_400_naming_it(client: TestClient, method: str, path: str, kwargs: dict) -> None:
    err = error(client.request(method, path, **kwargs), 400)
    assert err["param"] == "doc_type" and err["type"] == "invalid_request_error"


def test_buds_concepts_pin_compact_state(client: TestClient) -> None:
    client.post("/v1/xdb/tag", json={"tag": "bud-a", "tag_type": "bud", "session_id": "s1", "tick_range": [0, 2]})
    assert [b["name"] for b in client.get("/v1/xdb/buds").json()["data"]] == ["bud-a"]
    assert client.post("/v1/xdb/buds", json={"tag": "bud-a", "status": "ready"}).json()["bud_status"] == "ready"
    assert error(client.get("/v1/xdb/buds", params={"status": "ripe"}), 400)
    assert [c["name"] for c in client.get("/v1/xdb/concepts").json()["data"]] == ["joy"]
    pinned = client.post("/v1/xdb/pin", json={"session_id": "s1", "tick_from": 0, "tick_to": 1}).json()
    assert pinned["fidelity"] == "warm"
    out = client.post("/v1/xdb/compact", json={"session_id": "s1", "compress_released": True}).json()
    assert out["compaction"]["range_end"] == 2
    state = client.get("/v1/xdb/state").json()
    # a reply is compressed whole or not at all: this one is partly pinned, so all of it stays
    assert state["timesteps"] == 3 and state["fidelity"]["warm"] == 2
    assert all("audit" not in route.path for route in client.app.routes)


@pytest.mark.parametrize("method, path, kwargs, param", [
    ("get", "/v1/xdb/recall", {"params": {"tick_from": str(10**30)}}, "tick_from"),
    ("post", "/v1/xdb/tag", {"json": {"tag": "x", "timestep_id": 10**30}}, "timestep_id"),
    ("post", "/v1/xdb/tag", {"json": {"tag": "x", "session_id": "s1", "tick_range": [0, 10**30]}}, "tick_range.1"),
    ("post", "/v1/xdb/pin", {"json": {"session_id": "s1", "tick_from": 0, "tick_to": 10**30}}, "tick_to"),
    ("get", "/v1/xdb/documents/doc-x", {"params": {"version": str(10**30)}}, "version"),
    ("post", "/v1/xdb/comment", {"content": b'{"content": "\\ud800", "session_id": "s1", "tick": 0}',
                                 "headers": {"content-type": "application/json"}}, "content"),
    ("post", "/v1/xdb/documents", {"content": b'{"name": "n", "content": "half \\ud83d"}',
                                   "headers": {"content-type": "application/json"}}, "content"),
    ("post", "/v1/xdb/documents", {"content": b'{"name": "\\udc00", "content": "x"}',
                                   "headers": {"content-type": "application/json"}}, "name"),
    ("post", "/v1/xdb/interactions", {"content": b'{"run_id": "r1", "journal_entry": "\\ud800"}',
                                      "headers": {"content-type": "application/json"}}, "journal_entry"),
    ("post", "/v1/xdb/tag", {"content": b"[" * 100_000 + b"]" * 100_000,
                             "headers": {"content-type": "application/json"}}, None),
])
def test_hostile_values_are_400_not_500(client: TestClient, method: str, path: str, kwargs: dict, param: str | None
                                        ) -> None:
    """Integers past DuckDB's BIGINT, lone surrogates and JSON nested past the parser's depth."""
    err = error(getattr(client, method)(path, **kwargs), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("tag", [-(2**127), 2**63])
def test_a_tag_id_past_bigint_is_400(client: TestClient, tag: int) -> None:
    for path, body in [("/v1/xdb/buds", {"tag": tag, "status": "ready"}), ("/v1/xdb/tag", {"tag": tag, "tick": 0})]:
        assert error(client.post(path, json=body), 400)["param"] == "tag"


@pytest.mark.parametrize("name", ["9" * 30, "\u00b2"])
def test_a_digit_string_that_is_no_id_is_a_tag_name(client: TestClient, name: str) -> None:
    """Only ASCII digits within BIGINT name a tag by id; "²" and 30 nines are names (once a 500)."""
    assert error(client.post("/v1/xdb/buds", json={"tag": name, "status": "ready"}), 404)["type"] == "not_found_error"
    ok = client.post("/v1/xdb/tag", json={"tag": name, "session_id": "s1", "tick": 0})
    assert ok.status_code == 200 and ok.json()["tag"]["name"] == name


def test_concurrent_document_updates_all_land_as_versions(client: TestClient) -> None:
    from concurrent.futures import ThreadPoolExecutor

    doc = client.post("/v1/xdb/documents", json={"name": "notes", "content": "v1"}).json()
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: client.post(f"/v1/xdb/documents/{doc['id']}", json={"content": f"v{i}"}),
                                range(2, 10)))
    assert [r.status_code for r in replies] == [200] * 8
    versions = client.get(f"/v1/xdb/documents/{doc['id']}/versions").json()["data"]
    assert sorted(v["version"] for v in versions) == list(range(1, 10))


def test_a_writer_that_cannot_keep_up_is_503_with_retry_after(client: TestClient, xdb_of_client: XDB,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from xdb.writer import FlushTimeout

    def stuck(timeout: float | None = None) -> None:
        raise FlushTimeout("XDB flush: 5 rows still uncommitted")

    monkeypatch.setattr(xdb_of_client.writer, "flush", stuck)
    monkeypatch.setattr(xdb_of_client.writer, "queue_depth", lambda: 5)  # the target may still be queued
    response = client.post("/v1/xdb/tag", json={"tag": "x", "session_id": "s1", "tick": 99})
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.json()["error"]["type"] == "server_error"



def write(xdb: XDB, session_id: str, words: list[str]) -> None:
    ticks = xdb.next_ticks(session_id, len(words))
    xdb.writer.submit([TimestepRow(session_id, t, "output", "assistant", w, request_id=f"r{ticks[0]}")
                       for t, w in zip(ticks, words)])
    xdb.writer.flush()


def test_compact_up_to_tick_is_bounded_by_the_sessions_last_tick(client: TestClient) -> None:
    xdb: XDB = client.app.state.xdb
    # s1 holds ticks 0..2: a compaction past tick 2 would release rows the session has yet to write
    err = error(client.post("/v1/xdb/compact", json={"session_id": "s1", "up_to_tick": 100,
                                                      "compress_released": True}), 400)
    assert err["param"] == "up_to_tick"
    assert error(client.post("/v1/xdb/compact", json={"session_id": "nobody", "up_to_tick": 0}), 404)
    # up to the last tick itself is fine
    out = client.post("/v1/xdb/compact", json={"session_id": "s1", "up_to_tick": 2, "compress_released": True})
    assert out.json()["compaction"]["range_end"] == 2
    write(xdb, "s1", ["more", " later"])
    recalled = client.get("/v1/xdb/recall", params={"session_id": "s1", "tick_from": 3}).json()["data"]
    assert [r["content"] for r in recalled] == ["more", " later"]
    assert client.get("/v1/xdb/state").json()["fidelity"]["released"] == 0
    # the next compaction picks up where the last one ended
    again = client.post("/v1/xdb/compact", json={"session_id": "s1"})
    assert again.status_code == 200, again.text
    assert (again.json()["compaction"]["range_start"], again.json()["compaction"]["range_end"]) == (3, 4)
    assert error(client.post("/v1/xdb/compact", json={"session_id": "s1"}), 400)["param"] == "session_id"


def test_a_tag_string_is_a_name_and_an_integer_an_id(client: TestClient) -> None:
    first = client.post("/v1/xdb/tag", json={"tag": "greeting", "session_id": "s1", "tick": 0}).json()["tag"]
    # a name made of digits, among them the first tag's id: still a new tag of that name
    named = client.post("/v1/xdb/tag", json={"tag": str(first["id"]), "session_id": "s1", "tick": 1}).json()["tag"]
    assert named["name"] == str(first["id"]) and named["id"] != first["id"]
    by_id = client.post("/v1/xdb/tag", json={"tag": first["id"], "session_id": "s1", "tick": 2}).json()["tag"]
    assert by_id == first
    by_name = client.post("/v1/xdb/tag", json={"tag": str(first["id"]), "session_id": "s1", "tick": 2}).json()["tag"]
    assert by_name == named
    # an unknown id is not created; a bool or a float is neither a name nor an id
    assert error(client.post("/v1/xdb/tag", json={"tag": 9999, "session_id": "s1", "tick": 0}), 404)
    for bad in (True, 1.0):
        err = error(client.post("/v1/xdb/tag", json={"tag": bad, "session_id": "s1", "tick": 0}), 400)
        assert err["param"].split(".")[0] == "tag"
    bud = client.post("/v1/xdb/buds", json={"tag": str(first["id"]), "status": "candidate"}).json()
    assert bud["id"] == named["id"] and bud["bud_status"] == "candidate"
    # a recall filter is text: a value that names a tag means that tag, not the id it spells
    recalled = client.get("/v1/xdb/recall", params={"tags": str(first["id"])}).json()["data"]
    assert [r["tick"] for r in recalled] == [1, 2]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/xdb/comment", {"session_id": "s1", "tick": 0, "content": "x" * (COMMENT_MAX_CHARS + 1)}, "content"),
    ("/v1/xdb/tag", {"session_id": "s1", "tick": 0, "tag": "t" * (TAG_MAX_CHARS + 1)}, "tag"),
    ("/v1/xdb/tag", {"session_id": "s1", "tick": 0, "tag": "ok", "note": "n" * (NOTE_MAX_CHARS + 1)}, "note"),
    ("/v1/xdb/documents", {"name": "n" * (DOCUMENT_NAME_MAX_CHARS + 1), "content": "x"}, "name"),
    ("/v1/xdb/documents", {"name": "d", "content": "x", "tags": ["t" * (TAG_MAX_CHARS + 1)]}, "tags.0"),
    ("/v1/xdb/documents", {"name": "d", "content": "x", "summary": "s" * (DOCUMENT_SUMMARY_MAX_CHARS + 1)},
     "summary"),
])
def test_an_over_long_field_is_400_naming_it(client: TestClient, path: str, body: dict, param: str) -> None:
    err = error(client.post(path, json=body), 400)
    assert err["param"] == param and param in err["message"] and err["type"] == "invalid_request_error"


def test_a_comment_at_its_cap_is_stored(client: TestClient) -> None:
    assert client.post("/v1/xdb/comment", json={"session_id": "s1", "tick": 0,
                                               "content": "x" * COMMENT_MAX_CHARS}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/xdb/recall?scope=cluster", "/v1/xdb/concepts?scope=cluster",
                                  "/v1/xdb/tags?scope=cluster", "/v1/xdb/lake"])
def test_cluster_reads_without_a_lake_are_400_naming_scope(client: TestClient, path: str) -> None:
    assert error(client.get(path), 400)["param"] == "scope"


def test_scope_is_local_or_cluster(client: TestClient) -> None:
    assert error(client.get("/v1/xdb/recall?scope=everywhere"), 400)["param"] == "scope"
    assert client.get("/v1/xdb/recall?scope=local&session_id=s1").json()["data"]


def test_tags_are_searched_locally_by_pattern_type_status_and_entity(client: TestClient) -> None:
    client.post("/v1/xdb/tag", json={"tag": "door-north", "tag_type": "entity", "entity_type": "place",
                                     "session_id": "s1", "tick": 0})
    client.post("/v1/xdb/tag", json={"tag": "door-south", "session_id": "s1", "tick_range": [0, 1]})
    client.post("/v1/xdb/tag", json={"tag": "Doorway", "tag_type": "bud", "session_id": "s1", "tick": 1})
    names = lambda **q: [t["name"] for t in client.get("/v1/xdb/tags", params=q).json()["data"]]  # noqa: E731
    assert names(pattern="door*") == ["door-north", "door-south", "Doorway"]  # by name, case ignored
    assert names(pattern="door-?orth") == ["door-north"]
    assert names(tag_type="entity") == ["door-north"] and names(entity_type="place") == ["door-north"]
    assert names(bud_status="candidate") == ["Doorway"] and names(pattern="door*", limit=1) == ["door-north"]
    [north] = client.get("/v1/xdb/tags", params={"pattern": "door-north"}).json()["data"]
    assert (north["entity_type"], north["applications"]) == ("place", 1)
    assert error(client.get("/v1/xdb/tags", params={"bud_status": "ripe"}), 400)["param"] == "bud_status"
