"""The seeds' operating bound on recent state: a row recorded for a reply is queryable (GET
/v1/xdb/recall) within 500 ms of the reply's end. Measured on the shared real server from the moment
the response is read whole (a plain one returned, a stream's last chunk read), polling every 20 ms,
until the reply's output rows and its turn record are all returned."""

from __future__ import annotations

import time
import uuid

import pytest

from bench.servers import recall

pytestmark = pytest.mark.engine

BOUND_S = 0.5
POLL_S = 0.02
REPLIES = 4  # of each kind, plain and streamed


def queryable_after(server, session_id: str, output_tokens: int, ended: float) -> float:
    """Seconds from `ended` until a recall returns the reply's `output_tokens` output rows and its turn
    record; fails once BOUND_S has passed."""
    while True:
        rows = recall(server, session_id=session_id)
        outputs = sum(r["event_type"] == "output" for r in rows)
        turn = any(r["event_type"] == "system" and str(r["content"]).startswith("turn:") for r in rows)
        waited = time.monotonic() - ended
        if outputs >= output_tokens and turn:
            return waited
        assert waited <= BOUND_S, (f"{session_id}: {outputs}/{output_tokens} output rows, turn record "
                                   f"{'in' if turn else 'missing'}, {waited * 1e3:.0f} ms after the reply's end")
        time.sleep(POLL_S)


def ask(session_id: str) -> dict:
    return {"max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Which particle moves right?"}],
            "extra_body": {"context": {"session_id": session_id}}}


def test_a_replys_rows_are_recalled_within_500_ms_of_its_end(server, client, model_name) -> None:
    waits: list[float] = []
    run = uuid.uuid4().hex[:8]
    for i in range(REPLIES):
        session = f"recent-{run}-plain-{i}"
        reply = client.chat.completions.create(model=model_name, **ask(session))
        ended = time.monotonic()
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        waits.append(queryable_after(server, session, reply.usage.completion_tokens, ended))
    for i in range(REPLIES):
        session = f"recent-{run}-stream-{i}"
        tokens = 0
        for chunk in client.chat.completions.create(model=model_name, stream=True,
                                                    stream_options={"include_usage": True}, **ask(session)):
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        ended = time.monotonic()
        assert tokens > 0
        waits.append(queryable_after(server, session, tokens, ended))
    print(f"recent state: a reply's rows queryable {max(waits) * 1e3:.0f} ms at most after its end "
          f"(median {sorted(waits)[len(waits) // 2] * 1e3:.0f} ms, {len(waits)} replies, bound "
          f"{BOUND_S * 1e3:.0f} ms)")
    assert max(waits) <= BOUND_S
