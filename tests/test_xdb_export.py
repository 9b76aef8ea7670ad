"""XDB exports: Parquet (or JSON lines) partitioned by session with a manifest, and the way back in —
an export imported into an empty XDB answers recall exactly as the original did."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import numpy as np
import pytest
from cli_runner import ahc
from fastapi import FastAPI
from fastapi.testclient import TestClient

from server.http.gateway import install_gateway
from server.routes.export_routes import export_router
from xdb import XDB, TimestepRow
from xdb.audit.chain import EVENT_TYPE
from xdb.audit.log import verify_audit
from xdb.documents import list_documents
from xdb.owner import EVERY

SESSIONS = ("s1", "tenant:b/s2", "s 3=x%")  # ids a path cannot hold as they are


def fill(xdb: XDB, rows_per_session: int = 40) -> None:
    rng = np.random.default_rng(7)
    concepts = [f"c{i}" for i in range(15)]
    for session in SESSIONS:
        ticks = xdb.next_ticks(session, rows_per_session)
        xdb.writer.submit([
            TimestepRow(session, t, "output" if t % 5 else "input", "assistant" if t % 5 else "user",
                        f"w{t} {session}", token_id=int(t), request_id=f"r{t // 10}",
                        concept_activations={c: float(v) for c, v in zip(rng.choice(concepts, 10, replace=False),
                                                                          rng.random(10))},
                        activation_source="hidden_state", metadata={"n": int(t)} if t % 7 == 0 else None)
            for t in ticks])
    xdb.writer.flush()
    xdb.tag("insight", session_id="s1", tick_range=(3, 9), note="first", owner=EVERY)
    xdb.tag("insight", session_id="tenant:b/s2", tick=4, owner=EVERY)
    xdb.comment("look here", session_id="s 3=x%", tick=2, owner=EVERY)
    xdb.add_document("rules", "A moves right.", owner=EVERY)
    xdb.save_session_state("s1", json.dumps({"turns": [{"role": "user", "content": "hi"}]}))


QUERIES = [{}, {"session_id": "tenant:b/s2"}, {"tags": "insight"}, {"text": "w3"}, {"event_types": "input"},
           {"concept": "c3", "min_activation": 0.5}, {"session_id": "s1", "tick_from": 5, "tick_to": 20}]


def recalls(xdb: XDB) -> list[list[dict]]:
    return [xdb.recall({**q, "limit": 1000}, owner=EVERY) for q in QUERIES]


@pytest.fixture
def source(tmp_path: Path):
    xdb = XDB.open(tmp_path / "source")
    fill(xdb)
    yield xdb
    xdb.close()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_export_imported_into_an_empty_xdb_recalls_exactly_the_same(source: XDB, tmp_path: Path, fmt: str) -> None:
    head_before = source.audit_head()
    manifest = source.export(tmp_path / "out", fmt, owner=EVERY)
    assert manifest["audit_head"] == {"seq": head_before[0], "hash": head_before[1]}
    assert source.audit_head()[0] == head_before[0] + 1  # the export itself is an audit event
    assert manifest["tables"]["timesteps"]["rows"] == 3 * 40
    parts = {Path(f["path"]).parent.name for f in manifest["tables"]["timesteps"]["files"]}
    assert len(parts) == 3 and all(p.startswith("session_id=") and "/" not in p for p in parts)
    for table in manifest["tables"].values():
        for f in table["files"]:
            assert hashlib.sha256((tmp_path / "out" / f["path"]).read_bytes()).hexdigest() == f["sha256"]
    result = XDB.import_export(tmp_path / "copy", tmp_path / "out")
    assert result["rows"]["timesteps"] == 120
    with XDB.open(tmp_path / "copy") as copy:
        assert recalls(copy) == recalls(source)
        assert copy.load_session_state("s1") == source.load_session_state("s1")
        assert copy.read(list_documents, owner=EVERY)[0]["name"] == "rules"
        # Ids go on past the imported ones: a new tag and a new row do not collide.
        applied = copy.tag("later", session_id="s1", tick=1, owner=EVERY)
        assert (applied["tag"]["id"], applied["id"]) == (2, 3)  # after the imported tag and its 2 uses
        copy.writer.submit([TimestepRow("s1", t, "output", content="new") for t in copy.next_ticks("s1", 2)])
        copy.writer.flush()
        ticks = [r["tick"] for r in copy.recall({"session_id": "s1", "limit": 1000}, owner=EVERY)]
        assert ticks == sorted(set(ticks)) and ticks[-2:] == [40, 41]
    assert verify_audit(tmp_path / "copy").ok


def test_an_export_filters_by_session_and_time(source: XDB, tmp_path: Path) -> None:
    only = source.export(tmp_path / "one", session_id="s1", owner=EVERY)
    assert only["tables"]["timesteps"]["rows"] == 40 and only["tables"]["comments"]["rows"] == 0
    assert only["filters"]["session_id"] == "s1"
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    later = source.export(tmp_path / "later", since=future, owner=EVERY)
    assert later["tables"]["timesteps"]["rows"] == 0 and later["tables"]["concepts"]["rows"] == 15
    with pytest.raises(ValueError, match="ISO 8601"):
        source.export(tmp_path / "bad", since="yesterday", owner=EVERY)
    with pytest.raises(ValueError, match="years 1 to 9999"):
        source.export(tmp_path / "bad", since="0001-01-01T00:00:00+00:07", owner=EVERY)
    tenant = source.export(tmp_path / "tenant", owner="tenant:b/")
    assert tenant["tables"]["timesteps"]["rows"] == 40 and tenant["tables"]["documents"]["rows"] == 0


def test_an_import_refuses_a_tampered_export_or_a_used_xdb(source: XDB, tmp_path: Path) -> None:
    source.export(tmp_path / "out", owner=EVERY)
    with pytest.raises(ValueError, match="not empty"):
        source.export(tmp_path / "out", owner=EVERY)
    with pytest.raises(ValueError, match="not empty"):
        XDB.import_export(source.data_dir, tmp_path / "out")  # type: ignore[arg-type]  # a closed copy below
    victim = next((tmp_path / "out" / "timesteps").rglob("*.parquet"))
    victim.write_bytes(victim.read_bytes()[:-9] + b"corrupted")
    with pytest.raises(ValueError, match="SHA-256"):
        XDB.import_export(tmp_path / "copy", tmp_path / "out")
    with XDB.open(tmp_path / "copy") as copy:
        assert copy.recall({}, owner=EVERY) == []  # nothing half-imported


def test_an_import_reads_only_the_listed_files_and_checks_their_counts(source: XDB, tmp_path: Path) -> None:
    source.export(tmp_path / "out", owner=EVERY)
    # A file dropped beside the listed ones (with a row of its own) is not read.
    listed = next((tmp_path / "out" / "timesteps").rglob("*.parquet"))
    stray = tmp_path / "out" / "timesteps" / "session_id=stray" / "data_0.parquet"
    stray.parent.mkdir()
    duckdb.connect().execute(f"COPY (SELECT * REPLACE (999_999 AS id) FROM read_parquet('{listed}') LIMIT 1) "
                             f"TO '{stray}' (FORMAT parquet)")
    XDB.import_export(tmp_path / "copy", tmp_path / "out")
    with XDB.open(tmp_path / "copy") as copy:
        assert recalls(copy) == recalls(source) and copy.recall({"session_id": "stray"}, owner=EVERY) == []
    # A manifest whose counts do not match its (intact) files imports nothing.
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    manifest["tables"]["timesteps"]["rows"] += 1
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="loaded 120 rows where the manifest counts 121"):
        XDB.import_export(tmp_path / "copy2", tmp_path / "out")
    with XDB.open(tmp_path / "copy2") as copy:
        assert copy.recall({}, owner=EVERY) == []
    manifest["tables"]["timesteps"]["files"][0]["path"] = "../../source/experience.duckdb"
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="outside the export"):
        XDB.import_export(tmp_path / "copy3", tmp_path / "out")


def test_the_cli_exports_and_imports_a_stopped_servers_data(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "data") as xdb:
        fill(xdb, 10)
        expected = recalls(xdb)
    # In this process (cli_runner): the same exit codes and stderr, without four cold starts.
    done = ahc("xdb", "export", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
               "--format", "jsonl", "--session", "s1")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["format"] == "jsonl" and summary["rows"] > 10
    back = ahc("xdb", "import", "--data-dir", str(tmp_path / "copy"), "--from", str(tmp_path / "out"))
    assert back.returncode == 0, back.stderr
    with XDB.open(tmp_path / "copy") as copy:
        assert copy.recall({"limit": 1000}, owner=EVERY) == [r for r in expected[0] if r["session_id"] == "s1"]
    bad = ahc("xdb", "export", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "x"), "--format", "csv")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--format" in bad.stderr
    again = ahc("xdb", "import", "--data-dir", str(tmp_path / "copy"), "--from", str(tmp_path / "out"))
    assert again.returncode == 1 and "not empty" in again.stderr and again.stderr.count("\n") == 1


def test_exports_over_http_list_download_and_stay_within_the_tenant(source: XDB) -> None:
    app = FastAPI()
    install_gateway(app)
    app.include_router(export_router(source))
    with TestClient(app) as client:
        made = client.post("/v1/xdb/exports", json={"session_id": "s1", "format": "parquet"})
        assert made.status_code == 200, made.text
        manifest = made.json()
        assert manifest["tables"]["timesteps"]["rows"] == 40
        assert [e["id"] for e in client.get("/v1/xdb/exports").json()["data"]] == [manifest["id"]]
        assert client.get(f"/v1/xdb/exports/{manifest['id']}").json()["rows"] == manifest["rows"]
        entry = manifest["tables"]["timesteps"]["files"][0]
        file = client.get(f"/v1/xdb/exports/{manifest['id']}/files/{entry['path']}")
        assert file.status_code == 200 and hashlib.sha256(file.content).hexdigest() == entry["sha256"]
        where = source.data_dir / "exports" / manifest["id"] / entry["path"]
        rows = duckdb.connect().execute("SELECT count(*) FROM read_parquet(?)", [str(where)]).fetchone()
        assert rows == (40,)
        assert "path" not in manifest and str(source.data_dir) not in made.text  # no server paths shown
        assert manifest["bytes"] == sum(f["bytes"] for t in manifest["tables"].values() for f in t["files"])
        assert client.get(f"/v1/xdb/exports/{manifest['id']}/files/../../experience.duckdb").status_code == 404
        assert client.get("/v1/xdb/exports/exp-nope").json()["error"]["type"] == "not_found_error"
        bad = client.post("/v1/xdb/exports", json={"format": "csv"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "format"
        assert "ExportManifest" in json.dumps(client.get("/openapi.json").json())
    time.sleep(0)  # the export directories stay under the data dir for the operator
    assert (source.data_dir / "exports" / manifest["id"] / "manifest.json").is_file()


def test_exports_are_bounded_one_at_a_time_deletable_and_expire(source: XDB) -> None:
    import threading

    app = FastAPI()
    install_gateway(app)
    app.include_router(export_router(source, max_per_tenant=2, ttl_s=3600))
    with TestClient(app) as client:
        first = client.post("/v1/xdb/exports", json={"session_id": "s1"}).json()
        second = client.post("/v1/xdb/exports", json={}).json()
        assert first["expires_at"] > first["created_at"]
        full = client.post("/v1/xdb/exports", json={})
        assert full.status_code == 429 and full.json()["error"]["code"] == "export_limit"
        assert 3500 < int(full.headers["Retry-After"]) <= 3600
        gone = client.delete(f"/v1/xdb/exports/{first['id']}")
        assert gone.status_code == 200 and gone.json() == {"id": first["id"], "object": "export", "deleted": True}
        assert client.delete(f"/v1/xdb/exports/{first['id']}").status_code == 404
        assert client.get(f"/v1/xdb/exports/{first['id']}").status_code == 404
        assert not (source.data_dir / "exports" / first["id"]).exists()
        # While one is being made, the same tenant's next is refused at once.
        started, release = threading.Event(), threading.Event()
        real_export = source.export

        def slow_export(*args, **kwargs):  # type: ignore[no-untyped-def]
            started.set()
            release.wait(10)
            return real_export(*args, **kwargs)

        source.export = slow_export  # type: ignore[method-assign]
        try:
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(client.post, "/v1/xdb/exports", json={})
                assert started.wait(10)
                busy = client.post("/v1/xdb/exports", json={})
                release.set()
                assert pending.result().status_code == 200
        finally:
            del source.export
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "export_running"
    assert [e["id"] for e in source.exports(owner=EVERY)][1:] == [second["id"]]
    events = [json.loads(r[0]) for r in source.audit.conn.execute(  # type: ignore[union-attr]
        "SELECT content FROM audit_records WHERE event_type = ? ORDER BY seq", [EVENT_TYPE]).fetchall()]
    assert [e["id"] for e in events if e.get("action") == "export_deleted"] == [first["id"]], events


def test_the_storage_pass_expires_old_exports_and_counts_them_against_the_quota(source: XDB) -> None:
    old, new = source.export(owner=EVERY), source.export(owner=EVERY)
    manifest_path = Path(old["path"]) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["created_at"] = "2020-01-01T00:00:00Z"  # made long ago
    manifest_path.write_text(json.dumps(manifest))
    report = source.compact()
    assert report["deleted_exports"] == [old["id"]] and report["export_bytes"] == new["bytes"] > 0
    assert [e["id"] for e in source.exports(owner=EVERY)] == [new["id"]]
    # Over the quota, the exports go first (they are copies), before any recorded row is compressed.
    source.quota_bytes = report["usage_bytes"] + new["bytes"] // 2
    report = source.compact()
    assert report["deleted_exports"] == [new["id"]] and source.exports(owner=EVERY) == []
    assert report["compressed_record_ids"] == [] and report["export_bytes"] == 0


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_id_too_long_for_a_file_name_is_exported_under_a_stand_in_and_imported_as_itself(
        tmp_path: Path, fmt: str) -> None:
    long_id = "पन्ह पन्ह त्र र्च कृकृ ड्ड न्हृे إلا بسم الله" * 2  # 256 bytes quoted is past a file name's 255
    with XDB.open(tmp_path / "source") as xdb:
        xdb.writer.submit([TimestepRow(long_id, t, "output", content=f"t{t}") for t in xdb.next_ticks(long_id, 3)])
        xdb.writer.submit([TimestepRow("short", t, "output", content="s") for t in xdb.next_ticks("short", 2)])
        xdb.writer.flush()
        manifest = xdb.export(tmp_path / "out", fmt, owner=EVERY)
        before = recalls(xdb)
    [(stand_in, value)] = manifest["long_ids"].items()
    assert value == long_id and stand_in.startswith("sha256-")
    parts = {Path(f["path"]).parent.name for f in manifest["tables"]["timesteps"]["files"]}
    assert parts == {"session_id=short", f"session_id={stand_in}"}
    XDB.import_export(tmp_path / "copy", tmp_path / "out")
    with XDB.open(tmp_path / "copy") as copy:
        assert recalls(copy) == before
        rows = copy.recall({"session_id": long_id, "limit": 10}, owner=EVERY)
        assert [r["content"] for r in rows] == ["t0", "t1", "t2"]
