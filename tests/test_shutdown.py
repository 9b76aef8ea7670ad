"""SIGTERM: in-flight requests end cleanly, engine processes stop, the port can be served again."""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil
import pytest

from bench.servers import start_server
from server.cluster.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def stream_in_background(server: ServerProcess, tokens: int) -> tuple[threading.Thread, dict[str, Any]]:
    """A streamed completion of exactly `tokens` tokens, started: its finish reason and token count, or
    its error, land in the dict."""
    client = server.client()
    model = client.models.list().data[0].id
    outcome: dict[str, Any] = {}

    def stream() -> None:
        try:
            chunks = list(client.chat.completions.create(
                model=model, stream=True, stream_options={"include_usage": True}, max_tokens=tokens, temperature=0,
                extra_body={"ignore_eos": True, "min_tokens": tokens},
                messages=[{"role": "user", "content": "Describe the universe at length"}]))
            outcome["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            outcome["tokens"] = chunks[-1].usage.completion_tokens
        except Exception as exc:  # the assertions report it
            outcome["error"] = repr(exc)

    worker = threading.Thread(target=stream)
    worker.start()
    time.sleep(1.0)  # the request is in flight
    return worker, outcome


def test_sigterm_drains_and_a_second_server_takes_the_port(tmp_path) -> None:
    port = free_port()
    # A drain long enough for the whole reply however busy the machine is.
    first = start_server(tmp_path / "xdb1", port=port, api_key=None, env={"AHC_ENGINE__SHUTDOWN_TIMEOUT": "300"})
    children = psutil.Process(first.process.pid).children(recursive=True)
    worker, outcome = stream_in_background(first, 300)
    assert first.stop(timeout=330) == 0, first.log_tail()
    worker.join(60)
    assert "error" not in outcome, outcome
    assert outcome["finish"] == "length" and outcome["tokens"] == 300  # finished, not cut off
    time.sleep(1)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"engine processes left running: {alive}"

    # A drain that runs out: the reply is cut off, and the server still exits, cleanly and soon.
    second = start_server(tmp_path / "xdb2", port=port, api_key=None, env={"AHC_ENGINE__SHUTDOWN_TIMEOUT": "1"})
    try:
        reply = second.client().chat.completions.create(model=second.client().models.list().data[0].id, max_tokens=2,
                                                        messages=[{"role": "user", "content": "hi"}])
        assert reply.usage.completion_tokens > 0
        worker, outcome = stream_in_background(second, 1500)
        stopping = time.monotonic()
    finally:
        assert second.stop() == 0, second.log_tail()
    assert time.monotonic() - stopping < 30, second.log_tail()
    worker.join(60)
    assert not worker.is_alive() and outcome.get("tokens", 0) < 1500, outcome
