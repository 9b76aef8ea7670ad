"""The long-session bench's pure parts: the ordinary client's trimming, the ceiling's arithmetic, the
seeded script all three clients send, and the figures read from AHC's reports. No engine, no model."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import bench.session_clients as clients
from bench.agent_script import CHARS_PER_TOKEN, TOOL_NAMES, ScriptSpec, build_script
from bench.chat_stream import StreamedReply
from bench.history_trim import trim, turn_groups
from bench.long_session import (
    LOADS,
    ClientRun,
    LongSessionLoad,
    compactions,
    hit_ratio_ceiling,
    mode_switches,
    reusable_tokens,
)
from bench.session_clients import ContextClient, HistoryClient, MeasuredTurn, Sampling, as_rendered

SYSTEM = [{"role": "system", "content": "s" * 10}]


def call(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}


def result(call_id: str, size: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "r" * size}


def history_of(groups: list[list[int]]) -> list[dict[str, Any]]:
    """Each group: a user message, then a call and its result of each size."""
    messages: list[dict[str, Any]] = []
    ids = itertools.count()
    for sizes in groups:
        messages.append({"role": "user", "content": "u" * 5})
        for size in sizes:
            i = f"c{next(ids)}"
            messages += [call(i), result(i, size)]
    return messages


def count(messages: list[dict[str, Any]]) -> int:
    """A stand-in for the chat template: content characters, 2 tokens of markers a message."""
    return sum(len(m.get("content") or "") + 2 for m in messages)


def calls_answered(history: list[dict[str, Any]]) -> bool:
    """Every tool result follows the call it answers, in the kept history."""
    seen: set[str] = set()
    for message in history:
        seen.update(c["id"] for c in message.get("tool_calls") or [])
        if message["role"] == "tool" and message["tool_call_id"] not in seen:
            return False
    return True


def test_nothing_is_dropped_while_the_history_fits() -> None:
    history = history_of([[10, 20], [30]])
    trimmed = trim(SYSTEM, history, count, count([*SYSTEM, *history]))
    assert trimmed.history == history and trimmed.dropped_groups == 0 and trimmed.dropped_messages == 0


def test_the_fewest_oldest_groups_go_and_the_history_starts_on_a_user_message() -> None:
    groups = [[40, 40], [30], [50, 10], [20]]
    history = history_of(groups)
    whole = turn_groups(history)
    for budget in range(count([*SYSTEM, *whole[-1]]), count([*SYSTEM, *history]) + 1):
        trimmed = trim(SYSTEM, history, count, budget)
        kept = trimmed.history
        assert count([*SYSTEM, *kept]) <= budget
        assert kept == [m for g in whole[trimmed.dropped_groups:] for m in g]
        # One group fewer dropped would not have fit: as few as make it fit.
        if trimmed.dropped_groups:
            fewer = [m for g in whole[trimmed.dropped_groups - 1:] for m in g]
            assert count([*SYSTEM, *fewer]) > budget
        assert kept[0]["role"] == "user" and calls_answered(kept)


def test_a_newest_group_too_large_alone_loses_its_oldest_exchanges_never_half_of_one() -> None:
    history = history_of([[10], [60, 70, 80]])
    newest = turn_groups(history)[-1]
    for budget in range(count([*SYSTEM, newest[0], *newest[-2:]]), count([*SYSTEM, *newest])):
        kept = trim(SYSTEM, history, count, budget).history
        assert kept[0] == newest[0] and kept[-1] == newest[-1]
        assert calls_answered(kept) and count([*SYSTEM, *kept]) <= budget


def test_last_the_newest_exchange_goes_without_its_user_message() -> None:
    history = [*history_of([[10], [60]]), {"role": "user", "content": "u" * 200}, call("n"), result("n", 50)]
    newest = history[-2:]
    trimmed = trim(SYSTEM, history, count, count([*SYSTEM, *newest]))
    assert trimmed.history == newest and trimmed.dropped_groups == 2


def test_a_prompt_that_cannot_fit_is_an_error() -> None:
    history = history_of([[10], [500]])
    with pytest.raises(ValueError, match="newest message"):
        trim(SYSTEM, history, count, 100)
    with pytest.raises(ValueError, match="newest message"):
        trim(SYSTEM, [{"role": "user", "content": "u" * 200}], count, 100)


def test_reusable_tokens_follow_the_previous_turn_in_whole_blocks() -> None:
    state = {"first_changed_block": "state", "blocks": []}
    # The previous prompt and reply less the reply's last token, in 32-token blocks.
    assert reusable_tokens(1000, 900, 40, state, 32) == (900 + 40 - 1) // 32 * 32 == 928
    assert reusable_tokens(500, 900, 40, state, 32) == 500  # a prompt that shrank: all of it, at most
    assert reusable_tokens(1000, 900, 40, {}, 32) == 928


def test_a_break_before_the_state_keeps_only_the_prompt_before_the_changed_block() -> None:
    blocks = [{"name": "identity", "tokens": 100}, {"name": "codex", "tokens": 300},
              {"name": "karma", "tokens": 80}, {"name": "state", "tokens": 400}, {"name": "query", "tokens": 20}]
    karma = {"first_changed_block": "karma", "blocks": blocks}
    # 1000 prompt tokens: 100 of them the template's (tools, markers), before the Identity.
    assert reusable_tokens(1000, 2000, 40, karma, 32) == (1000 - 500) // 32 * 32 == 480
    codex = {"first_changed_block": "codex", "blocks": blocks}
    assert reusable_tokens(1000, 2000, 40, codex, 32) == (1000 - 800) // 32 * 32 == 192
    # Never more than the previous request left in the cache.
    assert reusable_tokens(1000, 300, 10, karma, 32) == 288


def test_a_rewritten_state_breaks_the_prefix_at_its_start_whatever_block_is_named() -> None:
    blocks = [{"name": "identity", "tokens": 100}, {"name": "karma", "tokens": 80},
              {"name": "state", "tokens": 400}, {"name": "query", "tokens": 20}]
    # A compaction whose summary came out the same leaves Karma as it was: the State changed first.
    compacted = {"first_changed_block": "state", "blocks": blocks, "governor": ["compaction"]}
    assert reusable_tokens(1000, 2000, 40, compacted, 32) == (1000 - 420) // 32 * 32 == 576
    dropped = {"first_changed_block": "state", "blocks": blocks, "governor": ["ctc_depth:8"]}
    assert reusable_tokens(1000, 2000, 40, dropped, 32) == 576
    grown = {"first_changed_block": "state", "blocks": blocks, "governor": ["session_wait"]}
    assert reusable_tokens(1000, 2000, 40, grown, 32) == 1000


def reply(prompt: int, completion: int = 10, report: dict[str, Any] | None = None) -> StreamedReply:
    return StreamedReply(0.1, prompt, 0, completion, {"role": "assistant", "content": ""}, report)


def test_the_ceiling_is_reusable_over_prompt_tokens_of_the_whole_session() -> None:
    turns = [MeasuredTurn(reply(640, 10, {"first_changed_block": None})),
             MeasuredTurn(reply(960, 10, {"first_changed_block": "state"})),
             MeasuredTurn(reply(700, 10, {"first_changed_block": "karma",
                                  "blocks": [{"name": "identity", "tokens": 100}, {"name": "karma", "tokens": 500}]}))]
    expected = ((640 + 10 - 1) // 32 * 32 + (700 - 500) // 32 * 32) / (640 + 960 + 700)
    assert hit_ratio_ceiling(turns, 32) == pytest.approx(expected)
    assert hit_ratio_ceiling([], 32) == 0.0


def test_compactions_and_mode_switches_are_read_from_the_reports() -> None:
    reports = [{"mode": "cag", "governor": []}, {"mode": "cag", "governor": ["compaction"]},
               {"mode": "rag", "governor": ["compaction", "ctc_depth:4"]}, {"mode": "cag", "governor": None}]
    assert compactions(reports) == 2
    assert mode_switches(reports) == 2
    assert mode_switches([*reports, {"mode": "cag", "mode_switches": 5}]) == 5


def test_the_script_is_seeded_and_a_shorter_one_is_its_prefix() -> None:
    spec = ScriptSpec(turns=40, seed=3, result_min_tokens=100, result_max_tokens=1500, user_every=4)
    script = build_script(spec)
    assert script == build_script(spec)
    assert build_script(ScriptSpec(turns=12, seed=3)).turns == script.turns[:12]
    assert build_script(ScriptSpec(turns=40, seed=4)).turns != script.turns
    assert script.turns[0].tool_result is None and all(t.tool_result for t in script.turns[1:])
    assert [i for i, t in enumerate(script.turns) if t.instruction] == list(range(0, 40, 4))
    assert {t.tool for t in script.turns} <= set(TOOL_NAMES)
    sizes = [len(t.tool_result or "") for t in script.turns[1:]]
    assert min(sizes) >= 100 * CHARS_PER_TOKEN / 2 and max(sizes) <= 1500 * CHARS_PER_TOKEN


class FakeServer:
    """Answers every turn with a tool call and keeps the bodies it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, http: Any, body: dict[str, Any]) -> StreamedReply:
        self.bodies.append(body)
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call-{len(self.bodies)}", "type": "function",
             "function": {"name": body["tool_choice"]["function"]["name"], "arguments": "{}"}}]}
        return StreamedReply(0.01, 100, 0, 8, message, None)


def new_content(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages if m["role"] in ("user", "tool")]


def test_the_three_clients_send_the_same_tool_results_and_instructions(monkeypatch) -> None:
    script = build_script(ScriptSpec(turns=9, seed=1))
    sent: dict[str, FakeServer] = {}
    for name in ("ahc", "client", "naive"):
        sent[name] = FakeServer()
        monkeypatch.setattr(clients, "stream_chat", sent[name])
        sampling = Sampling("m", 40, {"7": -100})
        client: clients.Client = (ContextClient(None, sampling, script) if name == "ahc" else
                                  HistoryClient(None, sampling, script, 10**9, count, naive=name == "naive"))
        clients.run_turns(client, len(script.turns))
    ahc = [m for body in sent["ahc"].bodies for m in body["messages"]]
    for name in ("client", "naive"):
        last = sent[name].bodies[-1]["messages"]
        assert new_content(last) == new_content(ahc)  # nothing trimmed: the whole history, in order
        for key in ("tool_choice", "tools", "logit_bias", "max_tokens"):
            assert [b[key] for b in sent[name].bodies] == [b[key] for b in sent["ahc"].bodies]
    assert all(body["context"]["session_id"] for body in sent["ahc"].bodies)
    system = {name: [b["messages"][0]["content"] for b in sent[name].bodies] for name in ("client", "naive")}
    assert len(set(system["client"])) == 1 and system["client"][0] == script.system_prompt()
    assert all(s.startswith("Current time: ") and s.endswith(script.system_prompt()) for s in system["naive"])
    # A tool result answers the call the server made the turn before.
    assert sent["ahc"].bodies[1]["messages"][0]["tool_call_id"] == "call-1"


def test_tool_call_arguments_are_counted_as_the_server_renders_them() -> None:
    messages = [call("a"), {**call("b"), "tool_calls": [
        {"id": "b", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x'}}]}]
    messages[0]["tool_calls"][0]["function"]["arguments"] = '{"path": "flowctl/parser.py"}'
    rendered = as_rendered(messages)
    assert rendered[0]["tool_calls"][0]["function"]["arguments"] == {"path": "flowctl/parser.py"}
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {}
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"path": "flowctl/parser.py"}'


def test_the_load_is_overridden_by_its_environment_variable() -> None:
    load = LOADS.parse("turns=12,max_model_len=2048,model=tiny")
    assert (load.turns, load.max_model_len, load.model) == (12, 2048, "tiny")
    # A small window caps the tool results to half the room the system prompt and the reply leave.
    assert load.script_spec(1500).result_max_tokens == (2048 - 64 - 1500) // 2
    assert LongSessionLoad().script_spec(1500).result_max_tokens == 1500
    with pytest.raises(ValueError, match=LOADS.env):
        LOADS.parse("sessions=3")


def test_a_run_adds_up_its_turns() -> None:
    run = ClientRun([MeasuredTurn(reply(100)), MeasuredTurn(StreamedReply(0.2, 300, 200, 10, {}, None))], 150, 1.0)
    assert (run.prompt_tokens, run.cached_tokens) == (400, 200)
