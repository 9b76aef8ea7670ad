"""What the turn pipeline gives every door, held on the doors that once ran their own: on the Responses
door, a client hanging up cancels the engine request of a response it is not streaming, and a streamed
response's last token never waits for the commit its `response.completed` waits for; on every door, a
reply's turn record is committed before the client has the reply. On AHC's whole app
(fake engine), driven over ASGI so the client's hang-up and the disk's pace are the test's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fake_app import ALICE, ahc_app, post_scope, stream_past_a_slow_disk
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from vllm.config import VllmConfig

from core.config import AHCConfig
from server.runtime import Runtime
from xdb import XDB

PATH = "/v1/responses"


HEADERS = [(b"x-session-id", b"door-test")]


def test_a_client_hanging_up_cancels_its_unstreamed_response(config: AHCConfig, vllm_config: VllmConfig,
                                                               tmp_path: Path) -> None:
    body = json.dumps({"model": "tiny", "input": "Take your time.", "max_output_tokens": 64}).encode()

    async def scenario() -> tuple[FakeEngine, list[dict[str, Any]], Runtime]:
        engine = FakeEngine(vllm_config, step_delay=0.05)  # 64 tokens: 3 s unless cancelled
        xdb = XDB.open(tmp_path / "xdb")
        app, runtime = await ahc_app(config.with_overrides(data_dir=str(tmp_path / "xdb")), engine, xdb)
        messages: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, object]:
            if messages:
                return messages.pop(0)
            while not engine.requests:  # hang up once the engine has the request
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asyncio.wait_for(app(post_scope(PATH, body, HEADERS), receive, send), 2.5)
        runtime.close()
        xdb.close()
        return engine, sent, runtime

    engine, sent, runtime = asyncio.run(scenario())
    assert engine.requests[-1].aborted  # the engine stopped generating for a client that left
    assert runtime.orchestrator.sessions.lock("door-test").locked() is False


def test_a_streamed_responses_last_token_does_not_wait_for_the_disk_but_completed_does(
        config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = json.dumps({"model": "tiny", "input": "Stream please.", "max_output_tokens": 8, "stream": True}).encode()

    before, after, _ = stream_past_a_slow_disk(config, vllm_config, tmp_path, monkeypatch,
                                               post_scope(PATH, body, HEADERS), body)

    def kinds(chunks: list[str]) -> list[str]:
        return [event.split("\n")[0].removeprefix("event: ") for event in "".join(chunks).split("\n\n") if event]

    sent_before, sent_after = kinds(before), kinds(after)
    assert "response.output_text.delta" in sent_before and "response.output_text.done" in sent_before
    assert "response.completed" not in sent_before and sent_after[-1] == "response.completed"
    text = "".join(json.loads(event.split("\ndata: ", 1)[1])["delta"] for event in "".join(before).split("\n\n")
                   if event.startswith("event: response.output_text.delta"))
    completed = json.loads("".join(after).split("\n\n")[-2].split("\ndata: ", 1)[1])["response"]
    assert text and completed["output"][0]["content"][0]["text"] == text  # every token went out before the wait


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
def test_a_replys_turn_record_is_readable_once_the_client_has_the_reply(
        two_tenants: tuple[TestClient, Runtime], stream: bool) -> None:
    http, _ = two_tenants
    headers = {"Authorization": f"Bearer {ALICE}", "X-Session-ID": f"at-once-{stream}"}
    for n in (1, 2):
        body = {"model": "tiny", "max_tokens": 4, "stream": stream,
                "messages": [{"role": "user", "content": f"Question {n}?"}]}
        with http.stream("POST", "/v1/chat/completions", headers=headers, json=body) as response:
            assert response.status_code == 200
            response.read()
        turns = http.get(f"/v1/xdb/sessions/at-once-{stream}/turns", headers=headers).json()["turns"]
        assert len(turns) == n  # no wait: the record was committed before the response ended
