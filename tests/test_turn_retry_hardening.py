"""Which request takes the place of a session's last turn, on AHC's whole app (fake engine, TestClient, a
real XDB) through the official clients: only a turn whose reply never reached its client is replaced by a
retry, and an `Idempotency-Key` sent again is either that retry or refused, never a silent replacement."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from chat_bodies import chat
from fake_app import post_scope, serving
from fastapi.testclient import TestClient
from starlette.requests import ClientDisconnect
from vllm.config import VllmConfig

from core.config import AHCConfig
from core.errors import RateLimited
from server.admission.turn_admission import admit
from server.pipeline import turn_pipeline
from server.runtime import Runtime
from xdb.owner import EVERY

CONTEXT = {"identity": "You are a careful physicist."}


def user_messages(runtime: Runtime, session: str) -> tuple[list[str], list[str]]:
    """The session's user messages in memory and as stored."""
    in_memory = [m.content for m in runtime.orchestrator.sessions.get(session).messages if m.role == "user"]
    stored = json.loads(runtime.xdb.load_session_state(session) or "{}")
    return in_memory, [m["content"] for m in stored.get("messages", []) if m["role"] == "user"]


def refuse_first_attempts(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """Admission answers AHC's own 429 to the next `times` turns (the first attempt never gets in); the
    list empties as it does."""
    left = [1] * times

    async def refusing(*args: Any, **kwargs: Any) -> None:
        if left:
            left.pop()
            raise RateLimited("no room for the turn now", retry_after_s=0)  # 0: the SDK's own short backoff
        await admit(*args, **kwargs)

    monkeypatch.setattr(turn_pipeline, "admit", refusing)
    return left


def openai_client(http: TestClient, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=retries)


def anthropic_client(http: TestClient, retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=retries)


def ask(http: TestClient, door: str, session: str, question: str, retries: int = 0,
        headers: dict[str, str] | None = None) -> None:
    """One turn of `session` through the door's official client."""
    context = {"context": {"session_id": session, **CONTEXT}}
    messages: Any = [{"role": "user", "content": question}]
    if door == "chat":
        openai_client(http, retries).chat.completions.create(model="tiny", max_tokens=8, messages=messages,
                                                             extra_body=context, extra_headers=headers)
    else:
        anthropic_client(http, retries).messages.create(model="tiny", max_tokens=8, messages=messages,
                                                        extra_body=context, extra_headers=headers)


@pytest.mark.parametrize("door", ["chat", "messages"])
def test_an_sdk_retry_after_a_refused_first_attempt_keeps_the_turn_the_client_saw_answered(
        served: tuple[TestClient, Runtime], monkeypatch: pytest.MonkeyPatch, door: str) -> None:
    """An agent says "Continue." twice; the second time the first attempt gets AHC's 429 and the SDK sends
    it again (`X-Stainless-Retry-Count: 1`) with the same words as the answered turn before it. Both turns
    were answered, so both stay."""
    http, runtime = served
    session = f"continue-{door}"
    ask(http, door, session, "Continue.")
    refused = refuse_first_attempts(monkeypatch, 1)
    ask(http, door, session, "Continue.", retries=2)
    assert not refused  # the first attempt was refused, and the SDK retried
    assert user_messages(runtime, session) == (["Continue.", "Continue."],) * 2


def cut_before_the_end(http: TestClient, body: dict[str, object], headers: dict[str, str] | None = None) -> None:
    """A streamed chat request whose connection resets as the stream's last event goes out: the turn has
    settled (committed before its end is sent), the client never got the whole reply."""
    payload = json.dumps(body).encode()
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {**post_scope("/v1/chat/completions", payload, raw), "asgi": {"version": "3.0", "spec_version": "2.4"}}
    requests = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict[str, object]:
        if requests:
            return requests.pop(0)
        await asyncio.Event().wait()  # the reset is only seen as the last event is sent
        return {"type": "http.disconnect"}

    reset: list[bool] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and b"[DONE]" in bytes(message.get("body", b"")):
            reset.append(True)
            raise OSError("connection reset by peer")

    async def request() -> None:
        await http.app(scope, receive, send)  # type: ignore[arg-type]

    assert http.portal is not None  # the TestClient's own event loop, where the app's sessions live
    with contextlib.suppress(OSError, ClientDisconnect):  # what reaches the server, as the reset surfaces
        http.portal.call(request)
    assert reset == [True]


def test_a_streamed_reply_sent_whole_is_kept_and_one_cut_short_is_replaced_by_its_retry(
        served: tuple[TestClient, Runtime]) -> None:
    http, runtime = served
    retry = {"X-Stainless-Retry-Count": "1"}
    with http.stream("POST", "/v1/chat/completions", json=chat("streamed", "Continue.", stream=True)) as whole:
        assert whole.status_code == 200 and "[DONE]" in whole.read().decode()
    http.post("/v1/chat/completions", json=chat("streamed", "Continue."), headers=retry).raise_for_status()
    assert user_messages(runtime, "streamed") == (["Continue.", "Continue."],) * 2  # the streamed turn stays

    cut_before_the_end(http, chat("streamed", "Continue.", stream=True))
    assert user_messages(runtime, "streamed") == (["Continue."] * 3,) * 2  # committed, never delivered
    http.post("/v1/chat/completions", json=chat("streamed", "Continue."), headers=retry).raise_for_status()
    assert user_messages(runtime, "streamed") == (["Continue."] * 3,) * 2  # the retry took its place


def test_an_idempotency_key_sent_again_after_its_reply_was_delivered_is_answered_409(
        served: tuple[TestClient, Runtime]) -> None:
    """The same key is the same request: one answered already is not run again (nor its turn dropped);
    one whose reply was cut short is run again in its place."""
    http, runtime = served
    key = {"Idempotency-Key": "turn-1"}
    http.post("/v1/chat/completions", json=chat("keyed", "Go on."), headers=key).raise_for_status()
    stored = runtime.xdb.load_session_state("keyed")
    again = http.post("/v1/chat/completions", json=chat("keyed", "Go on."), headers=key)
    assert again.status_code == 409, again.text
    error = again.json()["error"]
    assert error["type"] == "conflict_error" and error["code"] == "idempotency_key_answered"
    assert runtime.xdb.load_session_state("keyed") == stored and user_messages(runtime, "keyed") == (["Go on."],) * 2

    other = {"Idempotency-Key": "turn-2"}
    cut_before_the_end(http, chat("keyed", "Go on.", stream=True), other)
    again = http.post("/v1/chat/completions", json=chat("keyed", "Go on."), headers=other)
    assert again.status_code == 200, again.text
    assert user_messages(runtime, "keyed") == (["Go on.", "Go on."],) * 2


def stored_rows(runtime: Runtime, session: str) -> tuple[str | None, int]:
    """What XDB holds of the session: its State and how many input rows."""
    assert runtime.xdb.writer is not None
    runtime.xdb.writer.flush()
    return (runtime.xdb.load_session_state(session),
            len(runtime.xdb.recall(session_id=session, event_types=["input"], limit=1000, owner=EVERY)))


def test_an_idempotency_key_sent_again_with_other_words_is_a_422_on_the_chat_door(
        served: tuple[TestClient, Runtime]) -> None:
    http, runtime = served
    client, key = openai_client(http), {"Idempotency-Key": "turn-1"}
    ask(http, "chat", "reused", "First question?", headers=key)
    before = stored_rows(runtime, "reused")
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.chat.completions.create(model="tiny", max_tokens=8, extra_headers=key,
                                       messages=[{"role": "user", "content": "Another question?"}],
                                       extra_body={"context": {"session_id": "reused", **CONTEXT}})
    error = refused.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "idempotency_key_reused"
    assert stored_rows(runtime, "reused") == before
    assert user_messages(runtime, "reused") == (["First question?"],) * 2


def test_an_idempotency_key_sent_again_with_other_words_is_a_422_on_the_messages_door(
        served: tuple[TestClient, Runtime]) -> None:
    http, runtime = served
    key = {"Idempotency-Key": "turn-1"}
    ask(http, "messages", "reused", "First question?", headers=key)
    before = stored_rows(runtime, "reused")
    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        ask(http, "messages", "reused", "Another question?", headers=key)
    body = refused.value.response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "invalid_request_error" and "Idempotency-Key" in body["error"]["message"]
    assert stored_rows(runtime, "reused") == before
    assert user_messages(runtime, "reused") == (["First question?"],) * 2


def test_an_idempotency_key_sent_again_with_other_words_is_a_422_on_the_responses_door(
        served: tuple[TestClient, Runtime]) -> None:
    http, runtime = served
    client, key = openai_client(http), {"Idempotency-Key": "turn-2"}
    first = client.responses.with_raw_response.create(model="tiny", input="My name is Ada.", max_output_tokens=4)
    r1, session = first.parse(), first.headers["X-Session-ID"]
    r2 = client.responses.create(model="tiny", input="What is my name?", previous_response_id=r1.id,
                                 max_output_tokens=4, extra_headers=key)
    before = stored_rows(runtime, session)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.responses.create(model="tiny", input="Spell it.", previous_response_id=r2.id, max_output_tokens=4,
                                extra_headers=key)
    assert refused.value.response.json()["error"]["code"] == "idempotency_key_reused"
    assert stored_rows(runtime, session) == before
    assert user_messages(runtime, session)[0] == ["My name is Ada.", "What is my name?"]


def test_a_turn_read_back_from_the_store_counts_as_delivered(config: AHCConfig, vllm_config: VllmConfig,
                                                              tmp_path: Path) -> None:
    """A session dropped from memory comes back from its saved State, which cannot say whether the last
    reply went out: it is kept, not dropped for an SDK retry repeating its words."""
    with serving(config, vllm_config, tmp_path, None, **{"orchestrator.max_sessions": 1}) as (http, runtime):
        http.post("/v1/chat/completions", json=chat("evicted", "Continue.")).raise_for_status()
        http.post("/v1/chat/completions", json=chat("other", "Hello.")).raise_for_status()  # "evicted" leaves
        http.post("/v1/chat/completions", json=chat("evicted", "Continue."),
                  headers={"X-Stainless-Retry-Count": "1"}).raise_for_status()
        assert user_messages(runtime, "evicted") == (["Continue.", "Continue."],) * 2


@pytest.mark.parametrize("committed", [False, True], ids=["save-fails", "saved-unanswered"])
def test_a_turn_whose_save_answers_503_joins_the_state_once_when_the_client_retries(
        served: tuple[TestClient, Runtime], monkeypatch: pytest.MonkeyPatch, committed: bool) -> None:
    """The XDB service died during the save (nothing stored) or after the save committed, before answering:
    the client got a 503 and its SDK retried. Either way the turn is in the State once, in memory and as
    stored (it held ['first', 'second', 'second'])."""
    from xdb.service.link import ServiceUnavailable

    client, runtime = served
    store, failures = runtime.xdb.save_session_state, [1]

    def dies_once(session_id: str, state: str) -> int:
        stored = store(session_id, state) if committed else 0
        if json.loads(state)["messages"][-2]["content"] == "Second question?" and failures:
            failures.pop()
            # Retry-After 1 s (the service's own is 5): the SDK waits what the 503 says
            raise ServiceUnavailable("the XDB service exited during the call", retry_after_s=1)
        return stored if committed else store(session_id, state)

    monkeypatch.setattr(runtime.xdb, "save_session_state", dies_once)
    retrying = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=2)
    session = f"save-dies-{committed}"
    for question in ("First question?", "Second question?"):
        body = chat(session, question)
        retrying.chat.completions.create(model="tiny", max_tokens=8, messages=body["messages"],
                                         extra_body={"context": body["context"]})
    assert not failures  # the save did fail once, and the client retried
    assert user_messages(runtime, session) == (["First question?", "Second question?"],) * 2


def test_an_idempotency_key_sent_again_is_the_same_request_and_another_key_a_turn_of_its_own(
        served: tuple[TestClient, Runtime]) -> None:
    """The same Idempotency-Key once its reply was delivered is answered 409, the State as it was (a reply
    that never reached the client is replaced by its retry: above). The same
    words sent again as a new request (no key, or another) are a turn of their own."""
    client, runtime = served
    client.post("/v1/chat/completions", json=chat("resent", "First question?")).raise_for_status()
    sent = client.post("/v1/chat/completions", json=chat("resent", "Go on."), headers={"Idempotency-Key": "turn-2"})
    assert sent.status_code == 200, sent.text
    again = client.post("/v1/chat/completions", json=chat("resent", "Go on."), headers={"Idempotency-Key": "turn-2"})
    assert again.status_code == 409, again.text
    assert user_messages(runtime, "resent") == (["First question?", "Go on."],) * 2
    client.post("/v1/chat/completions", json=chat("resent", "Go on."),
                headers={"Idempotency-Key": "turn-3"}).raise_for_status()
    client.post("/v1/chat/completions", json=chat("resent", "Go on.")).raise_for_status()
    assert user_messages(runtime, "resent") == (["First question?", "Go on.", "Go on.", "Go on."],) * 2
    # A retry of an earlier turn than the last is no retry of the last: it is a turn of its own.
    client.post("/v1/chat/completions", json=chat("resent", "Go on."),
                headers={"Idempotency-Key": "turn-2"}).raise_for_status()
    assert user_messages(runtime, "resent")[0] == ["First question?", "Go on.", "Go on.", "Go on.", "Go on."]


def test_the_same_words_join_the_state_each_time_their_reply_was_delivered(
        served: tuple[TestClient, Runtime]) -> None:
    """An SDK retry (`X-Stainless-Retry-Count` above 0) replaces only a turn whose reply the client never
    got: after a delivered reply it is a retry of a request that never got in, a turn of its own."""
    client, runtime = served
    for retries in ("0", "0", "1", "2"):
        client.post("/v1/chat/completions", json=chat("same-words", "Yes."),
                    headers={"X-Stainless-Retry-Count": retries}).raise_for_status()
    assert user_messages(runtime, "same-words") == (["Yes."] * 4,) * 2


def test_a_state_the_lake_cannot_take_is_kept_and_the_reply_stands(served: tuple[TestClient, Runtime],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With the experience lake down, XDB stores the State locally and raises LakeUnavailable. That was a 503
    after the turn had joined the State: the client retried, and every retry appended the turn again."""
    from xdb.lake.shipper import LakeUnavailable

    client, runtime = served
    store = runtime.xdb.save_session_state

    def lake_down(session_id: str, state: str) -> int:
        store(session_id, state)  # committed locally, as XDB does before it ships
        raise LakeUnavailable("the lake's catalog refused the connection")

    monkeypatch.setattr(runtime.xdb, "save_session_state", lake_down)
    # The official client, retrying as it does on a 5xx (two more tries each): a turn must still be once.
    retrying = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=2)
    for question in ("First question?", "Second question?"):
        body = chat("lake-down", question)
        done = retrying.chat.completions.create(model="tiny", max_tokens=8, messages=body["messages"],
                                                extra_body={"context": body["context"]})
        assert done.choices[0].message.content is not None
    stored = runtime.xdb.load_session_state("lake-down")
    assert stored is not None
    users = [m["content"] for m in json.loads(stored)["messages"] if m["role"] == "user"]
    assert users == ["First question?", "Second question?"]  # each turn once
    assert "ahc_lake_deferred_states_total" in client.get("/metrics").text
    counted = [sample.value for metric in runtime.metrics.lake_deferred_states.collect()
               for sample in metric.samples if sample.name.endswith("_total")]
    assert counted == [2.0]
