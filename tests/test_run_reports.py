"""The discovery agent's runs for a UI: `GET /v1/xdb/runs` and each run's report PNG (uploaded by the
agent at the end of a run, served back as image/png), on a bare FastAPI app with a real XDB."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from matplotlib.image import imsave

from agent.loop import DiscoveryRun, RunConfig
from agent.policies.baseline import BaselinePolicy
from agent.run_store import HttpRunStore, LocalRunStore, StoreUnavailable
from server.http.gateway import install_gateway
from server.routes.agent_routes import agent_router
from server.tenancy.request_context import request_tenant
from server.tenancy.tenants import Tenant
from universe import load_rule
from xdb import XDB
from xdb.owner import EVERY
from xdb.runs import PNG_SIGNATURE, REPORT_MAX_BYTES, list_runs, run_report


class Tenants:
    """Who the app's requests come from: the API key middleware's job, set by hand on a bare app."""

    def __init__(self, app: FastAPI) -> None:
        self.current = Tenant("default")
        app.dependency_overrides[request_tenant] = lambda: self.current

    def use(self, name: str) -> None:
        self.current = Tenant(name)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FastAPI]:
    with XDB.open(tmp_path / "xdb") as xdb:
        app = FastAPI()
        app.state.xdb = xdb
        install_gateway(app)
        app.include_router(agent_router(xdb))
        yield app


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def tenants(app: FastAPI) -> Tenants:
    return Tenants(app)


def png_bytes(tmp_path: Path, shade: int = 0) -> bytes:
    path = tmp_path / f"chart-{shade}.png"
    imsave(path, np.full((4, 6, 3), shade, dtype=np.uint8), format="png")
    return path.read_bytes()


def turn(client: TestClient, run_id: str, text: str = "a turn") -> None:
    assert client.post("/v1/xdb/interactions", json={"run_id": run_id, "journal_entry": text}).status_code == 200
    time.sleep(0.002)  # each event its own timestamp, so the order by last activity is the order written


def knowledge(client: TestClient, run_id: str, theorems_json: str | None) -> None:
    response = client.post("/v1/xdb/meta_knowledge", json={"run_id": run_id, "theorems_json": theorems_json})
    assert response.status_code == 200
    time.sleep(0.002)


def put_report(client: TestClient, run_id: str, png: bytes) -> dict:
    response = client.put(f"/v1/xdb/runs/{quote(run_id, safe='')}/report",
                          json={"png_base64": base64.b64encode(png).decode()})
    assert response.status_code == 200, response.text
    return response.json()


def runs(client: TestClient, **params: int) -> list[dict]:
    response = client.get("/v1/xdb/runs", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    return body["data"]


def error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_runs_are_listed_latest_first_with_their_counts(client: TestClient, tmp_path: Path) -> None:
    assert runs(client) == []
    turn(client, "r1")
    turn(client, "r1")
    knowledge(client, "r1", '[{"theorem_id": "T1"}, {"theorem_id": "T2"}]')
    knowledge(client, "r1", '[{"theorem_id": "T1"}, {"theorem_id": "T2"}, {"theorem_id": "T3"}]')
    turn(client, "r2")
    knowledge(client, "r2", "not json")
    listed = runs(client)
    assert [r["run_id"] for r in listed] == ["r2", "r1"]
    r2, r1 = listed
    assert r1 == {"run_id": "r1", "turns": 2, "knowledge_versions": 2, "theorems": 3, "has_report": False,
                  "first_at": r1["first_at"], "last_at": r1["last_at"]}
    assert (r2["turns"], r2["knowledge_versions"], r2["theorems"]) == (1, 1, 0)  # unparseable: none
    assert r1["first_at"].endswith("Z") and r1["first_at"] < r1["last_at"] < r2["first_at"]

    turn(client, "r1")  # r1 active again: first in the list
    put_report(client, "r1", png_bytes(tmp_path))
    assert [(r["run_id"], r["turns"], r["has_report"]) for r in runs(client)] == [("r1", 3, True), ("r2", 1, False)]
    assert [r["run_id"] for r in runs(client, limit=1)] == ["r1"]


def test_a_run_with_knowledge_alone_or_no_theorems_is_listed(client: TestClient) -> None:
    knowledge(client, "snap", None)
    knowledge(client, "snap-json", '{"not": "a list"}')
    listed = {r["run_id"]: r for r in runs(client)}
    assert listed["snap"]["turns"] == 0 and listed["snap"]["theorems"] == 0
    assert listed["snap"]["first_at"] == listed["snap"]["last_at"]
    assert listed["snap-json"]["theorems"] == 0


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=many"])
def test_a_bad_limit_is_400_naming_it(client: TestClient, query: str) -> None:
    assert error(client.get(f"/v1/xdb/runs?{query}"), 400)["param"] == "limit"


def test_a_tenant_sees_only_its_own_runs_and_reports(client: TestClient, tenants: Tenants, tmp_path: Path) -> None:
    tenants.use("alice")
    turn(client, "lab")
    put_report(client, "lab", png_bytes(tmp_path, 1))
    tenants.use("bob")
    assert runs(client) == []
    assert error(client.get("/v1/xdb/runs/lab/report.png"), 404)["type"] == "not_found_error"
    turn(client, "lab")  # bob's own run of the same name
    assert [(r["run_id"], r["turns"], r["has_report"]) for r in runs(client)] == [("lab", 1, False)]
    tenants.use("alice")
    assert [(r["run_id"], r["has_report"]) for r in runs(client)] == [("lab", True)]
    assert client.get("/v1/xdb/runs/lab/report.png").content == png_bytes(tmp_path, 1)


def test_a_report_round_trips_as_image_png_and_a_new_upload_replaces_it(client: TestClient, tmp_path: Path) -> None:
    first, second = png_bytes(tmp_path, 10), png_bytes(tmp_path, 200)
    assert put_report(client, "r1", first) == {"run_id": "r1", "version": 1, "bytes": len(first)}
    response = client.get("/v1/xdb/runs/r1/report.png")
    assert response.status_code == 200 and response.content == first
    assert response.headers["content-type"] == "image/png"
    assert put_report(client, "r1", second)["version"] == 2
    assert client.get("/v1/xdb/runs/r1/report.png").content == second


@pytest.mark.parametrize("run_id", ["a/b", "what?x=1", "frag#1", "with space", "100%", "..", "x/report.png"])
def test_a_report_reaches_its_run_whatever_the_run_id(app: FastAPI, tmp_path: Path, run_id: str) -> None:
    png = png_bytes(tmp_path)
    with TestClient(app) as client:
        store = HttpRunStore("", client=client)
        store.log_interaction(run_id, journal_entry="x", tool_call_json=None, tool_result_json=None, token_count=1)
        store.save_report(run_id, png)
        segment = quote(run_id, safe="").replace("..", "%2E%2E")
        response = client.get(f"/v1/xdb/runs/{segment}/report.png")
        assert response.status_code == 200 and response.content == png
        assert [(r["run_id"], r["has_report"]) for r in runs(client)] == [(run_id, True)]
        assert error(client.get("/v1/xdb/runs/a/report.png"), 404)  # a prefix of the id is another run


def test_an_unknown_run_has_no_report(client: TestClient) -> None:
    err = error(client.get("/v1/xdb/runs/nothing-here/report.png"), 404)
    assert err["type"] == "not_found_error" and err["param"] == "run_id" and "nothing-here" in err["message"]
    turn(client, "no-report-yet")
    assert error(client.get("/v1/xdb/runs/no-report-yet/report.png"), 404)["type"] == "not_found_error"


@pytest.mark.parametrize("body, problem", [
    ({"png_base64": "@@not base64@@"}, "not valid base64"),
    ({"png_base64": "aGVsbG8="}, "not a PNG"),  # "hello"
    ({"png_base64": ""}, "not a PNG"),
    ({"png_base64": "é"}, "not valid base64"),
    ({"png_base64": base64.b64encode(PNG_SIGNATURE + bytes(REPORT_MAX_BYTES - 7)).decode()}, "limit"),
    ({"png_base64": "A" * (REPORT_MAX_BYTES * 2)}, "limit"),  # refused before it is decoded
    ({"png_base64": 12}, ""),
    ({}, ""),
])
def test_a_bad_report_is_400_naming_png_base64(client: TestClient, body: dict, problem: str) -> None:
    err = error(client.put("/v1/xdb/runs/r1/report", json=body), 400)
    assert err["param"] == "png_base64" and problem in err["message"]
    assert error(client.get("/v1/xdb/runs/r1/report.png"), 404)  # nothing was stored


def test_a_report_of_exactly_the_limit_is_taken(client: TestClient) -> None:
    png = PNG_SIGNATURE + bytes(REPORT_MAX_BYTES - len(PNG_SIGNATURE))
    assert put_report(client, "big", png)["bytes"] == REPORT_MAX_BYTES
    assert client.get("/v1/xdb/runs/big/report.png").content == png


def test_other_bad_report_requests_are_400(client: TestClient) -> None:
    extra = {"png_base64": base64.b64encode(PNG_SIGNATURE).decode(), "name": "x"}
    assert error(client.put("/v1/xdb/runs/r1/report", json=extra), 400)["param"] == "name"
    assert error(client.put("/v1/xdb/runs/r1/report", content=b"{not json",
                            headers={"content-type": "application/json"}), 400)["param"] == "body"
    valid = {"png_base64": extra["png_base64"]}
    assert error(client.put("/v1/xdb/runs/" + "r" * 257 + "/report", json=valid), 400)["param"] == "run_id"
    assert error(client.get("/v1/xdb/runs/" + "r" * 257 + "/report.png"), 400)["param"] == "run_id"


def test_local_run_store_keeps_the_report(tmp_path: Path) -> None:
    store = LocalRunStore(tmp_path / "xdb")
    try:
        png = png_bytes(tmp_path)
        store.log_interaction("r1", journal_entry="x", tool_call_json=None, tool_result_json=None, token_count=1)
        store.save_report("r1", png)
        assert store.xdb.read(run_report, "r1", owner=EVERY) == png
        assert [(r["run_id"], r["has_report"]) for r in store.xdb.read(list_runs, owner=EVERY)] == [("r1", True)]
        with pytest.raises(ValueError, match="not a PNG"):
            store.save_report("r1", b"GIF89a")
        assert store.xdb.read(run_report, "r1", owner=EVERY) == png
        assert store.xdb.read(run_report, "r2", owner=EVERY) is None
    finally:
        store.close()


def test_a_finished_run_uploads_its_report(app: FastAPI, tmp_path: Path) -> None:
    with TestClient(app) as client:
        run = DiscoveryRun(RunConfig(tmp_path / "runs"), load_rule("kinetic"), BaselinePolicy(),
                           HttpRunStore("", client=client))
        run.run()
        response = client.get(f"/v1/xdb/runs/{quote(run.run_id, safe='')}/report.png")
        assert response.status_code == 200
        assert response.content == (run.run_dir / "report.png").read_bytes()
        assert runs(client)[0]["run_id"] == run.run_id and runs(client)[0]["has_report"]


class NoReports(LocalRunStore):
    def save_report(self, run_id: str, png: bytes) -> None:
        raise StoreUnavailable("the server has no /v1/xdb/runs/x/report route")


def test_a_failed_upload_is_a_warning_not_a_failed_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = NoReports(tmp_path / "xdb")
    try:
        run = DiscoveryRun(RunConfig(tmp_path / "runs"), load_rule("kinetic"), BaselinePolicy(), store)
        with caplog.at_level(logging.WARNING, logger="ahc.agent"):
            result = run.run()
    finally:
        store.close()
    assert result["solved"] and (run.run_dir / "report.png").is_file()
    assert any("report.png not saved" in r.getMessage() and "no /v1/xdb" in r.getMessage() for r in caplog.records)
