"""What the experience browser reads (xdb/recall/browse.py) and its routes (server/routes/browse_routes.py), on a real
XDB file: sessions at a glance, a session turn by turn, a concept's strongest tokens, the audit."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from routed import routed

from server.routes.browse_routes import browse_router
from server.tenancy.tenants import Tenant
from xdb import XDB, TimestepRow
from xdb.owner import EVERY
from xdb.recall.browse import break_reason, session_turns, sessions_overview
from xdb.rows import TokenBatch

CONCEPTS = ["motion", "collision"]


def blocks(**tokens: int) -> list[dict[str, Any]]:
    return [{"name": n, "tokens": t, "sha256": f"{n}{t}"} for n, t in tokens.items()]


def report(mode: str = "cag", first_changed: str | None = "state", compactions: int = 0,
           **tokens: int) -> dict[str, Any]:
    return {"mode": mode, "blocks": blocks(**(tokens or {"identity": 10, "state": 5, "query": 3})),
            "first_changed_block": first_changed, "compactions": compactions}


def test_why_the_cache_broke() -> None:
    assert break_reason(report(), None) == "first turn: nothing cached yet"
    assert break_reason({**report(), "cached_tokens": 480}, None) == \
        "first turn: 480 tokens read from a prefix already cached"
    assert break_reason(report(first_changed=None), report()) is None
    assert break_reason(report(compactions=1), report()) == "the State was compacted"
    assert break_reason(report("rag", "codex"), report("cag")) == "mode cag → rag"
    grew = report(identity=10, state=9, query=3)
    assert break_reason(grew, report()) == "state grew: 5 → 9 tokens"
    assert break_reason(report(identity=10, state=2, query=3), report()) == "state shrank: 5 → 2 tokens"
    assert break_reason(report(), report()) == "state text changed (5 tokens)"
    karma = report("cag", "karma", identity=10, karma=4, state=5, query=3)
    assert break_reason(karma, report()) == "karma block added"


def turn(xdb: XDB, session: str, tokens: int, *, prompt: int, cached: int, mode: str = "cag",
         first_changed: str | None = "state", tool: bool = False, values: float = 0.5) -> None:
    """One recorded turn as the server writes it: inputs, tokens, a tool call, then the turn record."""
    ticks = xdb.next_ticks(session, 1)
    xdb.writer.submit([TimestepRow(session_id=session, tick=ticks[0], event_type="input", role="user",
                                   content=f"q{ticks[0]}")])
    out = xdb.next_ticks(session, tokens)
    index = np.tile(np.arange(len(CONCEPTS), dtype=np.int32), (tokens, 1))
    vals = np.array([[values + i / 100, 0.1] for i in range(tokens)], dtype=np.float32)
    xdb.writer.submit(TokenBatch(session, out, [f"t{i}" for i in range(tokens)], request_id=f"r-{session}-{out[0]}",
                                 concept_names=CONCEPTS, concept_index=index, concept_values=vals))
    if tool:
        xdb.writer.submit([TimestepRow(session_id=session, tick=xdb.next_ticks(session, 1)[0], event_type="tool_call",
                                       role="assistant", content=json.dumps({"name": "run"}))])
    meta = {"turn": {**report(mode, first_changed), "prompt_tokens": prompt, "cached_tokens": cached,
                     "completion_tokens": tokens, "request_id": f"r-{session}-{out[0]}"}}
    xdb.writer.submit([TimestepRow(session_id=session, tick=xdb.next_ticks(session, 1)[0], event_type="system",
                                   content="turn", metadata=meta)])
    xdb.writer.flush()


@pytest.fixture
def xdb(tmp_path: Path) -> Iterator[XDB]:
    with XDB.open(tmp_path / "xdb") as xdb:
        turn(xdb, "alice/a1", 4, prompt=100, cached=0, first_changed=None)
        turn(xdb, "alice/a1", 3, prompt=120, cached=90, tool=True)
        turn(xdb, "alice/a1", 2, prompt=200, cached=0, mode="rag", first_changed="codex", values=0.9)
        turn(xdb, "bob/b1", 5, prompt=50, cached=0, first_changed=None)
        xdb.pin("bob/b1", 0, 3)
        # A session with rows but no turn record (a raw completion, an import).
        xdb.writer.submit(TokenBatch("alice/raw", xdb.next_ticks("alice/raw", 7), ["x"] * 7))
        xdb.writer.flush()
        yield xdb


def test_sessions_at_a_glance(xdb: XDB) -> None:
    found = {s["session_id"]: s for s in xdb.read(sessions_overview, owner=EVERY)}
    a1 = found["alice/a1"]
    assert (a1["tenant"], a1["turns"], a1["prompt_tokens"], a1["cached_tokens"], a1["generated_tokens"]) == \
        ("alice", 3, 420, 90, 9)
    assert a1["hit_ratio"] == pytest.approx(90 / 420) and a1["mode"] == "rag" and not a1["pinned"]
    assert found["bob/b1"]["pinned"] and not found["bob/b1"]["submitted"]
    raw = found["alice/raw"]
    assert raw["turns"] == 0 and raw["generated_tokens"] == 7 and raw["last_activity"] and raw["hit_ratio"] is None
    # Most recently active first (sessions with turn records by their last turn).
    order = [s["session_id"] for s in xdb.read(sessions_overview, owner=EVERY) if s["turns"]]
    assert order == ["bob/b1", "alice/a1"]
    assert {s["session_id"] for s in xdb.read(sessions_overview, "alice/")} == {"alice/a1", "alice/raw"}
    assert [s["session_id"] for s in xdb.read(sessions_overview, query="raw", owner=EVERY)] == ["alice/raw"]
    assert len(xdb.read(sessions_overview, limit=1, owner=EVERY)) == 1


def test_a_session_turn_by_turn(xdb: XDB) -> None:
    xdb.compact("alice/a1", up_to_tick=5, summary="what came before")  # as the server does: before the turn
    found = xdb.read(session_turns, "alice/a1")
    turns = found["turns"]
    assert [t["index"] for t in turns] == [1, 2, 3]
    assert [(t["tick_from"], t["tick_to"]) for t in turns] == [(0, 5), (6, 11), (12, 15)]
    assert [e["event_type"] for e in turns[1]["events"]] == ["input", "tool_call"]
    assert turns[0]["reason"] == "first turn: nothing cached yet" and turns[2]["reason"] == "mode cag → rag"
    assert turns[1]["prompt_tokens"] == 120 and turns[1]["cached_tokens"] == 90
    assert [t["reply"] for t in turns] == ["t0t1t2t3", "t0t1t2", "t0t1"]  # each turn's own tokens, in order
    [compaction] = turns[1]["compactions"]  # made before the turn's first input, tick 6
    assert compaction["range_end"] == 5 and compaction["summary"] == "what came before"
    assert found["pending"] == [] and found["last_tick"] == 15
    # Rows after the last turn record: a turn still running.
    xdb.writer.submit([TimestepRow(session_id="alice/a1", tick=xdb.next_ticks("alice/a1", 1)[0], event_type="input",
                                   role="user", content="still thinking")])
    xdb.writer.flush()
    assert [e["content"] for e in xdb.read(session_turns, "alice/a1")["pending"]] == ["still thinking"]
    with pytest.raises(LookupError):
        xdb.read(session_turns, "nobody")


def test_a_concepts_strongest_tokens(xdb: XDB) -> None:
    top = xdb.top_tokens("motion", limit=3, owner=EVERY)
    assert [t["activation"] for t in top] == sorted((t["activation"] for t in top), reverse=True)
    assert top[0]["session_id"] == "alice/a1" and top[0]["activation"] == pytest.approx(0.91)
    assert {t["session_id"] for t in xdb.top_tokens("motion", "bob/", 50)} == {"bob/b1"}
    assert xdb.top_tokens("never-seen", owner=EVERY) == []


# ---- the routes ----------------------------------------------------------------------------------------

@pytest.fixture
def client(xdb: XDB) -> Iterator[tuple[TestClient, list[Tenant]]]:
    with routed(browse_router(xdb), tenant="alice") as served:
        yield served


def test_a_tenant_browses_only_its_own(client: tuple[TestClient, list[Tenant]]) -> None:
    http, caller = client
    sessions = http.get("/v1/xdb/sessions").json()["data"]
    assert {s["session_id"] for s in sessions} == {"a1", "raw"}
    turns = http.get("/v1/xdb/sessions/a1/turns").json()
    assert turns["session_id"] == "a1" and len(turns["turns"]) == 3
    assert http.get("/v1/xdb/sessions/b1/turns").status_code == 404  # bob's, as alice names it
    assert http.get("/v1/xdb/sessions/..%2Fbob%2Fb1/turns").status_code == 404
    top = http.get("/v1/xdb/concepts/motion/top_tokens", params={"limit": 100}).json()["data"]
    assert top and {t["session_id"] for t in top} == {"a1"}
    caller[0] = Tenant("bob")
    assert [s["session_id"] for s in http.get("/v1/xdb/sessions").json()["data"]] == ["b1"]


@pytest.mark.parametrize("path, param", [("/v1/xdb/sessions?limit=0", "limit"),
                                         ("/v1/xdb/sessions?limit=1001", "limit"),
                                         ("/v1/xdb/concepts/motion/top_tokens?limit=x", "limit")])
def test_bad_browse_queries_are_400_naming_the_param(client: tuple[TestClient, list[Tenant]], path: str,
                                                     param: str) -> None:
    response = client[0].get(path)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_the_audit_head_and_a_verification(client: tuple[TestClient, list[Tenant]], xdb: XDB) -> None:
    http, _ = client
    before = http.get("/v1/xdb/audit").json()
    seq, head = xdb.audit_head()
    assert (before["head_seq"], before["head_sha256"], before["last_verification"]) == (seq, head, None)
    verdict = http.post("/v1/xdb/audit/verify", json={}).json()
    assert verdict["ok"] and verdict["records_checked"] == seq + 1 and verdict["first_bad"] is None
    assert http.get("/v1/xdb/audit").json()["last_verification"] == verdict
    again = http.post("/v1/xdb/audit/verify", json={})
    assert again.status_code == 429 and again.json()["error"]["code"] == "verification_cooldown"
    assert int(again.headers["Retry-After"]) >= 1
    assert http.get("/v1/xdb/audit").json()["last_verification"] == verdict  # the verdict stays readable


def test_a_verification_goes_on_from_where_the_last_one_ended(xdb: XDB) -> None:
    """The second re-hashes only the records committed since the first (with the checkpoint and concept
    chains whole); a broken chain makes the next one whole again; and so does the hour."""
    from server.routes.browse_routes import AuditVerifier

    verifier = AuditVerifier(xdb, cooldown_s=0.0)
    first = verifier.verify()
    seq, _ = xdb.audit_head()
    assert first.ok and first.from_seq == 0 and first.records_checked == seq + 1
    xdb.writer.submit(TokenBatch("carol/c1", xdb.next_ticks("carol/c1", 5), ["y"] * 5))
    xdb.writer.flush()
    time.sleep(10 * first.seconds + 0.05)  # the cooldown: ten times the last one's length
    second = verifier.verify()
    assert second.ok and second.from_seq == seq + 1
    assert second.records_checked == 5  # from the checkpoint that ended at seq, not from genesis
    verifier.full_every_s = 0.0
    time.sleep(10 * second.seconds + 0.05)
    assert verifier.verify().from_seq == 0


def test_one_verification_at_a_time() -> None:
    """A second request while one runs is a 429 at once, not a second re-hash of the whole chain."""
    import threading

    from core.errors import RateLimited
    from server.routes.browse_routes import AuditVerifier
    from xdb.audit.verify import AuditReport

    release, entered = threading.Event(), threading.Event()

    class SlowChain:  # stands in for a chain that takes long to re-hash
        def audit_head(self) -> tuple[int, str]:
            return 6, "00"

        def verify_audit(self, seq_from: int | None = None) -> AuditReport:
            entered.set()
            release.wait(10)
            return AuditReport(True, 7)

    verifier = AuditVerifier(SlowChain(), cooldown_s=0.0)  # type: ignore[arg-type]
    first = threading.Thread(target=verifier.verify)
    first.start()
    assert entered.wait(10)
    with pytest.raises(RateLimited) as running:
        verifier.verify()
    assert running.value.code == "verification_running"
    release.set()
    first.join()
    assert verifier.last is not None and verifier.last.records_checked == 7
    with pytest.raises(RateLimited) as soon:  # a long verification buys a wait ten times its length
        verifier.verify()
    assert soon.value.code == "verification_cooldown"
