"""The review step on the real model (SmolLM2-135M-Instruct, `ahc serve` over real HTTP): the served model,
asked as a hidden call whether a claim is supported by the session it cites, gives a verdict held to the
review's pattern; it is stored with its rationale, and an accepted claim is in the next turn's prompt."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from bench.servers import recall_until
from server.cluster.server_process import ServerProcess

pytestmark = [pytest.mark.engine, pytest.mark.real_model, pytest.mark.slow]

SESSION = "karma-real"
FACT = "The ring in this session has twelve cells."


def turn(client: openai.OpenAI, model: str, question: str) -> dict[str, Any]:
    reply = client.chat.completions.create(
        model=model, max_tokens=8, temperature=0, messages=[{"role": "user", "content": question}],
        extra_body={"context": {"session_id": SESSION, "identity": "You are a terse lab assistant."}})
    return reply.to_dict()


def query_tokens(reply: dict[str, Any]) -> int:
    return next(int(b["tokens"]) for b in reply["context"]["blocks"] if b["name"] == "query")


def test_the_reviewer_model_decides_a_claim_and_an_accepted_one_reaches_the_next_prompt(
        real_server: ServerProcess, real_client: openai.OpenAI, real_model_name: str) -> None:
    turn(real_client, real_model_name, "Note for the log: the ring has twelve cells. Say OK.")
    assert recall_until(real_server, 1, timeout=10, session_id=SESSION)
    plain = turn(real_client, real_model_name, "Next?")
    with real_server.http(timeout=600) as http:
        made = http.post("/v1/context/karma/proposals", json={
            "text": FACT, "session_id": SESSION, "source_session_id": SESSION, "tick_range": [0, 10_000]})
        assert made.status_code == 200, made.text
        decided = http.post(f"/v1/context/karma/proposals/{made.json()['id']}/review", json={"reviewer": "model"})
        assert decided.status_code == 200, decided.text
        proposal = decided.json()
        [review] = proposal["reviews"]
        assert review["reviewer_kind"] == "model" and review["reviewer"] == real_model_name
        assert review["action"] in ("accepted", "rejected") and proposal["status"] == review["action"]
        assert review["rationale"] and "no verdict" not in review["rationale"]  # the pattern held the answer
        held = http.get("/v1/context/karma", params={"session_id": SESSION}).json()["data"]
    after = turn(real_client, real_model_name, "Next?")
    fact_tokens = len(FACT.split())  # a lower bound on its tokens
    if review["action"] == "accepted":
        assert [p["text"] for p in held] == [FACT]
        # Staged: the same question's Query block now carries the entry, the Karma block is unchanged.
        assert query_tokens(after) >= query_tokens(plain) + fact_tokens
        assert after["context"]["first_changed_block"] == "state"
    else:
        assert held == [] and query_tokens(after) == query_tokens(plain)
