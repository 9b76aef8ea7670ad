"""The CTC governor as configured by default: caps that follow the window from above what compaction
keeps, filler detection on agent-style turns, oldest turns dropped in cache-friendly steps, and a
request's own `cag_threshold`."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from turn_requests import asking

from core.config import OrchestratorConfig, load_config
from core.errors import InvalidRequest
from orchestrator.assembler import AssemblyInput, assemble
from orchestrator.context_spec import KarmaEntry, parse_context
from orchestrator.ctc_governor import CHARS_PER_TOKEN, HEADROOM, CTCLimits, ctc_limits, govern, turn_groups
from orchestrator.formatters import FormatterRegistry
from orchestrator.message import Message, is_filler
from orchestrator.orchestrator import Orchestrator
from orchestrator.session import SessionStore
from orchestrator.token_counter import TokenCounter
from orchestrator.turn_request import TurnRequest

CALL = (("c1", "read_log", '{"ring": 1}'),)



def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture
def sparse() -> TokenCounter:
    """Text at 8 characters a token (long runs a tokenizer merges): the character cap bites before
    the token budget does, which is what the cap is a safety net for."""
    return TokenCounter(lambda text: [0] * (len(text) // 8))


def ctc(actions: list[str]) -> list[str]:
    return [a for a in actions if a.startswith("ctc_")]


# ---- caps derived from the window


@pytest.mark.parametrize("window, max_chars", [(512, 1844), (2048, 7373), (8192, 29492), (32768, 117965),
                                               (131072, 471860)])
def test_default_caps_follow_the_window(window: int, max_chars: int) -> None:
    assert ctc_limits(OrchestratorConfig(), window) == CTCLimits(max_chars=max_chars, max_turns=512)


@pytest.mark.parametrize("config", [{}, {"compaction_threshold": 0.8}, {"compaction_threshold": 1.0},
                                    {"compaction_threshold_tokens": 6000}, {"compaction_keep_turns": 300}])
@pytest.mark.parametrize("window", [2048, 32768])
def test_derived_caps_sit_above_what_compaction_keeps(config: dict[str, object], window: int) -> None:
    orchestrator = OrchestratorConfig(**config)  # type: ignore[arg-type]
    limits = ctc_limits(orchestrator, window)
    assert limits.max_chars is not None and limits.max_turns is not None
    compacted_at = orchestrator.compaction_tokens(window)
    assert limits.max_chars >= (compacted_at + HEADROOM * window) * CHARS_PER_TOKEN
    assert limits.max_chars >= 0.9 * window * CHARS_PER_TOKEN
    assert limits.max_turns >= 4 * orchestrator.compaction_keep_turns


def test_bundled_configs_get_derived_caps() -> None:
    for name, window in [("cpu-tiny", 2048), ("gpu", 32768)]:
        config = load_config(name)
        assert config.engine.max_model_len == window
        assert ctc_limits(config.orchestrator, window) == ctc_limits(OrchestratorConfig(), window)


@pytest.mark.parametrize("yaml, limits", [
    ("max_chars: 5000\n  max_turns: 40", CTCLimits(5000, 40)),
    ("max_chars: 0\n  max_turns: 0", CTCLimits(None, None)),
    ("max_chars: null\n  max_turns: 0", CTCLimits(7373, None)),
    ("max_turns: 1000", CTCLimits(7373, 1000)),
])
def test_yaml_sets_or_turns_off_a_cap(tmp_path: Path, yaml: str, limits: CTCLimits) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"engine:\n  max_model_len: 2048\norchestrator:\n  {yaml}\n")
    config = load_config(path)
    assert ctc_limits(config.orchestrator, config.engine.max_model_len) == limits


def test_a_negative_cap_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("orchestrator:\n  max_chars: -1\n")
    with pytest.raises(ValueError, match="orchestrator.max_chars"):
        load_config(path)
    monkeypatch.setenv("AHC_ORCHESTRATOR__MAX_TURNS", "0")
    assert ctc_limits(load_config().orchestrator, 2048).max_turns is None


# ---- filler


FILLER = [
    ("assistant", "OK."), ("user", "ok"), ("user", "Thanks!"), ("assistant", "Got it, thanks."),
    ("assistant", "Sounds good, let me check."), ("assistant", "Understood!"), ("user", "Thank you very much."),
    ("user", "👍"), ("assistant", "..."), ("user", ""), ("assistant", "  \n "), ("user", "ok?"),
    ("assistant", "You’re welcome!"), ("user", "Great, thanks! 🙏"), ("assistant", "Okay — one moment…"),
]
NOT_FILLER = [
    ("user", "OK, the rule for A is 3."), ("assistant", "OK, A moves right."), ("user", "yes"), ("user", "No."),
    ("assistant", "Done."), ("user", "Right."), ("user", "3"), ("user", "k2"), ("user", "ok `x`"),
    ("user", "thanks {}"), ("user", "What is the rule for B?"), ("user", "sure, but why does A stop?"),
    ("assistant", "Let me check the collision log."), ("user", "Check it."), ("assistant", "好的"),
    ("assistant", "see https://example.org"), ("user", "ok " * 30), ("assistant", "thanks_a_lot"),
    ("tool", "0"), ("tool", "false"), ("tool", '{"count": 0}'), ("tool", "ok, 3 rows"), ("tool", "no rows"),
    # A tool's answer stays with its call, however empty.
    ("tool", "{}"), ("tool", " "), ("tool", ""), ("tool", "[ ]"), ("tool", "null"), ("tool", "OK"),
]


@pytest.mark.parametrize("role, content", FILLER)
def test_acknowledgements_are_filler(role: str, content: str) -> None:
    assert is_filler(role, content)
    assert Message(role=role, content=content).is_filler


@pytest.mark.parametrize("role, content", NOT_FILLER)
def test_anything_that_may_carry_a_fact_is_not_filler(role: str, content: str) -> None:
    assert not is_filler(role, content)
    assert not Message(role=role, content=content).is_filler


@pytest.mark.parametrize("content", ["", "ok", "Let me check."])
def test_a_tool_call_is_never_filler(content: str) -> None:
    assert not Message(role="assistant", content=content, tool_calls=CALL).is_filler


# ---- the governor, by default


def history(groups: int, size: int = 280) -> list[dict[str, object]]:
    """An agent's turns: questions, answers, a tool call with an empty result, and acknowledgements."""
    messages: list[dict[str, object]] = []
    for i in range(groups):
        question = f"Measure ring {i}: " + "particles collide and split " * (size // 28)
        answer = f"Ring {i} has {i + 3} particles; " + "A moves right " * (size // 14)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        if i % 3 == 0:
            messages += [{"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "Got it."}]
        if i % 4 == 1:
            messages += [{"role": "assistant", "content": "",
                          "tool_calls": [{"id": f"c{i}", "type": "function",
                                          "function": {"name": "read_log", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": f"c{i}", "content": "{}"}]
    return messages


CONTEXT = {"identity": "You are a careful physicist.",
           "karma": [{"id": "v", "text": "B moves left.", "verbatim": True}, {"id": "n", "text": "Rings are small."}],
           "mode": "cag"}


def test_the_governor_acts_by_default_on_an_over_long_state(sparse: TokenCounter) -> None:
    orch = Orchestrator(OrchestratorConfig(), 2048, sparse, SessionStore())
    messages = [*history(14), {"role": "user", "content": "What moves next?"}]
    prepared = run(orch.prepare(TurnRequest(parse_context(CONTEXT), messages)))
    actions = ctc(prepared.actions)
    assert actions[0].startswith("ctc_prune_filler:") and actions[1].startswith("ctc_prune_turns:")
    assert len(actions) == 2  # the non-verbatim karma was not needed
    kept = prepared.messages[1:-1]
    assert not any(Message.from_message(m).is_filler for m in kept)
    assert kept[0]["content"].startswith("Measure ring") and "Ring 13 has" in str(kept[-3:])
    assert "Measure ring 0:" not in str(prepared.messages)
    system = prepared.messages[0]["content"]
    assert "careful physicist" in system and "B moves left." in system and "Rings are small." in system
    assert prepared.messages[-1] == {"role": "user", "content": "What moves next?"}
    assert sum(len(m.get("content") or "") for m in prepared.messages) <= ctc_limits(orch.config, 2048).max_chars


def test_the_governor_leaves_a_normal_session_alone(counter: TokenCounter) -> None:
    orch = Orchestrator(OrchestratorConfig(), 2048, counter, SessionStore())
    spec = parse_context({**CONTEXT, "session_id": "normal"})
    for turn in range(6):
        question = "Thanks! " if turn % 2 else f"What happens to ring {turn}? "
        prepared = run(orch.prepare(asking(spec, question * 5)))
        assert ctc(prepared.actions) == []
        if turn:
            assert prepared.report.first_changed_block == "state"
        orch.commit(prepared, {"role": "assistant", "content": f"Ring {turn} splits. " * 5})


@pytest.mark.parametrize("window", [2048, 32768])
def test_compaction_acts_before_the_derived_caps(window: int) -> None:
    """A long session in the auto mode at a BPE tokenizer's rate on prose: the State is compacted at
    its threshold, again and again, and the caps never act."""
    async def summarize(messages: list[dict[str, object]]) -> str:
        return "Rings split after collisions."

    prose = TokenCounter(lambda text: [0] * math.ceil(len(text) / CHARS_PER_TOKEN))
    orch = Orchestrator(OrchestratorConfig(), window, prose, SessionStore(), None, summarize)
    scale = window // 2048
    codex = [{"id": "rules", "text": "Particles collide and split. " * (window // 40)}]  # a fifth of the window
    spec = parse_context({**CONTEXT, "mode": "auto", "codex": codex, "session_id": "long"})
    seen: list[str] = []
    largest = 0
    for turn in range(40):
        prepared = run(orch.prepare(asking(spec, f"Measure ring {turn}. " * 8 * scale)))
        seen += prepared.actions
        largest = max(largest, prepared.prompt_tokens)
        orch.commit(prepared, {"role": "assistant", "content": f"Ring {turn} has {turn} particles. " * 8 * scale})
    assert seen.count("compaction") >= 3 and ctc(seen) == []
    assert largest > 0.6 * window


# ---- oldest turns go in steps


def state_of(groups: int) -> tuple[Message, ...]:
    return tuple(Message(role=role, content=f"{role} {i} " + "x" * 40)
                 for i in range(groups) for role in ("user", "assistant"))


def test_the_depth_cut_moves_in_steps(counter: TokenCounter) -> None:
    chars = lambda i: 0  # noqa: E731
    cuts = []
    for groups in range(17, 26):
        inp = AssemblyInput(identity="id", codex=(), karma=(), summary=None, state=state_of(groups), query="q")
        governed, actions = govern(inp, CTCLimits(max_turns=16), chars)
        kept = len(turn_groups(governed.state))
        assert kept <= 16 and actions == [f"ctc_depth:{groups - kept}"]
        cuts.append(groups - kept)
    assert cuts == [2, 2, 4, 4, 6, 6, 8, 8, 10]  # steps of 16 // 8 turns


def test_the_character_cut_stays_put_while_the_state_grows(counter: TokenCounter) -> None:
    formatter = FormatterRegistry().get("default")
    chars = lambda i: assemble(i, formatter, counter).chars  # noqa: E731
    limits = CTCLimits(max_chars=2000)
    firsts = []
    for groups in range(20, 40):
        inp = AssemblyInput(identity="id", codex=(), karma=(), summary=None, state=state_of(groups), query="q")
        governed, actions = govern(inp, limits, chars)
        assert chars(governed) <= 2000 and ctc(actions) == actions and actions[0].startswith("ctc_prune_turns:")
        firsts.append(governed.state[0].content)
    moves = sum(a != b for a, b in zip(firsts, firsts[1:]))
    # Each turn adds ~100 characters; the cut moves once per 250 (an eighth of the cap), not every turn.
    assert 0 < moves <= math.ceil(19 * 100 / 250)


def test_verbatim_karma_identity_and_query_survive_any_cap(counter: TokenCounter) -> None:
    formatter = FormatterRegistry().get("default")
    chars = lambda i: assemble(i, formatter, counter).chars  # noqa: E731
    karma = (KarmaEntry(id="v", text="never forget " * 10, verbatim=True), KarmaEntry(id="n", text="minor " * 30))
    inp = AssemblyInput(identity="the identity", codex=(), karma=karma, summary=None, state=state_of(10),
                        query="the query")
    governed, actions = govern(inp, CTCLimits(max_chars=50, max_turns=512), chars)
    assert [k.id for k in governed.karma] == ["v"] and actions[-1] == "ctc_over_cap"
    assert governed.identity == "the identity" and governed.query == "the query"
    assert len(turn_groups(governed.state)) == 1


# ---- a request's own cag_threshold


BIG_CODEX = [{"id": f"d{i}", "text": "particles collide and split " * 30} for i in range(3)]


def test_a_request_cag_threshold_decides_its_mode(counter: TokenCounter) -> None:
    orch = Orchestrator(OrchestratorConfig(), 2048, counter, SessionStore())
    question = [{"role": "user", "content": "What splits?"}]
    assert run(orch.prepare(TurnRequest(parse_context({"codex": BIG_CODEX}), question))).report.mode == "cag"
    low = run(orch.prepare(TurnRequest(parse_context({"codex": BIG_CODEX, "cag_threshold": 0.1}), question)))
    assert low.report.mode == "rag" and "particles collide" not in str(low.messages)
    strict = Orchestrator(OrchestratorConfig(cag_threshold=0.1), 2048, counter, SessionStore())
    assert run(strict.prepare(TurnRequest(parse_context({"codex": BIG_CODEX}), question))).report.mode == "rag"
    relaxed = run(strict.prepare(TurnRequest(parse_context({"codex": BIG_CODEX, "cag_threshold": 1}), question)))
    assert relaxed.report.mode == "cag"
    forced_rag = parse_context({"codex": BIG_CODEX, "cag_threshold": 1, "mode": "rag"})
    forced = run(strict.prepare(TurnRequest(forced_rag, question)))
    assert forced.report.mode == "rag"  # an explicit mode wins over any threshold


@pytest.mark.parametrize("value", [0, -0.5, 1.01, 2, True, "0.5", "half"])
def test_a_bad_cag_threshold_is_an_invalid_request(value: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_context({"cag_threshold": value})
    assert info.value.param == "context.cag_threshold" and info.value.status == 400
    assert str(info.value).startswith("context.cag_threshold:")


def test_a_bad_cag_threshold_is_a_400_over_http(config, vllm_config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from fake_app import serving

    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "What splits?"}]}
    with serving(config, vllm_config, tmp_path) as (client, _):
        bad = client.post("/v1/chat/completions", json={**body, "context": {"cag_threshold": 0}})
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "context.cag_threshold"
        good = client.post("/v1/chat/completions",
                           json={**body, "context": {"codex": BIG_CODEX, "cag_threshold": 0.1}})
        assert good.status_code == 200, good.text
        assert good.json()["context"]["mode"] == "rag"
