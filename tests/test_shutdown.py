"""SIGTERM: in-flight requests end cleanly, engine processes stop, the port can be served again."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from bench.servers import start_server
from server.cluster.server_process import free_port

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_sigterm_drains_and_a_second_server_takes_the_port(tmp_path) -> None:
    port = free_port()
    first = start_server(tmp_path / "xdb1", port=port, api_key=None)
    children = psutil.Process(first.process.pid).children(recursive=True)
    client = first.client()
    model = client.models.list().data[0].id
    outcome: dict = {}

    def stream() -> None:
        try:
            chunks = list(client.chat.completions.create(
                model=model, stream=True, stream_options={"include_usage": True}, max_tokens=300, temperature=0,
                extra_body={"ignore_eos": True, "min_tokens": 300},
                messages=[{"role": "user", "content": "Describe the universe at length"}]))
            outcome["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            outcome["tokens"] = chunks[-1].usage.completion_tokens
        except Exception as exc:  # the assertion below reports it
            outcome["error"] = repr(exc)

    worker = threading.Thread(target=stream)
    worker.start()
    time.sleep(1.0)  # the request is in flight
    assert first.stop() == 0, first.log_tail()
    worker.join(60)
    assert "error" not in outcome, outcome
    assert outcome["finish"] == "length" and outcome["tokens"] == 300  # finished, not cut off
    time.sleep(1)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"engine processes left running: {alive}"

    second = start_server(tmp_path / "xdb2", port=port, api_key=None)
    try:
        reply = second.client().chat.completions.create(model=model, max_tokens=2,
                                                        messages=[{"role": "user", "content": "hi"}])
        assert reply.usage.completion_tokens > 0
    finally:
        assert second.stop() == 0
