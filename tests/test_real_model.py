"""The real-model tier: SmolLM2-135M-Instruct served by `ahc serve` with configs/cpu-small.yaml (its lens
on), over real HTTP through the official client. What a user judges the product by: a right answer, tool
calls that follow their schemas, a long session that keeps its cache and compacts in the model's own
words, a Codex the model condenses, the discovery agent's LLM policy, and the browser showing it all."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest

from bench.servers import recall_until
from server.cluster.server_process import ServerProcess

pytestmark = pytest.mark.real_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def test_a_factual_question_gets_the_right_answer(real_client: openai.OpenAI, real_model_name: str) -> None:
    reply = real_client.chat.completions.create(
        model=real_model_name, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24, temperature=0)
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_tool_calls_follow_the_schema_whole_and_streamed(
        real_client: openai.OpenAI, real_model_name: str, choice: Any) -> None:
    reply = real_client.chat.completions.create(model=real_model_name, messages=ASK_WEATHER, tools=[WEATHER],
                                                tool_choice=choice, max_tokens=48, temperature=0)
    [call] = reply.choices[0].message.tool_calls or []
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and isinstance(args, dict) and isinstance(args.get("city"), str)

    stream = real_client.chat.completions.create(model=real_model_name, messages=ASK_WEATHER, tools=[WEATHER],
                                                 tool_choice=choice, max_tokens=48, temperature=0, stream=True)
    names, streamed = set(), ""
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            names.add(delta.function.name) if delta.function and delta.function.name else None
            streamed += (delta.function.arguments or "") if delta.function else ""
    assert names == {"get_weather"} and json.loads(streamed) == args  # the same call, chunk by chunk


def test_auto_tool_choice_answers_in_text_or_a_call_never_an_error(
        real_client: openai.OpenAI, real_model_name: str) -> None:
    for question in ["What is the weather like in Paris today?", "Say hello."]:
        reply = real_client.chat.completions.create(
            model=real_model_name, messages=[{"role": "user", "content": question}], tools=[WEATHER],
            tool_choice="auto", max_tokens=32, temperature=0)
        message = reply.choices[0].message
        assert message.content or message.tool_calls
        for call in message.tool_calls or []:
            assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)


IDENTITY = "You are a helpful travel assistant. Answer in one short sentence."
CITIES = ["Paris", "Rome", "Madrid", "Berlin", "Vienna", "Lisbon", "Prague", "Warsaw", "Dublin", "Athens",
          "Oslo", "Helsinki", "Budapest", "Brussels", "Amsterdam", "Stockholm", "Copenhagen", "Bern", "Sofia",
          "Riga"]
# ~500 tokens a turn: the State passes half the 8,192-token window (the compaction threshold) within 10 turns
# (fewer, longer turns: a decoded token costs more than a prefilled one); the session stops two turns after
# its first compaction (the cache grows again from there).
NOTE = ("I am planning a long trip through Europe and keep notes as I go: trains between the capitals, small "
        "hotels near the old town, museums that open early, markets on Saturday mornings, and walks along "
        "the river in the evening. ") * 10


def test_a_long_session_keeps_its_cache_and_compacts_in_the_models_own_words(
        real_server: ServerProcess, real_client: openai.OpenAI, real_model_name: str) -> None:
    session, cached, compacted_at = "real-long-session", [], []
    for turn, city in enumerate(CITIES):
        reply = real_client.chat.completions.create(
            model=real_model_name, max_tokens=16, temperature=0,
            messages=[{"role": "user", "content": f"{NOTE}Turn {turn}: what is {city} known for?"}],
            extra_body={"context": {"session_id": session, "identity": IDENTITY, "mode": "cag"}})
        report = reply.to_dict()["context"]
        assert report["mode"] == "cag"
        if "compaction" in report["governor"]:
            compacted_at.append(turn)
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        if compacted_at and turn == compacted_at[0] + 2:
            break
    assert compacted_at, "20 turns of ~500 tokens passed the compaction threshold without a compaction"
    # Between compactions every turn reads the whole previous prompt from the cache, so it grows.
    for turn in range(2, len(cached)):
        if turn not in compacted_at:
            assert cached[turn] > cached[turn - 1], (turn, cached)
    with real_server.http() as http:
        turns = http.get(f"/v1/xdb/sessions/{session}/turns").json()["turns"]
    records = [c for t in turns for c in t.get("compactions", [])]
    assert records and all(r["tokens_after"] < r["tokens_before"] for r in records)
    summary = records[0]["summary"]
    # The model's own words: prose of its making, not the turns copied back.
    assert len(summary.split()) >= 5 and NOTE.strip()[:60] not in summary


CODEX_IDENTITY = "You are a librarian who answers from the rules below."
# ~620 tokens: over the 0.06 × 8,192 a request sets as its CAG threshold, so RAG until the model has
# written a condensed rendition (at most 0.3 of it, ~185 tokens) that fits.
RULES = " ".join(f"Rule {i}: books of shelf {i % 7} are lent for {i % 3 + 1} weeks and cost {i % 5} euros "
                 "when returned late." for i in range(25))


def test_a_codex_too_large_for_cag_is_condensed_by_the_model_and_used(
        real_server: ServerProcess, real_client: openai.OpenAI, real_model_name: str) -> None:
    def ask(question: str) -> dict[str, Any]:
        reply = real_client.chat.completions.create(
            model=real_model_name, max_tokens=8, temperature=0, messages=[{"role": "user", "content": question}],
            extra_body={"context": {"session_id": "real-condensed", "identity": CODEX_IDENTITY,
                                    "codex": [{"document": "library-rules"}], "cag_threshold": 0.06}})
        return reply.to_dict()["context"]

    with real_server.http(timeout=600) as http:
        doc = http.post("/v1/xdb/documents", json={"name": "library-rules", "content": RULES}).json()
        first = ask("How long are books of shelf 3 lent?")
        assert first["mode"] == "rag"  # no rendition yet: excerpts, and one is made in the background
        made = http.post(f"/v1/xdb/documents/{doc['id']}/condensed")
        assert made.status_code == 200, made.text
        rendition = made.json()
    content = rendition["content"]
    assert 20 < len(content) < len(RULES) and content not in RULES  # written by the model, not cut from the source
    assert len(set(content.split())) > 5
    deadline = time.monotonic() + 30
    while (second := ask("And shelf 4?"))["codex"][0]["rendition"] != "condensed":
        assert time.monotonic() < deadline, second
        time.sleep(0.5)
    assert second["mode"] == "cag" and second["codex"][0]["condensed_document"].startswith(rendition["id"])


def test_the_discovery_agents_llm_policy_runs_its_turns_with_every_call_parsed(
        real_server: ServerProcess, real_no_whitespace_bias: dict[str, int], tmp_path) -> None:  # type: ignore[no-untyped-def]
    from agent.loop import DiscoveryRun, RunConfig, run_id_for
    from agent.policies.llm import LLMConfig, LLMPolicy
    from agent.run_store import store_for
    from universe import load_rule

    turns = 5  # the first reads no cache; every later one must, and parse
    policy = LLMPolicy(LLMConfig(base_url=f"{real_server.base_url}/v1", api_key=real_server.api_key,
                                 tool_choice="required", max_tokens=320, seed=3,
                                 logit_bias=real_no_whitespace_bias))
    policy.connect()
    run_id = run_id_for("kinetic", "llm", 0)
    store = store_for(real_server.base_url, real_server.api_key, tmp_path, run_id)
    try:
        run = DiscoveryRun(RunConfig(tmp_path, max_turns=turns), load_rule("kinetic"), policy, store)
        summary = run.run()
        assert summary["turns"] == turns
        rows = [r for r in store.interactions(run.run_id) if run.ckpt.valid_row(r)]
        calls = [json.loads(r["tool_call_json"]) for r in rows]
        assert sorted({c["turn"] for c in calls}) == list(range(1, turns + 1))
        tool_names = {t["function"]["name"] for t in policy.tools()}
        for call in calls:  # every turn's call parsed: a known tool, arguments a JSON object
            assert call["name"] in tool_names and isinstance(json.loads(call["arguments"]), dict), call
        assert all(m.cached_tokens > 0 for m in run.metrics[1:])
        session = run.session_id
    finally:
        store.close()
    # The journal went to the server's XDB (its agent routes), and the session's tokens are there too.
    assert store.kind == "http"
    assert recall_until(real_server, 1, timeout=5, session_id=session, event_types="output")


COLOURS = {"red", "blue", "green", "yellow", "orange", "purple", "pink", "white", "black", "brown", "grey",
           "gray", "violet", "indigo"}


def test_the_lens_marks_tokens_a_person_would_agree_with(
        real_server: ServerProcess, real_client: openai.OpenAI, real_model_name: str) -> None:
    session = "real-lens"
    for question in ["Name five colours of the rainbow.", "Count from one to ten using digits."]:
        real_client.chat.completions.create(
            model=real_model_name, max_tokens=40, temperature=0, messages=[{"role": "user", "content": question}],
            extra_headers={"X-Session-ID": session})
    rows = recall_until(real_server, 60, timeout=5, session_id=session, event_types="output")
    assert rows and all(len(r["concept_activations"]) <= 10 for r in rows)

    # A token's activations are those of the hidden state that produced it: the state that has just
    # read the token before it. So the text a person judges is that earlier token's.
    by_tick = {r["tick"]: r["content"] for r in rows}

    def strongest(concept: str) -> list[str]:
        """The tokens read just before this session's 5 rows that activate `concept` most."""
        scored = sorted(((r["concept_activations"][concept], r["tick"]) for r in rows
                         if concept in r["concept_activations"] and r["tick"] - 1 in by_tick), reverse=True)
        return [by_tick[tick - 1].strip().lower() for _, tick in scored[:5]]

    colours = strongest("colours")
    assert sum(any(c in t for c in COLOURS) for t in colours) >= 3, colours
    numbers = strongest("numbers")
    words = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
    assert sum(any(ch.isdigit() for ch in t) or t in words for t in numbers) >= 3, numbers


def test_the_experience_browser_shows_a_recorded_session(
        real_server: ServerProcess, real_client: openai.OpenAI, real_model_name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from browser import launched, sign_in, wait_for_turns

    session = "real-browser"
    replies = [real_client.chat.completions.create(
        model=real_model_name, max_tokens=16, temperature=0, messages=[{"role": "user", "content": question}],
        extra_body={"context": {"session_id": session, "identity": IDENTITY}}).choices[0].message.content or ""
        for question in ["What is Rome known for?", "And Paris?"]]
    wait_for_turns(real_server, session, 2)
    with launched() as browser:
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        sign_in(page, real_server)
        page.click(f'#sessions tr[data-session="{session}"] a')
        page.locator(".turns section.turn").nth(1).wait_for()
        assert page.locator(".turns section.turn").count() == 2
        page.locator("#turn-1 .tok[data-concept]").first.wait_for()  # tokens coloured by the lens
        page.locator("#turn-2 .tok").first.wait_for()
        shown = page.locator(".turns").inner_text()
        page.screenshot(path=str(tmp_path / "real-session.png"), full_page=True)
    for reply in replies:  # the model's own words, as it said them
        assert " ".join(reply.split()[:3]) in " ".join(shown.split()), (reply, shown[:500])
