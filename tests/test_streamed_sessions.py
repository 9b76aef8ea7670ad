"""Sessions inferred from streamed conversations, over real HTTP on the real engine (`ahc serve`, tiny
model): clients that name no session and stream every reply (litellm as OpenHands and aider call it, the
`anthropic` SDK's `messages.stream`, the `openai` SDK with `stream=True`), two conversations of three
turns each interleaved. Each conversation is one session, its turns in order, and every turn after the
first reads the turn before it from vLLM's prefix cache."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import pytest
from test_serve_doors import turn_records

from bench.servers import recall_until

pytestmark = pytest.mark.engine

SYSTEM = "You are a careful physicist who studies a ring of cells and answers briefly. " * 6
TURNS = 3
# Enough tokens that a reply is never empty, few enough to keep the test quick.
REPLY_TOKENS = 4

# A client's turn: (its history so far, the new question) -> the reply's text, as the client keeps it.
Ask = Callable[[list[dict[str, Any]], str], str]


def litellm_ask(server, model_name: str) -> Ask:  # type: ignore[no-untyped-def]
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list
    import litellm

    def ask(history: list[dict[str, Any]], question: str) -> str:
        history.append({"role": "user", "content": question})
        chunks = litellm.completion(model=f"openai/{model_name}", api_base=server.base_url + "/v1",
                                    api_key=server.api_key, messages=[{"role": "system", "content": SYSTEM}, *history],
                                    stream=True, max_tokens=REPLY_TOKENS, temperature=0, ignore_eos=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        history.append({"role": "assistant", "content": text})
        return text

    return ask


def openai_ask(server, model_name: str) -> Ask:  # type: ignore[no-untyped-def]
    client = server.client()

    def ask(history: list[dict[str, Any]], question: str) -> str:
        history.append({"role": "user", "content": question})
        stream = client.chat.completions.create(
            model=model_name, messages=[{"role": "system", "content": SYSTEM}, *history], stream=True,
            max_tokens=REPLY_TOKENS, temperature=0, extra_body={"ignore_eos": True})
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        history.append({"role": "assistant", "content": text})
        return text

    return ask


def anthropic_ask(server, model_name: str) -> Ask:  # type: ignore[no-untyped-def]
    client = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0)

    def ask(history: list[dict[str, Any]], question: str) -> str:
        history.append({"role": "user", "content": question})
        with client.messages.stream(model=model_name, max_tokens=REPLY_TOKENS, system=SYSTEM, messages=history,  # type: ignore[arg-type]
                                    extra_body={"ignore_eos": True, "temperature": 0}) as stream:
            message = stream.get_final_message()
        history.append({"role": "assistant", "content": [block.model_dump() for block in message.content]})
        return "".join(getattr(block, "text", "") for block in message.content)

    return ask


@pytest.mark.parametrize("make_client", [litellm_ask, openai_ask, anthropic_ask],
                         ids=["litellm", "openai", "anthropic"])
def test_two_streamed_conversations_are_two_sessions_and_later_turns_are_cached(  # type: ignore[no-untyped-def]
        server, model_name, make_client: Callable[..., Ask]) -> None:
    ask = make_client(server, model_name)
    tag = uuid.uuid4().hex[:8]  # this test's words, apart from every other test's on the same server
    histories: list[list[dict[str, Any]]] = [[], []]
    questions = [[f"Conversation {c} {tag}, question {t}?" for t in range(TURNS)] for c in range(2)]
    for t in range(TURNS):  # interleaved: a's turn, then b's
        for c in range(2):
            assert ask(histories[c], questions[c][t])  # a reply with text, streamed
    rows = recall_until(server, 2 * TURNS, text=tag, event_types="input")
    sessions: dict[str, list[str]] = {}
    for row in rows:
        sessions.setdefault(row["session_id"], []).append(row["content"])
    assert sorted(sessions.values()) == sorted(questions), sessions  # two sessions, each its turns in order
    for session in sessions:
        records = turn_records(server, session, TURNS)
        assert [r["session_naming"] for r in records] == ["new"] + ["inferred"] * (TURNS - 1)
        for before, after in zip(records, records[1:]):
            # The turn before, cached but for its last block or two (a block is 16 tokens; the generation
            # prompt's last token may merge with the reply's first when the reply is sent back as text).
            assert after["cached_tokens"] >= before["prompt_tokens"] - 32, records
