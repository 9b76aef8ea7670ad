"""The Vercel AI SDK (`ai` + `@ai-sdk/openai`, the npm packages pinned in tests/clients, installed by `make
clients`) against `ahc serve` with the real model, as its users write it: the provider's default
`openai(model)`, the Responses API with `store` on, history kept by appending each result's
`response.messages`. The SDK then sends the earlier replies back as `item_reference` items, which AHC reads
from its stored responses. tests/clients/ai_sdk_turns.mjs runs three generateText turns, a streamText turn
continuing them and a tool loop (a call forced on step 0, its result, a text answer), and prints what each
request sent and what came back (status, `X-Session-ID`, usage, the cache report).

The turns must be answered, the later ones by reference, in one session (inferred from the conversation:
the SDK names none), with each question recorded once; the tool ran with the arguments the model gave,
which are recorded as the session's tool_call."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from required import missing

from bench.servers import recall_until
from server.cluster.server_process import ServerProcess

pytestmark = pytest.mark.real_model

NODE_MODULES = Path(__file__).resolve().parents[1] / ".cache" / "clients" / "node_modules"
SCRIPT = Path(__file__).resolve().parent / "clients" / "ai_sdk_turns.mjs"
PACKAGES = ("ai", "@ai-sdk/openai", "zod")
QUESTIONS = ["What is the capital of France?", "And the capital of Italy?", "And the capital of Spain?",
             "Which of these three cities is the largest?"]  # three generateText turns, then streamText's
ASK_WEATHER = "What is the weather like in Paris today?"
TIMEOUT_S = 600


def require_sdk() -> str:
    """The node binary, once the SDK's packages are installed; a skip where they are not (a failure under CI)."""
    node = shutil.which("node")
    absent = [name for name in PACKAGES if not (NODE_MODULES / name / "package.json").exists()]
    if node is not None and not absent:
        return node
    message = ("node is not on PATH (install Node.js 20 and npm, then `make clients`)" if node is None else
               f"{', '.join(absent)} not installed under {NODE_MODULES} (`make clients` installs them with npm)")
    missing(message)


@pytest.fixture(scope="module")
def run(real_server: ServerProcess, real_model_name: str, real_no_whitespace_bias: dict[str, int],
        tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script's summary: `turns`, each with its `requests` (what the provider sent, the status and the
    `X-Session-ID` it got back, the usage and cache report). Kept beside the test's files too."""
    node = require_sdk()
    env = {**os.environ, "AHC_BASE_URL": real_server.base_url, "AHC_API_KEY": real_server.api_key or "none",
           "AHC_MODEL": real_model_name, "AHC_LOGIT_BIAS": json.dumps(real_no_whitespace_bias),
           "AHC_CLIENTS": str(NODE_MODULES)}
    done = subprocess.run([node, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{SCRIPT.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    summary: dict[str, Any] = json.loads(done.stdout)
    (tmp_path_factory.mktemp("ai-sdk") / "summary.json").write_text(done.stdout)
    return summary


def turn(run: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [t for t in run["turns"] if t["kind"] == kind]


def evidence(turns: list[dict[str, Any]]) -> str:
    """What each request sent (its body, the bias left out) and the session it was answered in."""
    return json.dumps([{"question": t["question"], "response_id": t["response_id"],
                        "requests": [{"session": r["session"], "status": r["status"],
                                      "body": {k: v for k, v in r["body"].items() if k != "logit_bias"},
                                      "context": r["answer"]["context"]} for r in t["requests"]]}
                       for t in turns], indent=1)


def stored_output_ids(server: ServerProcess, response_id: str) -> list[str]:
    """The ids of a stored response's output items, as `GET /v1/responses/{id}` gives them."""
    with server.http() as http:
        response = http.get(f"/v1/responses/{response_id}")
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["output"]]


def test_every_turn_is_answered(run: dict[str, Any]) -> None:
    kinds = [t["kind"] for t in run["turns"]]
    assert kinds == ["generateText"] * 3 + ["streamText", "toolLoop"], kinds
    for t in run["turns"]:
        assert t["requests"] and all(r["status"] == 200 for r in t["requests"]), evidence([t])
        assert t["text"].strip() and t["response_id"].startswith("resp_"), t
    [streamed] = turn(run, "streamText")
    assert streamed["deltas"] > 1 and [r["stream"] for r in streamed["requests"]] == [True]


def test_later_turns_send_the_earlier_replies_as_item_references(run: dict[str, Any],
                                                                 real_server: ServerProcess) -> None:
    """Turn k sends the k-1 replies before it by reference: the output items AHC stored for them."""
    chat = turn(run, "generateText") + turn(run, "streamText")
    replies = [stored_output_ids(real_server, t["response_id"]) for t in chat[:-1]]
    for k, t in enumerate(chat):
        [request] = t["requests"]
        assert request["item_references"] == [ids[-1] for ids in replies[:k]], evidence([t])
        assert request["input_types"].count("message:user") == k + 1
    assert all(len(ids) == 1 and ids[0].startswith("msg_") for ids in replies), replies


def test_the_turns_are_one_session_with_each_question_recorded_once(run: dict[str, Any],
                                                                    real_server: ServerProcess) -> None:
    chat = turn(run, "generateText") + turn(run, "streamText")
    sessions = [r["session"] for t in chat for r in t["requests"]]
    assert None not in sessions and len(set(sessions[:3])) == 1, \
        f"the three generateText turns are not one session: {sessions}\n{evidence(chat[:3])}"
    assert len(set(sessions)) == 1, f"the streamed turn left the session: {sessions}\n{evidence(chat)}"
    assert [r["answer"]["context"]["session_naming"] for t in chat for r in t["requests"]] == \
        ["new"] + ["inferred"] * 3

    rows = recall_until(real_server, len(QUESTIONS), timeout=5, session_id=sessions[0], event_types="input")
    assert [(r["role"], r["content"]) for r in rows] == [("user", q) for q in QUESTIONS], rows


def test_a_tool_loop_runs_the_tool_and_answers(run: dict[str, Any], real_server: ServerProcess) -> None:
    [loop] = turn(run, "toolLoop")
    call_step, text_step = loop["steps"]
    [call] = call_step["tool_calls"]
    assert call["name"] == "get_weather" and set(call["input"]) == {"city"} and isinstance(call["input"]["city"], str)
    assert loop["executed"] == [call["input"]]  # the SDK parsed the arguments and ran the tool with them
    assert call_step["tool_results"] == [{"id": call["id"], "name": "get_weather",
                                          "output": f"It is sunny and 21 C in {call['input']['city']}."}]
    assert call_step["finish_reason"] == "tool-calls"
    assert text_step["tool_calls"] == [] and text_step["text"].strip() and text_step["finish_reason"] == "stop"
    assert loop["text"] == text_step["text"]
    requests = loop["requests"]
    assert [r["tool_choice"] for r in requests] == ["required", "none"], evidence([loop])
    assert requests[1]["input_types"][-2:] == ["function_call", "function_call_output"]

    [session] = {r["session"] for r in requests}
    rows = recall_until(real_server, 3, timeout=5, session_id=session, event_types="input,tool_call,tool_result")
    assert [(r["event_type"], r["content"]) for r in rows if r["event_type"] != "tool_call"] == \
        [("input", ASK_WEATHER), ("tool_result", call_step["tool_results"][0]["output"])], rows
    [recorded] = [json.loads(r["content"]) for r in rows if r["event_type"] == "tool_call"]
    assert recorded["id"] == call["id"] and recorded["function"]["name"] == "get_weather"
    assert json.loads(recorded["function"]["arguments"]) == call["input"]


def test_the_sdk_is_pinned() -> None:
    """The versions tests/clients/package.json pins are the ones installed."""
    require_sdk()
    pinned = json.loads((SCRIPT.parent / "package.json").read_text())["dependencies"]
    for name in PACKAGES:
        installed = json.loads((NODE_MODULES / name / "package.json").read_text())["version"]
        assert installed == pinned[name], (name, installed, pinned[name])
