"""The review step (server/karma/karma_review.py): outcomes proposed for Karma, decided by a person (an
auditor, the operator) or the served model, stored with who decided and why, and the accepted ones in the
next turn's prompt, staged as a client's new Karma entry is. AHC's whole app on the fake engine
(tests/fake_app.py), a real XDB."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_app import ALICE, BOB, CAROL, serving
from fastapi.testclient import TestClient

from core.config import AHCConfig
from core.limits import KARMA_MAX_ENTRIES
from orchestrator.context_spec import ContextSpec, KarmaEntry
from orchestrator.karma import with_held_karma
from server.karma.karma_review import ModelVerdict, parse_verdict
from server.runtime import Runtime
from xdb.audit.chain import EVENT_TYPE
from xdb.karma_reviews import karma_proposals

FACT = "The ring has 12 cells."
VERDICT = "accepted: the session says the ring has 12 cells."


def auth(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def say(client: TestClient, session: str, words: str, key: str | None = None,
        karma: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", headers=auth(key), json={
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": words}],
        "context": {"session_id": session, "identity": "You are terse.", "karma": karma or []}})
    assert response.status_code == 200, response.text
    return response.json()["context"]  # type: ignore[no-any-return]


def last_prompt(runtime: Runtime) -> str:
    """The text of the engine's last chat request (the hidden calls' aside)."""
    engine: Any = runtime.hidden.engine
    chat = [r for r in engine.requests if not r.request_id.startswith("ahc-hidden-")]
    return str(runtime.tokenizer.decode(chat[-1].prompt_token_ids))


def propose(client: TestClient, key: str | None = None, **body: Any) -> Any:
    return client.post("/v1/context/karma/proposals", headers=auth(key),
                       json={"text": FACT, "session_id": "lab", "source_session_id": "lab",
                             "tick_range": [0, 1000], **body})


def decide(client: TestClient, proposal_id: int, key: str | None = None, **body: Any) -> Any:
    return client.post(f"/v1/context/karma/proposals/{proposal_id}/review", headers=auth(key), json=body)


def block(report: dict[str, Any], name: str) -> str:
    return next(str(b["sha256"]) for b in report["blocks"] if b["name"] == name)



@pytest.fixture
def model_reviews(config: AHCConfig, vllm_config, tmp_path: Path) -> Iterator[tuple[TestClient, Runtime]]:  # type: ignore[no-untyped-def]
    """No keys (the operator's server), and every reply of the engine the verdict VERDICT."""
    from transformers import AutoTokenizer

    script = AutoTokenizer.from_pretrained(config.model).encode(VERDICT, add_special_tokens=False)
    with serving(config, vllm_config, tmp_path, script=script) as served:
        yield served


def test_an_accepted_outcome_is_staged_in_the_next_query_then_joins_the_karma_block_when_state_is_rewritten(
        served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    first = say(client, "lab", "How many cells?")
    made = propose(client)
    assert made.status_code == 200, made.text
    proposal = made.json()
    assert proposal["status"] == "pending" and proposal["session_id"] == "lab"
    assert proposal["source"] == {"session_id": "lab", "tick_range": [0, 1000], "event_id": None}
    # Pending: in no prompt.
    say(client, "lab", "Go on.")
    assert FACT not in last_prompt(runtime)
    # The operator decides as a person; the verdict is stored with who, when and why.
    decided = decide(client, proposal["id"], verdict="accepted", rationale="I counted them.")
    assert decided.status_code == 200, decided.text
    review = decided.json()["reviews"][0]
    assert decided.json()["status"] == "accepted"
    assert (review["action"], review["reviewer"], review["reviewer_kind"], review["rationale"]) == \
        ("accepted", "default", "person", "I counted them.")
    # The next turn carries it in its Query block, so the Karma block (and the cached prefix) holds...
    staged = say(client, "lab", "And now?")
    prompt = last_prompt(runtime)
    assert FACT in prompt and prompt.index(FACT) > prompt.index("And now?") - 200
    assert "New karma" in prompt or "new_karma" in prompt
    assert block(staged, "karma") == block(first, "karma") and staged["first_changed_block"] == "state"
    # The session's State keeps the user turn with the entry it staged.
    state = runtime.orchestrator.sessions.get("lab").messages
    assert any(FACT in m.content for m in state if m.role == "user")
    # ...and the turn after keeps it in State, the Karma block unchanged.
    after = say(client, "lab", "Once more.")
    assert block(after, "karma") == block(first, "karma") and after["first_changed_block"] == "state"
    assert last_prompt(runtime).count(FACT) == 1
    # What the session's prompts carry from the review step.
    held = client.get("/v1/context/karma", params={"session_id": "lab"}).json()["data"]
    assert [(p["id"], p["text"]) for p in held] == [(proposal["id"], FACT)]
    assert client.get("/v1/context/karma", params={"session_id": "elsewhere"}).json()["data"] == []
    # When the State is rewritten (a compaction), the entry moves into the Karma block.
    for n in range(3):  # more turns than compaction keeps verbatim (4)
        say(client, "lab", f"Question {n}?")
    assert client.post("/v1/context/sessions/lab/compact").status_code == 202
    runtime.background.submit(lambda: None).result()  # the ordered State saves have landed
    compacted = say(client, "lab", "After compaction?")
    assert "compaction" in compacted["governor"]
    assert block(compacted, "karma") != block(first, "karma")
    prompt = last_prompt(runtime)
    assert prompt.index(FACT) < prompt.index("After compaction?")
    # Another session of the tenant never sees a session-scoped outcome.
    say(client, "other", "Hello?")
    assert FACT not in last_prompt(runtime)


def test_a_rejected_outcome_never_reaches_a_prompt_and_a_retracted_one_leaves(
        served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    say(client, "lab", "Start.")
    rejected = propose(client, text="The ring has 99 cells.").json()
    assert decide(client, rejected["id"], verdict="rejected", rationale="Wrong count.").json()["status"] == "rejected"
    tenant_wide = propose(client, scope="tenant", session_id=None).json()
    assert decide(client, tenant_wide["id"], verdict="accepted", rationale="Checked.").status_code == 200
    say(client, "lab", "Next.")
    assert "99 cells" not in last_prompt(runtime) and FACT in last_prompt(runtime)
    say(client, "fresh", "A new session.")  # a tenant-scoped outcome is in every session's Karma block
    prompt = last_prompt(runtime)
    assert FACT in prompt and prompt.index(FACT) < prompt.index("A new session.")
    retracted = client.post(f"/v1/context/karma/proposals/{tenant_wide['id']}/retract",
                            json={"rationale": "Superseded."})
    assert retracted.status_code == 200, retracted.text
    assert [r["action"] for r in retracted.json()["reviews"]] == ["accepted", "retracted"]
    say(client, "fresh", "Still there?")
    assert FACT not in last_prompt(runtime)
    # Deciding again, or retracting what is not accepted, is a conflict; the rows stay as they were.
    again = decide(client, rejected["id"], verdict="accepted", rationale="Changed my mind.")
    assert again.status_code == 409 and "rejected" in again.json()["error"]["message"]
    assert client.post(f"/v1/context/karma/proposals/{rejected['id']}/retract",
                       json={"rationale": "x"}).status_code == 409
    listed = client.get("/v1/context/karma/proposals", params={"status": "rejected"}).json()["data"]
    assert [p["id"] for p in listed] == [rejected["id"]]
    # Each proposal and verdict is chained in the audit log.
    records = runtime.xdb.audit_records(None, EVENT_TYPE, None, None, -1, 1000)
    actions = [a for r in records for a in ("karma_proposed", "karma_reviewed") if a in json.dumps(r, default=str)]
    assert actions == ["karma_proposed", "karma_reviewed", "karma_proposed", "karma_reviewed", "karma_reviewed"]


def test_the_reviewer_model_gives_a_verdict_from_the_cited_evidence(model_reviews: tuple[TestClient, Runtime]) -> None:
    client, runtime = model_reviews
    say(client, "lab", "Count: the ring has twelve cells.")
    deadline = time.monotonic() + 10  # the turn's rows are committed by the writer, in the background
    while not client.get("/v1/xdb/recall", params={"session_id": "lab"}).json()["data"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proposal = propose(client).json()
    decided = decide(client, proposal["id"], reviewer="model")
    assert decided.status_code == 200, decided.text
    review = decided.json()["reviews"][0]
    assert decided.json()["status"] == "accepted"
    assert review["reviewer_kind"] == "model" and review["reviewer"] == runtime.config.model_name
    assert review["rationale"] == "the session says the ring has 12 cells."
    engine: Any = runtime.hidden.engine
    asked = engine.requests[-1]
    question = runtime.tokenizer.decode(asked.prompt_token_ids)
    assert asked.request_id.startswith("ahc-hidden-") and "twelve cells" in question and FACT in question
    assert asked.sampling_params.structured_outputs.regex.startswith("(accepted|rejected)")
    say(client, "lab", "Next turn.")
    assert FACT in last_prompt(runtime)


def test_a_model_review_past_the_tenants_background_budget_is_a_429_and_stays_pending(
        config: AHCConfig, vllm_config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A model review is a background call like a Codex rendition: it counts against the tenant's hourly
    budget (here ~20 tokens, less than the question), and one that does not fit is refused before the model
    is asked; the proposal waits for another review."""
    with serving(config, vllm_config, tmp_path, **{"orchestrator.codex_condense_windows_per_hour": 0.01}) as served:
        client, runtime = served
        say(client, "lab", "Count: the ring has twelve cells.")
        proposal = propose(client).json()
        engine: Any = runtime.hidden.engine
        asked = len(engine.requests)
        refused = decide(client, proposal["id"], reviewer="model")
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "hidden_call_budget", refused.text
        assert int(refused.headers["retry-after"]) >= 1 and len(engine.requests) == asked
        [stored] = [p for p in runtime.xdb.read(karma_proposals, None, None, 10) if p["id"] == proposal["id"]]
        assert stored["status"] == "pending" and stored["reviews"] == []


def test_tenants_see_and_promote_only_their_own_and_only_a_reviewer_decides_as_a_person(
        audited: tuple[TestClient, Runtime]) -> None:
    client, runtime = audited
    say(client, "lab", "Alice's session.", ALICE)
    say(client, "lab", "Bob's session.", BOB)
    made = propose(client, ALICE)
    assert made.status_code == 200, made.text
    pid = made.json()["id"]
    assert made.json()["session_id"] == "lab"  # as Alice named it
    # Bob neither sees nor decides Alice's proposal.
    assert client.get("/v1/context/karma/proposals", headers=auth(BOB)).json()["data"] == []
    assert decide(client, pid, BOB, reviewer="model").status_code == 404
    # Alice may not verify her own claim as a person.
    refused = decide(client, pid, ALICE, verdict="accepted", rationale="trust me")
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"
    # The auditor sees every tenant's proposals (ids as stored) and decides.
    listed = client.get("/v1/context/karma/proposals", headers=auth(CAROL)).json()["data"]
    assert [(p["id"], p["tenant"], p["session_id"]) for p in listed] == [(pid, "alice", "alice/lab")]
    decided = decide(client, pid, CAROL, verdict="accepted", rationale="Matches the log.")
    assert decided.status_code == 200, decided.text
    assert decided.json()["reviews"][0]["reviewer"] == "carol"
    assert propose(client, CAROL).status_code == 403  # an auditor verifies, and proposes nothing
    assert client.get("/v1/context/karma", headers=auth(CAROL)).status_code == 403  # an auditor's key: proposals only
    say(client, "lab", "Alice again.", ALICE)
    assert FACT in last_prompt(runtime)
    say(client, "lab", "Bob again.", BOB)
    assert FACT not in last_prompt(runtime)
    assert client.get("/v1/context/karma", headers=auth(BOB), params={"session_id": "lab"}).json()["data"] == []
    # Stored under Alice's name and her scoped session.
    stored = runtime.xdb.read(karma_proposals, "alice")
    assert [(p["tenant"], p["session_id"], p["status"]) for p in stored] == [("alice", "alice/lab", "accepted")]


@pytest.mark.parametrize(("body", "param"), [
    ({"text": ""}, "text"),
    ({"scope": "session", "session_id": None}, "session_id"),
    ({"scope": "tenant"}, "session_id"),
    ({"tick_range": [5, 1]}, "tick_range"),
    ({"source_session_id": None, "tick_range": None}, "source_session_id"),
    ({"scope": "galaxy"}, "scope"),
    ({"extra": 1}, "extra"),
    ({"text": "x" * 20_001}, "text"),
])
def test_a_bad_proposal_is_a_clear_error_and_stores_nothing(served: tuple[TestClient, Runtime],
                                                            body: dict[str, Any], param: str) -> None:
    client, runtime = served
    response = propose(client, **body)
    assert response.status_code in (400, 422), response.text
    assert param in response.text and response.json()["error"]["type"] in ("invalid_request_error", "BadRequestError")
    assert runtime.xdb.read(karma_proposals, None) == []


def test_a_bad_review_is_a_clear_error(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    pid = propose(client).json()["id"]
    for proposal_id, body, status in (
            (pid, {"verdict": "accepted"}, 422), (pid, {"verdict": "maybe", "rationale": "x"}, 422),
            (pid, {"reviewer": "model", "verdict": "accepted"}, 422), (pid, {"reviewer": "robot"}, 422),
            (0, {"verdict": "accepted", "rationale": "x"}, 422),
            (pid + 1, {"verdict": "accepted", "rationale": "x"}, 404)):
        response = decide(client, proposal_id, **body)
        assert response.status_code in (400, status), response.text
        assert "error" in response.json()
    assert client.get("/v1/context/karma/proposals", params={"status": "lost"}).status_code in (400, 422)
    assert runtime.xdb.read(karma_proposals, None)[0]["status"] == "pending"


def test_a_model_answer_without_a_verdict_is_a_rejection_that_keeps_the_answer() -> None:
    assert parse_verdict("accepted: it says so") == ModelVerdict("accepted", "it says so")
    assert parse_verdict(" rejected:no evidence") == ModelVerdict("rejected", "no evidence")
    unclear = parse_verdict("Perhaps.")
    assert unclear.verdict == "rejected" and "'Perhaps.'" in unclear.rationale


def test_a_deleted_session_takes_its_proposals_and_their_reviews_with_it(served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    say(client, "lab", "Start.")
    pid = propose(client).json()["id"]
    tenant_wide = propose(client, scope="tenant", session_id=None).json()["id"]
    for proposal_id in (pid, tenant_wide):
        assert decide(client, proposal_id, verdict="accepted", rationale="ok").status_code == 200
    assert client.delete("/v1/context/sessions/lab").status_code in (200, 204)
    assert [p["id"] for p in runtime.xdb.read(karma_proposals, None)] == [tenant_wide]
    assert decide(client, pid, verdict="rejected", rationale="x").status_code == 404


def test_held_karma_fills_the_request_up_to_the_bound_and_keeps_the_clients_own() -> None:
    """The server's promoted entries go after the client's, an id the client uses stays the client's, and
    the whole list stops at KARMA_MAX_ENTRIES with the earliest held entries kept (a cached prefix stays)."""
    own = [KarmaEntry(id=f"c{i}", text="client") for i in range(KARMA_MAX_ENTRIES - 2)]
    spec = ContextSpec(session_id="s", karma=[*own, KarmaEntry(id="h0", text="the client's h0")])
    held = tuple(KarmaEntry(id=f"h{i}", text="held") for i in range(4))
    merged = with_held_karma(spec, held).karma
    # 9,999 of the client's (h0 among them): room for one held entry, the earliest the client lacks.
    assert len(merged) == KARMA_MAX_ENTRIES and [e.id for e in merged[-2:]] == ["h0", "h1"]
    assert merged[-2].text == "the client's h0"
    assert with_held_karma(ContextSpec(session_id="s"), held).karma == list(held)
