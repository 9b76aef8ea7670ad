"""A session that runs past the window, on the real engine: its mode holds, compaction reads the cache,
and the prefix cache keeps serving it.

The tiny model's 2,048-token window with a Codex of ~660 tokens (under 0.7 of the window: CAG), an
identity of ~260 and 30-word questions with 12-token replies: the State passes the window several times
in 60 turns.
"""

from __future__ import annotations

import pytest

from bench.servers import scrape_metrics
from server.cluster.server_process import ServerProcess

pytestmark = pytest.mark.engine

TURNS, REPLY_TOKENS, BLOCK = 60, 12, 32  # BLOCK: the engine's KV block size (configs/cpu-tiny.yaml)
VOCAB = ("particle collision ring cell symbol left right moves splits merges period class window rule table "
         "experiment prediction counterexample theorem").split()


def words(n: int, seed: int) -> str:
    return " ".join(VOCAB[(seed * 7 + i * (seed % 5 + 1)) % len(VOCAB)] for i in range(n))


CONTEXT = {"identity": "You are a careful physicist. " + words(120, 1), "mode": "auto",
           "codex": [{"id": f"doc{i}", "text": words(105, 10 + i)} for i in range(3)]}


def block_tokens(report: dict, *names: str) -> int:
    return sum(b["tokens"] for b in report["blocks"] if b["name"] in names)


def run_session(client, model: str, session_id: str) -> list[tuple[dict, object]]:
    turns = []
    for turn in range(TURNS):
        reply = client.chat.completions.create(
            model=model, max_tokens=REPLY_TOKENS, temperature=0,
            messages=[{"role": "user", "content": words(30, 100 + turn)}],
            extra_body={"context": {**CONTEXT, "session_id": session_id}})
        turns.append((reply.to_dict()["context"], reply.usage))
    return turns


def test_a_session_past_the_window_holds_its_mode_and_its_cache(client, model_name, server: ServerProcess) -> None:
    before = scrape_metrics(server.base_url, continued="true")
    turns = run_session(client, model_name, "long-auto")
    after = scrape_metrics(server.base_url, continued="true")
    reports = [report for report, _ in turns]
    per_turn = " ".join(f"{u.prompt_tokens_details.cached_tokens}/{u.prompt_tokens}:{r['first_changed_block']}"
                        + (":C" if "compaction" in r["governor"] else "") for r, u in turns)
    modes = "".join("C" if r["mode"] == "cag" else "R" for r in reports)
    assert modes == "C" * TURNS, modes  # never flaps: the Codex fits its threshold, compaction makes the room
    assert [r["mode_switches"] for r in reports] == [0] * TURNS
    compacted = [i for i, r in enumerate(reports) if "compaction" in r["governor"]]
    assert len(compacted) >= 3, compacted  # the State passed the window several times
    for i, (report, usage) in enumerate(turns[1:], start=1):
        cached = usage.prompt_tokens_details.cached_tokens
        if i in compacted:
            # The summary lives in the Karma block: the break is there (or in State, when the summary came
            # out as before); Identity and Codex stay cached.
            assert report["first_changed_block"] in ("karma", "state"), (i, report)
            assert cached >= block_tokens(report, "identity", "codex") - BLOCK, (i, cached, report)
        else:  # the previous prompt and reply, in whole blocks
            previous, reply = turns[i - 1][1].prompt_tokens, turns[i - 1][1].completion_tokens
            assert report["first_changed_block"] == "state", (i, report)
            assert cached >= (previous + reply - 1) // BLOCK * BLOCK - BLOCK, (i, cached, previous)
    hit_ratio = sum(u.prompt_tokens_details.cached_tokens for _, u in turns) / sum(u.prompt_tokens for _, u in turns)
    assert hit_ratio >= 0.85, (hit_ratio, per_turn)
    # Each summary call continued the session's cached prompt: it prefilled its instruction, not the State.
    prompt = after["ahc_compaction_prompt_tokens_total"] - before.get("ahc_compaction_prompt_tokens_total", 0)
    cached = after["ahc_compaction_cached_tokens_total"] - before.get("ahc_compaction_cached_tokens_total", 0)
    assert prompt > 0 and cached / prompt >= 0.8, (prompt, cached)


TOOL = {"type": "function", "function": {"name": "probe", "description": "Read one cell of the ring.",
                                         "parameters": {"type": "object", "properties": {"cell": {"type": "string"}},
                                                        "required": ["cell"]}}}


def test_a_summary_call_continues_a_prompt_with_tools_and_tool_calls(client, model_name, server) -> None:
    """The summary call is rendered as vLLM renders the session's requests (tools in the system turn, a
    call's arguments as JSON): the engine reads it from the prefix cache up to the instruction."""
    before = scrape_metrics(server.base_url, continued="true")
    compactions = 0
    for turn in range(16):
        call = {"id": f"call-{turn}", "type": "function",
                "function": {"name": "probe", "arguments": f'{{"cell": "c{turn}"}}'}}
        reply = client.chat.completions.create(
            model=model_name, max_tokens=REPLY_TOKENS, temperature=0, tools=[TOOL],
            messages=[{"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": f"call-{turn}", "content": words(25, 300 + turn)},
                      {"role": "user", "content": words(20, 200 + turn)}],
            extra_body={"context": {**CONTEXT, "session_id": "long-tools"}})
        compactions += "compaction" in reply.to_dict()["context"]["governor"]
    after = scrape_metrics(server.base_url, continued="true")
    prompt = after["ahc_compaction_prompt_tokens_total"] - before.get("ahc_compaction_prompt_tokens_total", 0)
    cached = after["ahc_compaction_cached_tokens_total"] - before.get("ahc_compaction_cached_tokens_total", 0)
    assert compactions >= 2 and prompt > 0 and cached / prompt >= 0.8, (compactions, prompt, cached)
