"""The orchestrator as a library: deterministic blocks, prefix-stable prompts, governors, compaction."""

from __future__ import annotations

import asyncio
import json

import pytest
from turn_requests import asking

from core.config import OrchestratorConfig
from core.errors import InvalidRequest
from orchestrator.assembler import AssemblyInput, RenderCache, assemble
from orchestrator.context_spec import CodexDoc, KarmaEntry, parse_context
from orchestrator.ctc_governor import CTCLimits, govern
from orchestrator.formatters import FormatterRegistry
from orchestrator.message import Message
from orchestrator.orchestrator import Orchestrator
from orchestrator.session import Session, SessionStore
from orchestrator.token_counter import TokenCounter
from orchestrator.turn_request import TurnRequest
from server.admission.vram_governor import GovernorRejected, KVStats, VramGovernor


def make(counter: TokenCounter, summarize=None, store: SessionStore | None = None, **config) -> Orchestrator:
    return Orchestrator(OrchestratorConfig(**config), 2048, counter, store or SessionStore(), None, summarize)


CONTEXT = {"identity": "You are a careful physicist.", "codex": [{"id": "rules", "text": "A moves right."}],
           "karma": [{"id": "k1", "text": "B moves left.", "verbatim": True}], "mode": "cag"}


def run(coro):
    return asyncio.run(coro)


def test_same_inputs_give_byte_identical_prompts_and_token_ids(counter, tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "what moves?"}]
    a = run(make(counter).prepare(TurnRequest(parse_context(CONTEXT), messages)))
    reordered = parse_context(dict(reversed(list(CONTEXT.items()))))
    b = run(make(counter).prepare(TurnRequest(reordered, [dict(m) for m in messages])))
    assert a.messages == b.messages
    assert a.report.prefix_sha256 == b.report.prefix_sha256
    ids_a = tokenizer.apply_chat_template(a.messages, add_generation_prompt=True, tokenize=True)
    ids_b = tokenizer.apply_chat_template(b.messages, add_generation_prompt=True, tokenize=True)
    assert ids_a == ids_b
    assert [blk.name for blk in a.report.blocks] == ["identity", "codex", "karma", "state", "query"]
    assert a.messages[0]["content"].index("careful physicist") < a.messages[0]["content"].index("A moves right") \
        < a.messages[0]["content"].index("B moves left")


def test_a_growing_session_keeps_the_rendered_prompt_a_prefix(counter, tokenizer) -> None:
    orch = make(counter)
    spec = parse_context({**CONTEXT, "session_id": "s1"})
    rendered = []
    for turn in range(4):
        prepared = run(orch.prepare(TurnRequest(spec, [{"role": "user", "content": f"question {turn}"}])))
        rendered.append(tokenizer.apply_chat_template(prepared.messages, add_generation_prompt=True, tokenize=False))
        orch.commit(prepared, {"role": "assistant", "content": f"answer {turn}"})
        if turn:
            assert prepared.report.first_changed_block == "state"
    for before, after in zip(rendered, rendered[1:]):
        assert after.startswith(before)


def test_first_changed_block_names_where_the_cache_broke(counter) -> None:
    orch = make(counter)
    spec = parse_context({**CONTEXT, "session_id": "s2"})
    first = run(orch.prepare(asking(spec, "q")))
    assert first.report.first_changed_block is None
    orch.commit(first, {"role": "assistant", "content": "a"})
    edited = {**CONTEXT, "session_id": "s2", "karma": [{"id": "k1", "text": "B moves right.", "verbatim": True}]}
    second = run(orch.prepare(asking(parse_context(edited), "q2")))
    assert second.report.first_changed_block == "karma"
    assert "B moves right." in second.messages[0]["content"] and "B moves left." not in second.messages[0]["content"]


def with_karma(session: str, *entries: tuple[str, str]) -> dict:
    return {**CONTEXT, "session_id": session,
            "karma": CONTEXT["karma"] + [{"id": i, "text": t, "verbatim": True} for i, t in entries]}


def test_karma_added_mid_session_is_staged_in_state_and_keeps_the_prefix(counter, tokenizer) -> None:
    orch = make(counter)
    karma_hashes, rendered, queries = [], [], []
    for turn, extra in enumerate([(), (), (("k2", "K splits into A and B."),), (("k2", "K splits into A and B."),)]):
        prepared = run(orch.prepare(asking(parse_context(with_karma("stage", *extra)), f"question {turn}")))
        karma_hashes.append(next(b.sha256 for b in prepared.report.blocks if b.name == "karma"))
        rendered.append(tokenizer.apply_chat_template(prepared.messages, add_generation_prompt=True, tokenize=True))
        queries.append(prepared.messages[-1]["content"])
        if turn:
            assert prepared.report.first_changed_block == "state"
        orch.commit(prepared, {"role": "assistant", "content": f"answer {turn}"})
    assert len(set(karma_hashes)) == 1  # the Karma block never changed
    assert "K splits into A and B." in queries[2] and "question 2" in queries[2]
    assert "K splits" not in queries[3]  # delivered once; from then on it is part of the State
    for before, after in zip(rendered, rendered[1:]):
        assert after[:len(before) - 3] == before[:-3]  # token ids extend (less the generation prompt)
    session = orch.sessions.get("stage")
    assert [k.id for k in session.karma] == ["k1"] and [k.id for k in session.staged_karma] == ["k2"]


def test_karma_staging_off_rewrites_the_karma_block(counter) -> None:
    orch = make(counter, karma_staging=False)
    first = run(orch.prepare(asking(parse_context(with_karma("nostage")), "q")))
    orch.commit(first, {"role": "assistant", "content": "a"})
    second = run(orch.prepare(asking(parse_context(with_karma("nostage", ("k2", "K splits."))), "q2")))
    assert second.report.first_changed_block == "karma" and "K splits." in second.messages[0]["content"]


def test_compaction_promotes_staged_karma_verbatim(counter) -> None:
    async def summarize(messages):
        return "SUMMARY"

    orch = make(counter, summarize, compaction_threshold_tokens=40, compaction_keep_turns=1)
    entries: list[tuple[str, str]] = []
    compacted = None
    for turn in range(5):
        if turn == 1:
            entries.append(("k2", "K splits into A and B."))
        prepared = run(orch.prepare(asking(parse_context(with_karma("promote", *entries)), f"question {turn} " * 4)))
        if "compaction" in prepared.actions:
            compacted = compacted or prepared
        orch.commit(prepared, {"role": "assistant", "content": f"answer {turn} " * 4})
    assert compacted is not None
    system = compacted.messages[0]["content"]
    assert "- [k2] K splits into A and B." in system and system.index("[k2]") < system.index("SUMMARY")
    session = orch.sessions.get("promote")
    assert [k.id for k in session.karma] == ["k1", "k2"] and session.staged_karma == []


def test_a_depth_cap_puts_staged_karma_back_in_the_block(counter) -> None:
    orch = make(counter, max_turns=1)
    entries: list[tuple[str, str]] = []
    for turn in range(3):
        if turn == 1:
            entries.append(("k2", "K splits into A and B."))
        prepared = run(orch.prepare(asking(parse_context(with_karma("depth", *entries)), f"question {turn}")))
        orch.commit(prepared, {"role": "assistant", "content": f"answer {turn}"})
    # Turn 1 carried k2 in its Query; turn 2's depth cap dropped turn 1, so k2 is in the Karma block.
    assert "K splits into A and B." in prepared.messages[0]["content"]
    assert any(a.startswith("ctc_depth") for a in prepared.actions)


def test_passthrough_keeps_messages_and_reports(counter) -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    prepared = run(make(counter).prepare(TurnRequest(None, messages)))
    assert prepared.messages is messages
    assert prepared.report.mode == "passthrough"


def test_auto_mode_switches_on_the_threshold(counter) -> None:
    small = run(make(counter).prepare(asking(parse_context({**CONTEXT, "mode": "auto"}), "q")))
    assert small.report.mode == "cag"
    big_codex = [{"id": f"d{i}", "text": "particles collide and split " * 40} for i in range(20)]
    big = run(make(counter).prepare(asking(parse_context({"codex": big_codex}), "q")))
    assert big.report.mode == "rag"
    assert "particles collide" not in big.messages[0]["content"] if big.messages[0]["role"] == "system" else True


@pytest.mark.parametrize("bad, field", [
    ({"mode": "sideways"}, "context.mode"),
    ({"codex": [{"id": "x"}]}, "context.codex.0.text"),
    ({"karma": "not a list"}, "context.karma"),
    ({"warp": 1}, "context.warp"),
    ({"codex": [{"id": "a", "text": "1"}, {"id": "a", "text": "2"}]}, "context.codex"),
])
def test_malformed_context_names_the_field(bad: dict, field: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_context(bad)
    assert str(info.value).startswith(field + ":")


def test_ctc_governor_prunes_filler_first_and_never_verbatim_karma(counter) -> None:
    formatter = FormatterRegistry().get("default")
    state = tuple(Message.from_message(m) for m in [
        {"role": "user", "content": "measure the ring " * 20}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "thanks"}, {"role": "assistant", "content": "the ring has 12 A " * 20}])
    karma = (KarmaEntry(id="v", text="never forget " * 10, verbatim=True), KarmaEntry(id="n", text="minor " * 30))
    inp = AssemblyInput(identity="id", codex=(), karma=karma, summary=None, state=state, query="next?")
    chars = lambda i: assemble(i, formatter, counter).chars  # noqa: E731
    total = chars(inp)
    governed, actions = govern(inp, CTCLimits(max_chars=total - 1), chars)
    assert actions == ["ctc_prune_filler:1"]
    assert [t.content for t in governed.state if t.is_filler] == ["thanks"] and len(governed.state) == 3
    tight, actions = govern(inp, CTCLimits(max_chars=200), chars)
    assert [k.id for k in tight.karma] == ["v"]
    assert actions[0].startswith("ctc_prune_filler") and any(a.startswith("ctc_prune_karma") for a in actions)
    depth, actions = govern(inp, CTCLimits(max_turns=1), chars)
    assert [t.content for t in depth.state] == ["thanks", "the ring has 12 A " * 20] and actions == ["ctc_depth:1"]


def test_compaction_condenses_old_turns_into_karma(counter) -> None:
    calls = []

    async def summarize(messages):
        calls.append(messages)
        return "SUMMARY: A moves right."

    orch = make(counter, summarize, compaction_threshold_tokens=60, compaction_keep_turns=1)
    spec = parse_context({**CONTEXT, "session_id": "s3"})
    compacted = None
    for turn in range(6):
        prepared = run(orch.prepare(TurnRequest(spec, [{"role": "user", "content": f"long question {turn} " * 5}])))
        if "compaction" in prepared.actions:
            compacted = prepared
        orch.commit(prepared, {"role": "assistant", "content": f"long answer {turn} " * 5})
    assert compacted is not None and calls
    assert "SUMMARY: A moves right." in compacted.messages[0]["content"]
    assert "long question 0" not in str(compacted.messages)
    assert orch.sessions.get("s3").compactions >= 1


def test_sessions_persist_and_resume(counter) -> None:
    saved: dict[str, str] = {}
    orch = make(counter, store=SessionStore(saved.get, saved.__setitem__))
    spec = parse_context({**CONTEXT, "session_id": "s4"})
    first = run(orch.prepare(asking(spec, "one")))
    orch.commit(first, {"role": "assistant", "content": "uno"})
    resumed = make(counter, store=SessionStore(saved.get, saved.__setitem__))
    second = run(resumed.prepare(asking(spec, "two")))
    assert [m["content"] for m in second.messages[1:]] == ["one", "uno", "two"]
    assert second.report.first_changed_block == "state"
    staged = parse_context(with_karma("s4", ("k2", "K splits.")))
    resumed.commit(run(resumed.prepare(asking(staged, "three"))),
                     {"role": "assistant", "content": "tres"})
    again = make(counter, store=SessionStore(saved.get, saved.__setitem__))
    fourth = run(again.prepare(asking(staged, "four")))
    assert fourth.report.first_changed_block == "state" and fourth.messages[-1]["content"] == "four"


def test_a_state_saved_under_the_old_keys_loads_and_is_saved_under_the_new(counter) -> None:
    """A State saved while its messages were called turns (`turns`, and `turns_before` in its last
    turn's mark) resumes as one saved now; its next save uses `messages` and `messages_before`."""
    old = json.dumps({"session_id": "old", "summary": None, "compactions": 1, "compacted_turns": 2,
                      "turns": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "uno"}],
                      "karma": [], "staged_karma": [],
                      "last_turn": {"brought": "b", "key": None, "turns_before": 0, "karma_before": [],
                                    "staged_karma_before": []}})
    session = Session.from_json(old)
    assert [(m.role, m.content) for m in session.messages] == [("user", "one"), ("assistant", "uno")]
    assert session.compacted_turns == 2 and session.last_turn is not None and session.last_turn.messages_before == 0
    assert session.without_last_turn().messages == []
    saved = json.loads(session.to_json())
    assert "turns" not in saved and [m["content"] for m in saved["messages"]] == ["one", "uno"]
    assert saved["last_turn"]["messages_before"] == 0 and "turns_before" not in saved["last_turn"]
    assert Session.from_json(session.to_json()) == session
    orch = make(counter, store=SessionStore({"old": old}.get, lambda sid, state: None))
    resumed = run(orch.prepare(asking(parse_context({**CONTEXT, "session_id": "old"}), "two")))
    assert [m["content"] for m in resumed.messages[1:3]] == ["one", "uno"]  # then the Query, with new karma


def test_a_session_resumed_on_another_replica_reports_the_move_once(counter) -> None:
    saved: dict[str, str] = {}  # the store the replicas share (the lake, in a cluster)
    spec = parse_context({**CONTEXT, "session_id": "moving"})
    on_a = make(counter, store=SessionStore(saved.get, saved.__setitem__, replica="a"))
    on_a.commit(run(on_a.prepare(asking(spec, "one"))), {"role": "assistant", "content": "1"})
    again_a = make(counter, store=SessionStore(saved.get, saved.__setitem__, replica="a"))
    assert run(again_a.prepare(asking(spec, "x"))).report.first_changed_block == "state"
    on_b = make(counter, store=SessionStore(saved.get, saved.__setitem__, replica="b"))
    moved = run(on_b.prepare(asking(spec, "two")))
    assert moved.report.first_changed_block == "replica" and moved.report.cached_estimate() == 0
    assert [m["content"] for m in moved.messages[1:]] == ["one", "1", "two"]  # the State came along
    on_b.commit(moved, {"role": "assistant", "content": "2"})
    after = run(on_b.prepare(asking(spec, "three")))
    assert after.report.first_changed_block == "state" and after.report.cached_estimate() > 0
    assert json.loads(saved["moving"])["replica"] == "b"


def test_a_session_back_on_a_replica_that_held_it_takes_the_newer_state(counter) -> None:
    saved: dict[str, str] = {}
    spec = parse_context({**CONTEXT, "session_id": "back"})
    on_a = make(counter, store=SessionStore(saved.get, saved.__setitem__, replica="a"))
    on_b = make(counter, store=SessionStore(saved.get, saved.__setitem__, replica="b"))
    on_a.commit(run(on_a.prepare(asking(spec, "one"))), {"role": "assistant", "content": "1"})
    on_b.commit(run(on_b.prepare(asking(spec, "two"))), {"role": "assistant", "content": "2"})
    back = run(on_a.prepare(asking(spec, "three")))  # a still holds "one" in memory
    assert [m["content"] for m in back.messages[1:]] == ["one", "1", "two", "2", "three"]
    assert back.report.first_changed_block == "replica"
    on_a.commit(back, {"role": "assistant", "content": "3"})
    again = run(on_a.prepare(asking(spec, "four")))
    assert again.report.first_changed_block == "state"

def test_sessions_in_memory_are_bounded_and_a_dropped_one_resumes(counter) -> None:
    saved: dict[str, str] = {}
    evicted: list[str] = []
    orch = make(counter, store=SessionStore(saved.get, saved.__setitem__, max_sessions=3, on_evict=evicted.append))

    async def one_turn(session_id: str, question: str) -> list[str]:
        spec = parse_context({**CONTEXT, "session_id": session_id})
        async with orch.turn(asking(spec, question, completion_tokens=64)) as turn:
            contents = [m["content"] for m in turn.messages[1:]]
            await turn.commit({"role": "assistant", "content": question.upper()})
        return contents

    async def scenario() -> None:
        held = orch.sessions.lock("held")
        await held.acquire()  # a session in use is never dropped, however old
        for i in range(10):
            await one_turn(f"s{i}", f"q{i}")
            assert orch.sessions.resident <= 3 + 1  # the bound, plus the held one
        assert orch.sessions.lock("held") is held
        held.release()
        # s0 was dropped long ago: it comes back from its saved State, its messages in order.
        assert await one_turn("s0", "again") == ["q0", "Q0", "again"]
        assert await one_turn("s0", "third") == ["q0", "Q0", "again", "AGAIN", "third"]

    run(scenario())
    assert orch.sessions.resident == 3
    # What else is kept per session (its RAG index) is told of each drop; the held one was never dropped.
    assert evicted == [f"s{i}" for i in range(9)]


def test_a_failed_turn_leaves_the_session_unchanged_and_frees_it(counter) -> None:
    orch = make(counter)
    spec = parse_context({**CONTEXT, "session_id": "s5"})
    messages = [{"role": "tool", "tool_call_id": "c", "content": "r"}, {"role": "user", "content": "q"}]
    released: list[str] = []

    async def fail() -> None:
        async with orch.turn(TurnRequest(spec, messages)) as turn:
            turn.on_close(lambda: released.append("blocks"))
            assert orch.sessions.lock("s5").locked()
            raise RuntimeError("the engine failed")

    with pytest.raises(RuntimeError, match="engine failed"):
        run(fail())
    assert orch.sessions.get("s5").messages == [] and released == ["blocks"]
    assert not orch.sessions.lock("s5").locked()


def test_a_committed_turn_joins_the_state_once(counter) -> None:
    orch = make(counter)
    spec = parse_context({**CONTEXT, "session_id": "s6"})

    async def exchange() -> None:
        async with orch.turn(asking(spec, "q")) as turn:
            assert orch.sessions.get("s6").messages == []  # preparing never touches the State
            await turn.commit({"role": "assistant", "content": "a"})
            with pytest.raises(RuntimeError, match="at most once"):
                await turn.commit({"role": "assistant", "content": "again"})

    run(exchange())
    assert [t.content for t in orch.sessions.get("s6").messages] == ["q", "a"]
    assert not orch.sessions.lock("s6").locked()


def test_a_handed_over_turn_stays_open_until_its_new_owner_closes_it(counter) -> None:
    orch = make(counter)
    spec = parse_context({**CONTEXT, "session_id": "s7"})

    async def stream() -> None:
        async with orch.turn(asking(spec, "q")) as turn:
            streaming = turn.hand_over()
        assert orch.sessions.lock("s7").locked()  # the stream still owns the session
        streaming.close()  # cut off before the reply completed
        assert not orch.sessions.lock("s7").locked()

    run(stream())
    assert orch.sessions.get("s7").messages == []


def test_a_bad_message_is_an_invalid_request_naming_messages(counter) -> None:
    with pytest.raises(InvalidRequest) as info:
        run(make(counter).prepare(TurnRequest(parse_context(CONTEXT), [{"role": "wizard", "content": "x"},
                                                           {"role": "user", "content": "q"}])))
    assert info.value.param == "messages" and info.value.status == 400


def test_token_counts_are_cached_by_text(counter) -> None:
    text = "the same block " * 50
    counter.count(text)
    misses = counter.misses
    assert counter.count(text) == counter.count(str(text))
    assert counter.misses == misses


class _Encodes:
    """A whitespace tokenizer that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> list[int]:
        self.calls += 1
        return [len(word) for word in text.split()]


def test_the_token_cache_is_bounded_by_characters_least_recently_used_first() -> None:
    counter = TokenCounter(_Encodes(), capacity=100, max_chars=100)
    texts = [f"{i} " + "x" * 38 for i in range(3)]  # 40 characters each: two fit
    for text in texts[:2]:
        counter.count(text)
    counter.count(texts[0])  # now the more recently used
    counter.count(texts[2])
    assert [counter.cached(t) for t in texts] == [True, False, True]
    assert counter.cached_chars == 80 and len(counter) == 2


def test_a_text_over_the_cache_bound_is_counted_but_not_cached() -> None:
    encode = _Encodes()
    counter = TokenCounter(encode, max_chars=100, offload_chars=10)
    small, huge = "a b c", "word " * 100
    counter.count(small)
    run(counter.prefetch([huge]))  # counted on a worker thread, as a long Codex is
    assert counter.count(huge) == 100 and encode.calls == 2  # the assembly after it does not count it again
    assert not counter.cached(huge) and counter.cached(small) and counter.cached_chars == len(small)
    counter.count("word " * 101)  # the next oversize text takes its place
    counter.count(huge)
    assert encode.calls == 4


def test_the_render_cache_is_bounded_by_characters(counter) -> None:
    cache = RenderCache(max_chars=100)
    blocks = [cache.text_block(("codex", i), lambda i=i: f"{i}" * 40, counter, "codex") for i in range(3)]
    assert cache.cached_chars == 80
    rendered: list[int] = []

    def render(i: int) -> str:
        rendered.append(i)
        return f"{i}" * 40

    assert cache.text_block(("codex", 2), lambda: render(2), counter, "codex") == blocks[2]
    cache.text_block(("codex", 0), lambda: render(0), counter, "codex")  # evicted: rendered again
    assert rendered == [0]
    cache.text_block(("codex", 9), lambda: "9" * 101, counter, "codex")  # over the bound: not kept
    assert cache.cached_chars == 80
    cache.text_block(("codex", 9), lambda: render(9), counter, "codex")
    assert rendered == [0, 9]


def test_the_render_cache_keeps_few_states_and_bounds_their_characters(counter) -> None:
    cache = RenderCache(max_chars=100, states=3)
    messages = tuple(Message(role="user", content=f"{i}" * 30) for i in range(6))
    whole = cache.state_block(messages[:1], counter)
    for n in range(2, 7):  # each State extends the last: its digest is the same as from scratch
        grown = cache.state_block(messages[:n], counter)
    assert cache.cached_chars <= 100
    assert grown == RenderCache().state_block(messages, counter) and whole.tokens < grown.tokens
    for n in range(1, 4):  # three short States, each a separate history
        cache.state_block(tuple(Message(role="user", content=f"s{n}") for _ in range(n)), counter)
    assert len(cache._states) == 3


def test_vram_governor_queues_then_rejects_with_retry_after() -> None:
    stats = KVStats(total_blocks=10, block_size=16, usage=0.5)
    governor = VramGovernor(stats, queue_timeout_s=0.05, retry_after_s=3)
    assert governor.blocks_needed(100, 32, 20) == 6
    actions: list[str] = []
    reservation = run(governor.admit(4, actions=actions))
    assert actions == [] and governor.free_blocks() == 5
    with pytest.raises(GovernorRejected) as info:
        run(governor.admit(6, actions=actions))
    assert info.value.retry_after_s == 3 and actions == ["vram_queue"]
    reservation.release()

    async def shrink():
        return 2

    actions = []
    run(governor.admit(6, shrink, actions))
    assert actions == ["vram_queue", "vram_compact"]


def test_formatters_registry_has_default_and_xml() -> None:
    registry = FormatterRegistry()
    assert {"default", "xml"} <= set(registry.names())
    xml = registry.get("xml")
    assert xml.codex([CodexDoc(id="d", text="t")]).startswith("<codex>")
    with pytest.raises(ValueError, match="unknown formatter"):
        registry.get("nope")


def test_the_compaction_threshold_follows_the_window() -> None:
    assert OrchestratorConfig().compaction_tokens(2048) == 1024
    assert OrchestratorConfig().compaction_tokens(32768) == 16384
    assert OrchestratorConfig(compaction_threshold=0.25).compaction_tokens(8192) == 2048
    assert OrchestratorConfig(compaction_threshold_tokens=300).compaction_tokens(32768) == 300


def test_a_replys_reasoning_stays_in_the_kept_state_and_survives_a_resume(counter) -> None:
    """For chat templates that take reasoning back (interleaved thinking): the server-kept State keeps
    an assistant turn's reasoning (vLLM's `reasoning`, or the older `reasoning_content`) as it keeps the
    text, through a save and a resume."""
    saved: dict[str, str] = {}
    orch = make(counter, store=SessionStore(saved.get, saved.__setitem__))
    spec = parse_context({**CONTEXT, "session_id": "thinking"})
    orch.commit(run(orch.prepare(asking(spec, "one"))), {"role": "assistant", "content": "uno", "reasoning": "hmm"})
    orch.commit(run(orch.prepare(asking(spec, "two"))),
                {"role": "assistant", "content": "dos", "reasoning_content": "well"})
    resumed = make(counter, store=SessionStore(saved.get, saved.__setitem__))
    third = run(resumed.prepare(asking(spec, "three")))
    replies = [m for m in third.messages if m["role"] == "assistant"]
    assert [(m["content"], m.get("reasoning")) for m in replies] == [("uno", "hmm"), ("dos", "well")]
    assert Message.from_message({"role": "user", "content": "q", "reasoning": "x"}).reasoning is None
