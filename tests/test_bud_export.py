"""A ready bud's examples exported as a lens training file (xdb/bud_export.py), in Python, over HTTP and
by `ahc xdb bud-export`, and a submission's evidence package (xdb/storage/evidence_package.py), on a
real XDB file without an engine: the bud's replies against the replies it does not tag, its own
sessions' first; every bad input refused, and a package that cannot be written leaves nothing submitted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from cli_runner import ahc
from fastapi import FastAPI
from fastapi.testclient import TestClient

from core.errors import Conflict, InvalidRequest, NotFound
from lens.train import load_examples
from server.http.gateway import install_gateway
from server.routes.xdb_routes import xdb_router
from xdb import XDB, TimestepRow
from xdb.bud_export import bud_training_file
from xdb.owner import EVERY
from xdb.storage.fidelity import list_windows
from xdb.tags import list_buds, set_bud_status

CATS = ["Cats purr when content.", "A kitten chases the string.", "The cat naps in the sun.",
        "My cat knocks cups off tables.", "Cats land on their feet.", "The tabby cat hunts mice."]
OTHER = ["Taxes are due in April.", "The train leaves at noon.", "Paint the fence white.", "Bake at 200 degrees.",
         "Rain is expected later.", "Ships sail at dawn.", "The meeting moved to Monday."]


def reply(xdb: XDB, session: str, request: str, text: str) -> None:
    words = text.split(" ")
    tokens = [w if i == 0 else " " + w for i, w in enumerate(words)]
    [tick] = xdb.next_ticks(session, 1)
    xdb.writer.submit([TimestepRow(session, tick, "input", "user", f"say something ({request})", request_id=request)])
    xdb.writer.submit([TimestepRow(session, t, "output", "assistant", tok, request_id=request)
                       for t, tok in zip(xdb.next_ticks(session, len(tokens)), tokens)])


@pytest.fixture
def xdb(tmp_path: Path) -> Iterator[XDB]:
    with XDB.open(tmp_path / "x") as db:
        for i, text in enumerate(CATS):
            reply(db, "s1", f"cat{i}", text)
        for i, text in enumerate(OTHER[:4]):
            reply(db, "s1", f"o{i}", text)
        for i, text in enumerate(OTHER[4:]):
            reply(db, "s2", f"p{i}", text)
        db.writer.flush()
        for i in range(len(CATS)):
            db.tag("cats", tag_type="bud", session_id="s1", event_id=f"cat{i}", owner=EVERY)
        yield db


def ready(xdb: XDB, name: str = "cats", n: int = 4) -> None:
    xdb.write(set_bud_status, name, "ready", n)


def test_the_training_file_has_the_bud_against_replies_it_does_not_tag(xdb: XDB, tmp_path: Path) -> None:
    ready(xdb)
    training = xdb.read(bud_training_file, "cats", 4)
    bud, contrast = training["concepts"]
    assert bud["id"] == "cats" and contrast["id"] == "not-cats"
    assert sorted(bud["examples"] + bud["heldout"]) == sorted(CATS)  # the replies' generated text, whole
    assert len(bud["heldout"]) == 1 and bud["heldout"][0] == CATS[3]  # every 4th held out
    # Three times the examples at most, the bud's own session's replies first; never an input message.
    texts = contrast["examples"] + contrast["heldout"]
    assert len(texts) == len(OTHER) and set(texts) == set(OTHER)
    ordered = [t for t in contrast["examples"] if t in OTHER[:4]]
    assert contrast["examples"][:len(ordered)] == ordered
    path = tmp_path / "training.json"
    path.write_text(json.dumps(training))
    assert [c.id for c in load_examples(path)] == ["cats", "not-cats"]  # what `ahc lens train` reads


def test_a_bud_with_few_examples_takes_its_own_sessions_replies_first(xdb: XDB) -> None:
    xdb.tag("taxes", tag_type="bud", session_id="s1", event_id="o0", owner=EVERY)
    ready(xdb, "taxes", 1)
    [bud, contrast] = xdb.read(bud_training_file, "taxes", 1)["concepts"]
    assert bud["examples"] == [OTHER[0]] and bud["heldout"] == []  # too few to hold any out
    # 3 contrast texts: the other replies of s1 (cats and OTHER[1:4]), newest first.
    assert contrast["examples"] == [OTHER[3], OTHER[2], OTHER[1]]


def test_export_errors_in_python(xdb: XDB) -> None:
    xdb.tag("plain", session_id="s1", event_id="o1", owner=EVERY)
    with pytest.raises(NotFound, match="tag 'nope' not found"):
        xdb.read(bud_training_file, "nope", 1)
    with pytest.raises(Conflict, match="tag 'plain' is a custom tag, not a bud"):
        xdb.read(bud_training_file, "plain", 1)
    with pytest.raises(Conflict, match="bud 'cats' is candidate: its examples export once it is ready"):
        xdb.read(bud_training_file, "cats", 1)
    ready(xdb)
    with pytest.raises(Conflict, match=r"bud 'cats' has 6 example texts left; a training file needs 7"):
        xdb.read(bud_training_file, "cats", 7)


@pytest.fixture
def client(xdb: XDB) -> Iterator[TestClient]:
    app = FastAPI()
    install_gateway(app)
    app.include_router(xdb_router(xdb, bud_min_examples=4))
    with TestClient(app) as c:
        yield c


def test_export_over_http(client: TestClient, xdb: XDB) -> None:
    for tag, status, message in [("nope", 404, "tag 'nope' not found"),
                                 ("cats", 409, "is candidate: its examples export once it is ready")]:
        answer = client.get(f"/v1/xdb/buds/{tag}/examples")
        assert answer.status_code == status and message in answer.json()["error"]["message"]
        assert answer.json()["error"]["param"] == ("tag" if status == 409 else None)
    assert client.post("/v1/xdb/buds", json={"tag": "cats", "status": "ready"}).status_code == 200
    answer = client.get("/v1/xdb/buds/cats/examples")
    assert answer.status_code == 200 and answer.json() == xdb.read(bud_training_file, "cats", 4)


def test_submitting_writes_the_evidence_package(client: TestClient, xdb: XDB) -> None:
    ready(xdb)
    answer = client.post("/v1/xdb/evidence", json={"bud": "cats", "submission_id": "sub-1"})
    assert answer.status_code == 200, answer.text
    package = Path(answer.json()["package"])
    assert package == xdb.data_dir / "exports" / "sub-1"
    assert sorted(p.name for p in package.iterdir()) == ["applications.parquet", "evidence.json", "rows.parquet",
                                                         "training.json"]
    manifest = json.loads((package / "evidence.json").read_text())
    windows = answer.json()["data"]
    assert manifest["bud"]["name"] == "cats" and manifest["submission_id"] == "sub-1"
    assert [w["id"] for w in manifest["windows"]] == [w["id"] for w in windows] and len(windows) == 6
    seq, head = xdb.audit_head()
    assert manifest["audit_head"] == {"seq": seq, "hash": head}  # the submission's event is the chain's head
    # A reply's window is its request's ticks: its input row and its tokens.
    words = sum(len(t.split(" ")) for t in CATS)
    assert manifest["rows"]["timesteps"] == words + len(CATS) and manifest["rows"]["tag_applications"] == 6
    rows = duckdb.sql(f"SELECT string_agg(content, '' ORDER BY tick) FROM '{package / 'rows.parquet'}' "
                      "WHERE event_type = 'output' GROUP BY request_id ORDER BY min(tick)").fetchall()
    assert [r[0] for r in rows] == CATS
    training = json.loads((package / "training.json").read_text())
    assert training["concepts"] == client.get("/v1/xdb/buds/cats/examples").json()["concepts"]  # submitted: exports
    assert xdb.exports(None) == []  # evidence is no export: never listed, never expired with them
    again = client.post("/v1/xdb/evidence", json={"bud": "cats", "submission_id": "sub-1"})
    assert again.status_code == 409
    assert client.post("/v1/xdb/evidence/sub-1/resolve", json={"accepted": True}).status_code == 200
    assert (package / "evidence.json").is_file()  # resolving keeps the package
    assert next(b for b in xdb.read(list_buds) if b["name"] == "cats")["bud_status"] == "grafted"


def test_a_package_that_cannot_be_written_leaves_nothing_submitted(client: TestClient, xdb: XDB) -> None:
    ready(xdb)
    bad = client.post("/v1/xdb/evidence", json={"bud": "cats", "submission_id": "../escape"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "submission_id"
    with pytest.raises(InvalidRequest):
        xdb.submit_evidence("cats", ".hidden", 4)
    (xdb.data_dir / "exports").write_text("a file where the packages' directory goes")
    with pytest.raises(OSError):
        xdb.submit_evidence("cats", "sub-2", 4)
    (xdb.data_dir / "exports").unlink()
    (xdb.data_dir / "exports").mkdir()
    (xdb.data_dir / "exports" / "sub-2").mkdir()  # a package left from elsewhere is never overwritten
    assert client.post("/v1/xdb/evidence", json={"bud": "cats", "submission_id": "sub-2"}).status_code == 409
    # Nothing was submitted: the bud is still ready, no window is locked, no temporary directory is left.
    assert next(b for b in xdb.read(list_buds) if b["name"] == "cats")["bud_status"] == "ready"
    assert xdb.read(list_windows) == []
    assert [p.name for p in (xdb.data_dir / "exports").iterdir()] == ["sub-2"]
    (xdb.data_dir / "exports" / "sub-2").rmdir()
    # A bud that cannot be learnt (nothing to contrast it with) is not submitted either.
    xdb.tag("everything", tag_type="bud", session_id="s1", tick_range=[0, 10_000], owner=EVERY)
    xdb.tag("everything", tag_type="bud", session_id="s2", tick_range=[0, 10_000], owner=EVERY)
    ready(xdb, "everything", 2)
    with pytest.raises(Conflict, match="no reply it does not tag to contrast it with"):
        xdb.submit_evidence("everything", "sub-3", 2)
    assert xdb.read(list_windows) == [] and list((xdb.data_dir / "exports").iterdir()) == []
    assert client.post("/v1/xdb/evidence", json={"bud": "cats", "submission_id": "sub-2"}).status_code == 200


def test_the_cli_exports_and_fails_in_one_line(xdb: XDB, tmp_path: Path) -> None:
    ready(xdb)
    data_dir = xdb.data_dir
    xdb.close()
    out = tmp_path / "cats.json"
    done = ahc("xdb", "bud-export", "cats", "--data-dir", str(data_dir), "--out", str(out), "--min-examples", "4")
    assert done.returncode == 0, done.stderr
    assert [c.id for c in load_examples(out)] == ["cats", "not-cats"] and "cats 5+1" in done.stdout
    for bud, message in [("nope", "tag 'nope' not found"), ("cats", "has 6 example texts left")]:
        failed = ahc("xdb", "bud-export", bud, "--data-dir", str(data_dir), "--out", str(tmp_path / "x.json"),
                     "--min-examples", "9")
        assert failed.returncode == 1 and message in failed.stderr and len(failed.stderr.splitlines()) == 1
    assert not (tmp_path / "x.json").exists()
