"""The orchestrator keeps a session inside the model's window: budgeted prompts on cpu-tiny's window through
CAG, RAG and auto, compaction that continues the prompt as last sent, and excerpts that join the State once."""

from __future__ import annotations

import asyncio

import pytest
from turn_requests import asking

from core.config import OrchestratorConfig
from core.errors import InvalidRequest
from orchestrator.context_spec import parse_context
from orchestrator.message import Message
from orchestrator.orchestrator import Orchestrator
from orchestrator.session import SessionStore
from orchestrator.token_counter import TokenCounter

# A session on cpu-tiny's window: identity ~260 tokens, a Codex of three ~210-token documents, user turns
# of ~30 words, 12-token replies. Unbudgeted, it outgrew the window at turn 10 (vLLM's 400).
WINDOW, MAX_TOKENS = 2048, 12
VOCAB = ("particle collision ring cell symbol left right moves splits merges period class window rule table "
         "experiment prediction counterexample theorem").split()


def words(n: int, seed: int) -> str:
    return " ".join(VOCAB[(seed * 7 + i * (seed % 5 + 1)) % len(VOCAB)] for i in range(n))


class FixedRetriever:
    """Excerpts of a fixed size (each document's head), best first, without an embedding model."""

    def __init__(self, chars: int = 400) -> None:
        self.chars = chars

    async def retrieve(self, docs, query, k, scope, tenant_prefix=""):
        from orchestrator.formatters import Excerpt
        return [Excerpt(doc.id, i, doc.text[:self.chars]) for i, doc in enumerate(list(docs)[:k])]

    def tool(self):
        from orchestrator.retrieval.tool import QUERY_ARCHIVE_TOOL
        return QUERY_ARCHIVE_TOOL


def budgeted(counter: TokenCounter, tokenizer, summarize=None) -> Orchestrator:
    def render(messages, tools):
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)

    return Orchestrator(OrchestratorConfig(), WINDOW, counter, SessionStore(), FixedRetriever(), summarize, render)


def engine_tokens(tokenizer, prepared) -> int:
    """The prompt as vLLM counts it: the chat template over the messages and the offered tools."""
    return len(tokenizer.apply_chat_template(prepared.messages, tools=prepared.extra_tools or None,
                                             add_generation_prompt=True, tokenize=True, return_dict=False))


def tiny_session(docs: int) -> dict:
    return {"identity": "You are a careful physicist. " + words(120, 1),
            "codex": [{"id": f"doc{i}", "text": words(105, 10 + i)} for i in range(docs)]}


@pytest.mark.parametrize("mode, docs", [("cag", 3), ("rag", 3), ("auto", 3), ("auto", 8)])
def test_a_long_session_always_fits_the_window(counter, tokenizer, mode: str, docs: int) -> None:
    summaries: list[list[dict]] = []

    async def summarize(messages):
        summaries.append(messages)
        return f"Summary {len(summaries)}: " + words(30, len(summaries))

    orch = budgeted(counter, tokenizer, summarize)
    spec = parse_context({**tiny_session(docs), "session_id": f"long-{mode}-{docs}", "mode": mode})
    compactions, modes = 0, set()
    for turn in range(60):
        prepared = asyncio.run(orch.prepare(asking(spec, words(30, 100 + turn), completion_tokens=MAX_TOKENS)))
        real = engine_tokens(tokenizer, prepared)
        assert real + MAX_TOKENS <= WINDOW, (turn, real, prepared.report.to_json("s"))
        assert real <= prepared.prompt_tokens  # the budget's estimate never undercounts
        if prepared.report.mode == "rag":
            query = next(b.tokens for b in prepared.report.blocks if b.name == "query")
            codex = counter.count(orch.formatters.get("default").codex(spec.codex))
            assert query - counter.count(words(30, 100 + turn)) <= codex  # excerpts never outweigh the Codex
        compactions += prepared.actions.count("compaction")
        modes.add(prepared.report.mode)
        orch.commit(prepared, {"role": "assistant", "content": words(8, turn)})
    session = orch.sessions.get(f"long-{mode}-{docs}")
    assert compactions == session.compactions == len(summaries) >= 1  # each compaction is in a report
    # auto decides by the Codex alone (3 documents fit its threshold, 8 do not) and keeps the decision.
    assert modes == ({"rag"} if mode == "rag" or docs == 8 else {"cag"})
    assert session.mode_switches == 0


def test_a_prompt_that_cannot_fit_even_compacted_names_each_block(counter, tokenizer) -> None:
    async def summarize(messages):
        return "short"

    orch = budgeted(counter, tokenizer, summarize)
    spec = parse_context({**tiny_session(3), "identity": words(2500, 3), "session_id": "huge", "mode": "cag"})
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(orch.prepare(asking(spec, "q", completion_tokens=MAX_TOKENS)))
    message = str(info.value)
    assert info.value.status == 400 and info.value.param == "context"
    for block in ("identity", "codex", "karma", "state", "query"):
        assert f"{block} " in message
    identity = counter.count(words(2500, 3))
    assert f"identity {identity:,}" in message and "max_model_len 2,048" in message


def test_without_max_tokens_the_default_reply_room_is_kept(counter, tokenizer) -> None:
    orch = budgeted(counter, tokenizer)
    assert orch.prompt_budget(None) == WINDOW - OrchestratorConfig().default_completion_tokens
    assert orch.prompt_budget(MAX_TOKENS) == WINDOW - MAX_TOKENS
    with pytest.raises(InvalidRequest, match="max_tokens"):
        orch.prompt_budget(WINDOW)


def test_compaction_continues_the_session_prompt_as_last_sent(counter, tokenizer) -> None:
    """The summary call is the session's last prompt (blocks and State exactly as sent), its reply, then
    the instruction: the engine reads all but the instruction from the prefix cache."""
    calls = []

    async def summarize(call):
        calls.append(call)
        return "Summary: " + words(20, len(calls))

    orch = budgeted(counter, tokenizer, summarize)
    spec = parse_context({**tiny_session(3), "session_id": "cont", "mode": "auto"})
    sent: list[list[dict]] = []
    for turn in range(40):
        prepared = asyncio.run(orch.prepare(asking(spec, words(30, 100 + turn), completion_tokens=MAX_TOKENS)))
        if calls and "compaction" in prepared.actions:
            break
        sent.append(prepared.messages)
        orch.commit(prepared, {"role": "assistant", "content": words(8, turn)})
    call = calls[0]
    assert call.continued and call.tools == ()
    last = sent[-1]
    assert call.messages[:len(last)] == last  # the previous prompt, byte for byte
    assert call.messages[len(last)] == {"role": "assistant", "content": words(8, len(sent) - 1)}
    assert call.messages[-1]["role"] == "user" and "Condense" in call.messages[-1]["content"]
    # It fit the window with its summary: the trigger left room for it.
    rendered = tokenizer.apply_chat_template(call.messages, add_generation_prompt=True, tokenize=True)
    assert len(rendered) + OrchestratorConfig().compaction_max_tokens <= WINDOW


def test_a_prompt_too_long_to_continue_is_summarised_as_a_transcript(counter, tokenizer) -> None:
    calls = []

    async def summarize(call):
        calls.append(call)
        return "Summary."

    orch = budgeted(counter, tokenizer, summarize)
    orch.config = OrchestratorConfig(max_chars=10**7)  # no character cap: the State stays as long as it is
    spec = parse_context({**tiny_session(3), "session_id": "huge-state", "mode": "cag"})
    session = orch.sessions.get("huge-state")
    # Longer than the window: a client's history sent to a server that kept none, or a smaller window now.
    session.messages = [Message(role="user" if i % 2 == 0 else "assistant", content=words(120, i)) for i in range(16)]
    asyncio.run(orch.prepare(asking(spec, "q", completion_tokens=MAX_TOKENS)))
    assert calls and not calls[0].continued
    assert calls[0].messages[0]["content"].startswith("Condense the conversation below")


def test_auto_keeps_its_decision_until_the_codex_changes(counter, tokenizer) -> None:
    orch = budgeted(counter, tokenizer, None)
    small = {**tiny_session(3), "session_id": "keep", "mode": "auto"}
    first = asyncio.run(orch.prepare(asking(parse_context(small), "q0", completion_tokens=MAX_TOKENS)))
    orch.commit(first, {"role": "assistant", "content": "a0"})
    assert first.report.mode == "cag" and first.report.mode_switches == 0
    big = {**small, "codex": [{"id": f"doc{i}", "text": words(105, 10 + i)} for i in range(8)]}
    second = asyncio.run(orch.prepare(asking(parse_context(big), "q1", completion_tokens=MAX_TOKENS)))
    orch.commit(second, {"role": "assistant", "content": "a1"})
    assert second.report.mode == "rag" and second.report.mode_switches == 1
    assert second.report.switched == ("full", "rag")
    third = asyncio.run(orch.prepare(asking(parse_context(big), "q2", completion_tokens=MAX_TOKENS)))
    assert third.report.mode == "rag" and third.report.mode_switches == 1 and third.report.switched is None
    assert third.report.to_json("keep")["mode_switches"] == 1


def test_a_codex_that_cannot_fit_beside_a_compacted_state_moves_once(counter, tokenizer) -> None:
    """Under the threshold but too large for the window once the identity and the question are in: the
    session moves to the condensed rendition (one switch), and stays there."""
    async def summarize(call):
        return "Summary."

    orch = budgeted(counter, tokenizer, summarize)
    codex = [{"id": "doc0", "text": words(820, 5), "condensed": words(150, 6)}]
    spec = parse_context({"identity": words(250, 1), "codex": codex, "session_id": "move", "mode": "auto",
                          "cag_threshold": 0.9})
    reports = []
    for turn in range(6):
        prepared = asyncio.run(orch.prepare(asking(spec, words(30, 100 + turn), completion_tokens=MAX_TOKENS)))
        orch.commit(prepared, {"role": "assistant", "content": words(8, turn)})
        reports.append(prepared.report)
    assert [r.codex[0]["rendition"] for r in reports] == ["condensed"] * 6
    assert [r.mode_switches for r in reports] == [1] * 6 and reports[0].switched == ("full", "condensed")
    assert orch.sessions.get("move").placement == "condensed"


def test_rag_excerpts_join_the_state_once(counter, tokenizer) -> None:
    """A RAG turn's excerpts stay in State with its question (so the next turn reads them from the cache),
    and an excerpt already there is not sent again."""
    async def summarize(call):
        return "Summary."

    orch = budgeted(counter, tokenizer, summarize)
    orch.retriever = FixedRetriever(chars=200)
    spec = parse_context({**tiny_session(3), "session_id": "excerpts", "mode": "rag"})
    first = asyncio.run(orch.prepare(asking(spec, "which rule?", completion_tokens=MAX_TOKENS)))
    assert "Archive excerpts" in first.messages[-1]["content"]
    orch.commit(first, {"role": "assistant", "content": "this one"})
    second = asyncio.run(orch.prepare(asking(spec, "and then?", completion_tokens=MAX_TOKENS)))
    # The first turn's question as sent, excerpts and all, is now State: a prefix of the second prompt.
    assert second.messages[1] == first.messages[-1]
    assert second.messages[-1]["content"] == "and then?"  # every excerpt is in State already



def test_excerpts_too_large_for_the_state_stay_in_the_query(counter, tokenizer) -> None:
    """In a window where one excerpt would take over a quarter of the State's room, keeping excerpts
    would compact every turn: they go in the Query alone, and the State keeps the bare question."""
    async def summarize(call):
        return "Summary."

    orch = budgeted(counter, tokenizer, summarize)
    orch.retriever = FixedRetriever(chars=2400)  # ~450 tokens an excerpt
    codex = [{"id": f"doc{i}", "text": words(500, 10 + i)} for i in range(3)]
    spec = parse_context({**tiny_session(3), "codex": codex, "session_id": "big-excerpts", "mode": "rag"})
    first = asyncio.run(orch.prepare(asking(spec, words(30, 7), completion_tokens=MAX_TOKENS)))
    orch.commit(first, {"role": "assistant", "content": "a"})
    assert first.stored_query == words(30, 7)
    assert first.stored_query != first.messages[-1]["content"]  # the excerpts were sent
    second = asyncio.run(orch.prepare(asking(spec, words(30, 8), completion_tokens=MAX_TOKENS)))
    assert "compaction" not in second.actions  # the passing excerpts did not crowd the State
    assert "Archive excerpts" in second.messages[-1]["content"]
