"""AHC's whole app on the fake engine (tests/fake_app.py) when something fails under a turn: a flush that fails,
a client gone before its stream starts, a disk that is slow or crawls. The turn is released and no token
is lost or reordered."""

from __future__ import annotations

import asyncio
import json
import time
from functools import partial
from pathlib import Path

import pytest
from chat_bodies import chat as chat_body
from fake_app import ahc_app, post_scope, stream_past_a_slow_disk
from fake_engine import FakeEngine
from fastapi.testclient import TestClient

from core.config import AHCConfig
from server.runtime import Runtime
from xdb import XDB
from xdb.owner import EVERY

# This module's sessions carry a karma entry too, as tests/test_chat_route.py's.
chat = partial(chat_body, context={"karma": [{"id": "k1", "text": "A moves right.", "verbatim": True}]})


def broken_flush(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    async def fail(timeout: float = 10.0, session_id: str | None = None) -> None:
        raise RuntimeError("the disk is gone")

    monkeypatch.setattr(runtime.recorder, "aflush", fail)
    runtime.metrics.kv_stats.total_blocks, runtime.metrics.kv_stats.block_size = 1000, 16


def assert_released(runtime: Runtime, session: str) -> None:
    assert runtime.governor.free_blocks() == 1000  # no reservation outlives its request
    assert not runtime.orchestrator.sessions.lock(session).locked()
    assert runtime.orchestrator.sessions.get(session).messages == []


def test_a_failing_flush_releases_the_turn(served: tuple[TestClient, Runtime], monkeypatch: pytest.MonkeyPatch) -> None:
    client, runtime = served
    broken_flush(runtime, monkeypatch)
    response = TestClient(client.app, raise_server_exceptions=False).post("/v1/chat/completions", json=chat("s8"))
    assert response.status_code == 500
    assert_released(runtime, "s8")


def test_a_failing_flush_mid_stream_releases_the_turn(served: tuple[TestClient, Runtime],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    client, runtime = served
    broken_flush(runtime, monkeypatch)
    quiet = TestClient(client.app, raise_server_exceptions=False)  # not entered: the app's lifespan runs once
    with quiet.stream("POST", "/v1/chat/completions", json=chat("s9", stream=True)) as response:
        text = "".join(response.iter_text())
    assert '"error"' in text  # vLLM reports the failure in the stream
    assert_released(runtime, "s9")


def test_a_client_gone_before_the_stream_starts_releases_the_turn(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    """Starlette never starts a stream's iterator when the client hangs up first: the turn must still end."""
    body = json.dumps(chat("s10", stream=True)).encode()

    async def scenario() -> Runtime:
        xdb = XDB.open(tmp_path / "xdb")
        app, runtime = await ahc_app(config.with_overrides(data_dir=str(tmp_path / "xdb")),
                                     FakeEngine(vllm_config), xdb)
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        responding = asyncio.Event()

        async def receive() -> dict[str, object]:
            if messages:
                return messages.pop(0)
            await responding.wait()  # the client hangs up once vLLM has handed over its stream
            return {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                responding.set()
                await asyncio.sleep(0.5)  # the hang-up is noticed before the first chunk

        await app(post_scope("/v1/chat/completions", body), receive, send)
        runtime.close()
        xdb.close()
        return runtime

    runtime = asyncio.run(scenario())
    assert not runtime.orchestrator.sessions.lock("s10").locked()
    assert runtime.orchestrator.sessions.get("s10").messages == []


def test_a_streams_last_token_does_not_wait_for_the_disk_but_its_finish_does(  # type: ignore[no-untyped-def]
        config: AHCConfig, vllm_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply is durable before the client sees it finish, and the commit it waits for never holds
    up its last token: every token goes out first, the finish once the rows are committed."""
    body = json.dumps(chat("s11", stream=True)).encode()
    before, after, runtime = stream_past_a_slow_disk(config, vllm_config, tmp_path, monkeypatch,
                                                     post_scope("/v1/chat/completions", body), body)
    sent_before = [json.loads(e.removeprefix("data: ")) for e in "".join(before).split("\n\n") if e]
    sent_after = [e for e in "".join(after).split("\n\n") if e]
    reply = runtime.orchestrator.sessions.get("s11").messages[-1].content
    assert reply and "".join(c["choices"][0]["delta"].get("content") or "" for c in sent_before) == reply
    assert all(c["choices"][0]["finish_reason"] is None for c in sent_before)
    finish = json.loads(sent_after[0].removeprefix("data: "))
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["choices"][0]["delta"] == {}
    assert sent_after[-1] == "data: [DONE]"


def test_a_crawling_disk_loses_no_token_and_keeps_their_order(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                              tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    """16 streams against a writer whose queue holds 16 rows and whose audit commits crawl: every token of
    every reply is recorded, in order, and nothing fails in the background."""
    from concurrent.futures import ThreadPoolExecutor

    from core.config import XDBConfig

    xdb = XDB.open(tmp_path / "xdb", XDBConfig(max_queue_rows=16, batch_rows=4, max_latency_s=0.01,
                                               submit_timeout_s=0.2))
    commit = xdb.writer._audit.commit

    def crawl(prepared):  # type: ignore[no-untyped-def]
        time.sleep(0.02)
        commit(prepared)

    xdb.writer._audit.commit = crawl  # type: ignore[method-assign]
    engine = FakeEngine(vllm_config)
    app, runtime = asyncio.run(ahc_app(config.with_overrides(data_dir=str(tmp_path / "xdb"), **{
        "orchestrator.vram_queue_timeout_s": 60.0}), engine, xdb))

    def stream(i: int) -> int:
        with client.stream("POST", "/v1/chat/completions", json=chat(f"crawl-{i}", stream=True, max_tokens=24,
                                                                     ignore_eos=True)) as response:
            assert response.status_code == 200
            return sum(1 for line in response.iter_lines() if line.startswith("data: {"))

    try:
        with TestClient(app) as client, ThreadPoolExecutor(16) as pool:
            assert all(chunks > 0 for chunks in pool.map(stream, range(16)))
            asyncio.run(asyncio.to_thread(xdb.writer.flush, 60))
            expected = [engine.script[i % len(engine.script)] for i in range(24)]
            for i in range(16):
                rows = xdb.recall(session_id=f"crawl-{i}", event_types=["output"], limit=1000, owner=EVERY)
                in_commit_order = sorted(rows, key=lambda r: r["id"])
                assert [r["token_id"] for r in in_commit_order] == expected
                assert [r["tick"] for r in in_commit_order] == sorted(r["tick"] for r in rows)
    finally:
        runtime.close()
        xdb.close()
    assert runtime.recorder.queue.backlog_rows == 0
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage() or r.levelname == "ERROR"]
