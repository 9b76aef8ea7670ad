"""The recorder's token streams without an engine: replies that start together turn their chunks into
rows in different engine steps, and every token is still recorded once, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from server.recording.recorder import Recorder, TokenStream
from xdb import XDB
from xdb.owner import EVERY
from xdb.rows import TimestepRow, TokenBatch

STREAMS = 64
STEPS = 3 * TokenStream.CHUNK + 5  # ends between two chunks: the rest goes out when the reply finishes


def test_streams_started_together_spread_their_chunks_over_the_steps(
        tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        recorder = Recorder(xdb, tokenizer)
        submitted: list[TokenBatch] = []
        submit = recorder.submit

        def spy(rows: list[TimestepRow] | TokenBatch) -> None:
            assert isinstance(rows, TokenBatch)
            submitted.append(rows)
            submit(rows)

        monkeypatch.setattr(recorder, "submit", spy)
        streams = [recorder.token_stream(f"s{i}", f"r{i}") for i in range(STREAMS)]
        per_step = []
        for step in range(STEPS):  # one token for every stream each engine step, as in a decoding batch
            before = len(submitted)
            for stream in streams:
                stream.add([100 + step])
            per_step.append(len(submitted) - before)
        # In lockstep every stream would cut a chunk at the same step: 64 at once, nothing in between.
        assert max(per_step) <= STREAMS // TokenStream.CHUNK
        assert sum(per_step) >= 3 * STREAMS

        async def finish() -> None:
            for stream in streams:
                stream.finish()

        asyncio.run(finish())
        xdb.writer.flush()
        for i in (0, 1, STREAMS - 1):
            rows = xdb.recall(session_id=f"s{i}", limit=STEPS, owner=EVERY)
            assert [r["token_id"] for r in rows] == [100 + step for step in range(STEPS)]
            assert [r["tick"] for r in rows] == list(range(STEPS))
