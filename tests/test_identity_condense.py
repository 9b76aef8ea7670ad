"""`POST /v1/context/identity/condense` on the fake engine: a condensation accepted and stored, one refused,
every bad input a 4xx in the OpenAI shape, tenancy; the verdict itself with a stand-in model that answers by
its persona (a unit test of the check, on a real XDB)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ahc
from fake_app import ALICE, BOB
from fastapi.testclient import TestClient

from ahc.cli.identity import condense_over_http, summary
from core.errors import PayloadTooLarge
from server.identity.identity_condenser import CondenseRequest, IdentityCondenser, Limits, read_traces
from server.identity.identity_tests import IdentityTest
from server.runtime import Runtime
from server.tenancy.tenant_xdb import TenantXDB
from server.tenancy.tenants import LOCAL
from xdb import XDB
from xdb.documents import list_documents
from xdb.owner import EVERY
from xdb.runs import log_interaction

PATH = "/v1/context/identity/condense"
# Long enough that the fake engine's reply (" The particles move right, then left.") is shorter.
IDENTITY = ("You are Ada, a careful physics assistant for the Lattice Lab. Always answer in one sentence. "
            "Name the direction particles move. Never speculate beyond the rules. Sign off as Ada. ") * 3


def turn(client: TestClient, session: str, question: str, **headers: str) -> None:
    reply = client.post("/v1/chat/completions", headers=headers, json={
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": question}],
        "context": {"session_id": session, "identity": IDENTITY}})
    assert reply.status_code == 200, reply.text


def settle(runtime: Runtime) -> None:
    runtime.xdb.writer.flush()


def test_a_condensation_that_passes_every_test_is_accepted_stored_and_audited(
        served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    turn(client, "won", "Which way do the particles move?")
    settle(runtime)
    client.post("/v1/xdb/interactions", json={"run_id": "r1", "journal_entry": "moved right as the rules say"})
    reply = client.post(PATH, json={"identity": IDENTITY, "name": "ada", "sessions": ["won"], "runs": ["r1"],
                                    "tests": [{"input": "Which way?", "contains": "right", "pattern": r"left\.$"},
                                              {"input": "Your colour?", "contains": "purple"}]})
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert result["accepted"] is True and result["reason"] is None and result["made_by"] == "model"
    assert result["condensed"] == "The particles move right, then left."
    assert 0 < result["tokens_after"] < result["tokens_before"]
    passing, failing_both = result["tests"]
    assert passing["full"]["passed"] and passing["condensed"]["passed"]
    # A test the full Identity fails is reported, not held against the condensed one.
    assert not failing_both["full"]["passed"] and failing_both["full"]["failures"] == ["does not contain 'purple'"]
    assert result["failing"] == []
    stored = client.get(f"/v1/xdb/documents/{result['identity']['id']}").json()
    assert stored["doc_type"] == "identity" and stored["path"] == "ahc/identity/ada"
    assert stored["content"] == result["condensed"] and stored["version"] == 1
    check = client.get(f"/v1/xdb/documents/{result['check']['id']}").json()
    assert json.loads(check["content"])["tests"] == result["tests"]
    # A second accepted condensation of the same name is the document's next version.
    again = client.post(PATH, json={"identity": IDENTITY, "name": "ada", "tests": [{"input": "?", "contains": "left"}]})
    assert again.json()["identity"] == {**again.json()["identity"], "id": result["identity"]["id"], "version": 2}
    events = [e for e in (json.loads(r["content"]) for r in runtime.xdb.audit_records(event_type="xdb_event",
                                                                                     limit=1000))
              if e["action"] == "identity_condensed"]
    assert [e["identity"] for e in events] == [f"{result['identity']['id']}@1", f"{result['identity']['id']}@2"]
    assert events[0]["check_sha256"] == check["content_hash"] and events[0]["accepted"] is True
    assert events[0]["identity_sha256"] == stored["content_hash"]
    assert "particles" not in json.dumps(events)  # the texts by hash only
    assert runtime.xdb.verify_audit().ok


def test_a_sessions_trace_shows_each_question_with_the_reply_the_agent_gave(
        served: tuple[TestClient, Runtime]) -> None:
    client, runtime = served
    answers = []
    for question in ("Which way do the particles move?", "And after the wall?"):
        answers.append(client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": question}],
            "context": {"session_id": "won", "identity": IDENTITY}}).json()["choices"][0]["message"]["content"])
    settle(runtime)
    lines = read_traces(TenantXDB(runtime.xdb, LOCAL), ("won",), ())
    replies = [" ".join(answer.split()) for answer in answers]  # a trace's line is its text's words
    assert lines == ["## session won", "user: Which way do the particles move?", f"assistant: {replies[0]}",
                     "user: And after the wall?", f"assistant: {replies[1]}"]


def test_a_candidate_no_shorter_than_the_identity_is_refused_and_only_its_check_is_stored(
        served: tuple[TestClient, Runtime]) -> None:
    client, _ = served
    reply = client.post(PATH, json={"identity": "Be brief.", "candidate": "Be brief, always, in every answer.",
                                    "tests": [{"input": "Which way?", "contains": "right"}]})
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert result["accepted"] is False and "no shorter" in result["reason"] and result["identity"] is None
    assert result["made_by"] == "caller"
    assert client.get("/v1/xdb/documents", params={"doc_type": "identity"}).json()["data"] == []
    checks = client.get("/v1/xdb/documents", params={"doc_type": "reference"}).json()["data"]
    assert [d["path"] for d in checks] == ["ahc/identity-checks/identity"]


@pytest.mark.parametrize("body, status, param", [
    ({"identity": IDENTITY, "tests": []}, 400, None),
    ({"identity": "   ", "tests": [{"input": "?", "contains": "x"}]}, 400, "identity"),
    ({"identity": "", "tests": [{"input": "?", "contains": "x"}]}, 400, None),
    ({"identity": IDENTITY, "tests": [{"input": "?"}]}, 400, "tests[0]"),
    ({"identity": IDENTITY, "tests": [{"input": "?", "pattern": "(unclosed"}]}, 400, "tests[0]"),
    ({"identity": IDENTITY, "tests": [{"input": "?", "json_schema": {"type": 7}}]}, 400, "tests[0]"),
    ({"identity": IDENTITY, "sessions": ["never"], "tests": [{"input": "?", "contains": "x"}]}, 404, None),
    ({"identity": IDENTITY, "runs": ["never"], "tests": [{"input": "?", "contains": "x"}]}, 404, None),
    ({"identity": IDENTITY, "name": "../x", "tests": [{"input": "?", "contains": "x"}]}, 400, None),
    ({"identity": "word " * 5000, "tests": [{"input": "?", "contains": "x"}]}, 413, "identity"),
])
def test_every_bad_input_is_a_4xx_in_the_openai_shape_and_nothing_is_stored(
        served: tuple[TestClient, Runtime], body: dict[str, Any], status: int, param: str | None) -> None:
    client, _ = served
    reply = client.post(PATH, json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param
    assert client.get("/v1/xdb/documents").json()["data"] == []


def test_a_tenant_condenses_from_its_own_sessions_only_and_sees_only_its_own_identities(
        two_tenants: tuple[TestClient, Runtime]) -> None:
    client, runtime = two_tenants
    alice, bob = ({"Authorization": f"Bearer {key}"} for key in (ALICE, BOB))
    turn(client, "mine", "Which way?", **alice)
    settle(runtime)
    body = {"identity": IDENTITY, "sessions": ["mine"], "tests": [{"input": "?", "contains": "right"}]}
    other = client.post(PATH, json=body, headers=bob)
    assert other.status_code == 404 and other.json()["error"]["message"] == "session 'mine' not found"
    made = client.post(PATH, json=body, headers=alice)
    assert made.status_code == 200 and made.json()["accepted"], made.text
    doc_id = made.json()["identity"]["id"]
    assert "/" not in doc_id  # handed back as the tenant names it
    assert client.get(f"/v1/xdb/documents/{doc_id}", headers=alice).status_code == 200
    assert client.get(f"/v1/xdb/documents/{doc_id}", headers=bob).status_code == 404


# -- the verdict, with a stand-in model that answers by the persona it is given ------------------------
class PersonaModel:
    """Condenses to `condensed`; answers with the persona's own text, so a persona answers a test only
    with what it holds."""

    def __init__(self, condensed: str) -> None:
        self.condensed = condensed
        self.calls: list[list[dict[str, Any]]] = []

    async def __call__(self, messages: list[dict[str, Any]], max_tokens: int) -> str:
        self.calls.append(messages)
        if messages[1]["content"].startswith("PERSONA:"):
            return self.condensed
        return messages[0]["content"]


def condense(xdb: XDB, model: PersonaModel, identity: str, tests: list[IdentityTest],
             runs: tuple[str, ...] = ()) -> dict[str, Any]:
    condenser = IdentityCondenser(model, lambda text: len(text.split()), Limits(0.5, 1000, 64, 4096, 1 << 20))
    view = TenantXDB(xdb, LOCAL)
    return asyncio.run(condenser.condense(CondenseRequest(identity, tuple(tests), "p", runs=runs), view))


def test_a_condensation_that_loses_a_detail_a_test_needs_is_refused_with_both_answers(xdb: XDB) -> None:
    identity = "You are Ada of the Lattice Lab. Reply in JSON. Sign off as Ada. " * 2
    tests = [IdentityTest("Who?", contains="Ada"), IdentityTest("Where?", contains="Lattice Lab"),
             IdentityTest("Colour?", contains="purple")]
    xdb.write(log_interaction, "r1", journal_entry="signed off as Ada", tool_call_json='{"name": "sign"}')
    model = PersonaModel("You are Ada. Sign off as Ada.")
    result = condense(xdb, model, identity, tests, runs=("r1",))
    asked = model.calls[0][1]["content"]  # the condensing call shows the model the run's turns
    assert asked.startswith(f"PERSONA:\n{identity}") and "journal: signed off as Ada" in asked
    assert 'tool call: {"name": "sign"}' in asked and len(model.calls) == 1 + 2 * len(tests)
    assert result["accepted"] is False and result["identity"] is None
    assert result["failing"] == [1] and "fails 1 test" in result["reason"]
    lost = result["tests"][1]
    assert lost["full"]["answer"] == identity and lost["condensed"]["answer"] == "You are Ada. Sign off as Ada."
    assert lost["condensed"]["failures"] == ["does not contain 'Lattice Lab'"]
    kept = condense(xdb, PersonaModel("You are Ada of the Lattice Lab."), identity, tests)
    assert kept["accepted"] is True and kept["failing"] == [] and kept["identity"]["version"] == 1
    assert kept["check"]["version"] == 2  # each check is the next version of the name's check document


def test_an_identity_that_leaves_no_room_in_the_window_is_refused_before_any_model_call(xdb: XDB) -> None:
    model = PersonaModel("short")
    condenser = IdentityCondenser(model, lambda text: len(text.split()), Limits(0.5, 1000, 64, 200, 1 << 20))
    with pytest.raises(PayloadTooLarge, match="does not fit the model's 200-token window"):
        asyncio.run(condenser.condense(CondenseRequest("word " * 150, (IdentityTest("?", contains="x"),)),
                                       TenantXDB(xdb, LOCAL)))
    assert model.calls == [] and xdb.read(list_documents, owner=EVERY) == []


def test_each_expectation_of_a_test_is_checked_on_the_answer() -> None:
    test = IdentityTest("?", contains="Ada", pattern=r"\d+", json_schema={"type": "object", "required": ["n"]})
    assert test.failures('{"n": 1, "who": "Ada"}') == []
    assert test.failures('```json\n{"n": 2, "who": "Ada"}\n```') == []  # a Markdown code block is read through
    assert test.failures('{"who": "Bob"}') == ["does not contain 'Ada'", "does not match '\\\\d+'",
                                               "does not match the JSON schema: 'n' is a required property"]
    assert test.failures("Ada 3") == ["is not JSON"]
    with pytest.raises(ValueError, match="at least one of"):
        IdentityTest("?")


# -- `ahc identity condense` ---------------------------------------------------------------------------
def test_the_command_lines_request_and_summary_over_the_app(served: tuple[TestClient, Runtime]) -> None:
    client, _ = served
    body = {"identity": IDENTITY, "tests": [{"input": "Which way?", "contains": "right"},
                                            {"input": "Colour?", "contains": "purple"}]}
    result = condense_over_http(client, body)
    lines = summary(result).splitlines()
    assert lines[0].startswith("accepted (") and lines[1].startswith("test 0: full pass condensed pass")
    assert lines[2].startswith("test 1: full FAIL condensed FAIL")
    assert lines[3] == f"stored as document {result['identity']['id']} version 1"
    with pytest.raises(ValueError, match=r"\(404\): session 'gone' not found"):
        condense_over_http(client, {**body, "sessions": ["gone"]})


def test_the_command_line_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    persona, tests = tmp_path / "persona.txt", tmp_path / "tests.json"
    persona.write_text(IDENTITY)
    tests.write_text("[{\"input\": \"?\", ")
    bad_json = ahc("identity", "condense", str(persona), "--tests", str(tests))
    tests.write_text(json.dumps({"input": "?"}))
    not_a_list = ahc("identity", "condense", str(persona), "--tests", str(tests))
    tests.write_text(json.dumps([{"input": "?", "contains": "x"}]))
    missing = ahc("identity", "condense", str(tmp_path / "none.txt"), "--tests", str(tests))
    unreachable = ahc("identity", "condense", str(persona), "--tests", str(tests), "--base-url",
                      "http://127.0.0.1:9")
    for done, said in [(bad_json, "not JSON"), (not_a_list, "expected a JSON list"), (missing, "none.txt"),
                       (unreachable, "cannot reach http://127.0.0.1:9")]:
        assert done.returncode == 1 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done
