"""Identity condensation on the real model (SmolLM2-135M-Instruct under `ahc serve`, over real HTTP): the
model condenses a persona from a session it lived, and the check's verdict is the one its answers give.
The 135M model is not trusted to condense well: the test asserts the mechanism, and that a condensation
losing a detail a test needs is refused."""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest

from server.cluster.server_process import ServerProcess

pytestmark = [pytest.mark.engine, pytest.mark.real_model, pytest.mark.slow]

PATH = "/v1/context/identity/condense"
PERSONA = ("You are Quill, the archive assistant of the Harbor Museum. The secret code word is ZEBRA. "
           "When asked for the code word, answer with the code word only. Answer every question in one short "
           "sentence. Be polite, be friendly, be patient, and always thank the visitor for their question. "
           "You know the museum's opening hours (nine to five) and its address (12 Quay Street).")
ANSWER_TOKENS = 16  # the tests want a word or a street's name: a short answer holds it
CODE_TEST = {"input": "What is the code word? Answer with the code word only.", "contains": "ZEBRA"}


def consistent(result: dict[str, Any]) -> None:
    """The verdict is what the per-test answers give, and each answer's pass is what its test asks."""
    for test in result["tests"]:
        for side in ("full", "condensed"):
            answer = test[side]
            wanted = test["expect"]
            holds = ("contains" not in wanted or wanted["contains"] in answer["answer"]) and \
                ("pattern" not in wanted or re.search(wanted["pattern"], answer["answer"]) is not None)
            assert answer["passed"] == holds == (answer["failures"] == []), test
    lost = [i for i, t in enumerate(result["tests"]) if t["full"]["passed"] and not t["condensed"]["passed"]]
    assert result["failing"] == lost
    shorter = 0 < result["tokens_after"] < result["tokens_before"]
    assert result["accepted"] == (shorter and not lost and bool(result["condensed"]))
    assert (result["identity"] is not None) == result["accepted"]


def test_the_model_condenses_a_persona_from_a_session_and_a_lossy_one_is_refused(
        real_server: ServerProcess, real_client: openai.OpenAI, real_model_name: str) -> None:
    real_client.chat.completions.create(
        model=real_model_name, max_tokens=16, temperature=0,
        messages=[{"role": "user", "content": "When does the museum open?"}],
        extra_body={"context": {"session_id": "real-quill", "identity": PERSONA}})
    tests = [CODE_TEST, {"input": "Where is the museum?", "pattern": "(?i)quay"}]
    with real_server.http(timeout=600) as http:
        made = http.post(PATH, json={"identity": PERSONA, "name": "quill", "sessions": ["real-quill"],
                                     "tests": tests, "answer_max_tokens": ANSWER_TOKENS})
        assert made.status_code == 200, made.text
        result = made.json()
        assert result["made_by"] == "model" and result["condensed"]
        consistent(result)
        stored = http.get(f"/v1/xdb/documents/{result['check']['id']}").json()
        assert json.loads(stored["content"]) == {k: v for k, v in result.items() if k not in ("check", "identity")}
        if result["accepted"]:
            persona = http.get(f"/v1/xdb/documents/{result['identity']['id']}").json()
            assert persona["content"] == result["condensed"] and persona["doc_type"] == "identity"

        # Deliberately lossy: the candidate has no code word, so it cannot answer the test the full one passes.
        lossy = http.post(PATH, json={"identity": PERSONA, "name": "quill-lossy", "tests": [CODE_TEST],
                                      "candidate": "You are Quill, the Harbor Museum's archive assistant.",
                                      "answer_max_tokens": ANSWER_TOKENS})
        assert lossy.status_code == 200, lossy.text
        refused = lossy.json()
    consistent(refused)
    [test] = refused["tests"]
    assert test["full"]["passed"], test  # the full persona gives the code word
    assert refused["accepted"] is False and refused["failing"] == [0] and refused["identity"] is None
    assert "ZEBRA" not in test["condensed"]["answer"] and test["condensed"]["failures"]
