"""How long a reply's end waits for XDB's commit, on the XDB service alone (RemoteXDB: the real service
process, no server around it): STREAMS sessions record 32-token batches with top-10 activations for
~0.85 s, then each its last chunk and a turn row, then one flush, as a wave of replies ending together
asks for; twelve waves. Prints the service's CPU a row and each flush's wait.

    .venv/bin/python -m bench.xdb_flush_wait STREAMS [BATCH_ROWS]

The wait is the batch in flight when the flush comes (xdb.batch_rows bounds it), then the flush's own.
The seeds' operating bound is a reply's rows queryable within 500 ms of its end (asserted on a real
server by tests/test_recent_state.py): the last line says whether the waits' p99 is within it.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import numpy as np
import psutil

from core.config import XDBConfig
from xdb.rows import TimestepRow, TokenBatch
from xdb.service.remote_xdb import RemoteXDB

CONCEPTS = tuple(f"c{i}" for i in range(200))
BOUND_MS = 500.0  # a reply's rows queryable within this of its end
WAVES, STEPS, CHUNK, STEP_S = 12, 7, 32, 0.12


def token_batch(rng: np.random.Generator, session: str, start: int, n: int) -> TokenBatch:
    index = np.stack([rng.choice(len(CONCEPTS), 10, replace=False) for _ in range(n)])
    return TokenBatch(session, range(start, start + n), [f"t{i}" for i in range(n)], token_ids=list(range(n)),
                      request_id="r", concept_names=CONCEPTS, concept_index=index,
                      concept_values=rng.random((n, 10)).astype(np.float32))


def waves(xdb: RemoteXDB, streams: int) -> tuple[list[float], int]:
    """Each wave's flush wait (ms), and the rows recorded."""
    assert xdb.writer is not None
    rng = np.random.default_rng(0)
    tick, waits = 0, []
    for _ in range(WAVES):
        for _ in range(STEPS):  # ~a second of every stream's tokens, a chunk per stream per step
            for s in range(streams):
                xdb.writer.submit(token_batch(rng, f"s{s}", tick, CHUNK))
            tick += CHUNK
            time.sleep(STEP_S)
        for s in range(streams):  # the replies end: their last tokens and turn records
            xdb.writer.submit(token_batch(rng, f"s{s}", tick, CHUNK // 2))
            xdb.writer.submit([TimestepRow(session_id=f"s{s}", tick=tick + CHUNK // 2, event_type="system",
                                           content="turn", metadata={"turn": {}})])
        tick += CHUNK // 2 + 1
        started = time.perf_counter()
        xdb.writer.flush()
        waits.append((time.perf_counter() - started) * 1e3)
    return waits, tick * streams


def main(streams: int, batch_rows: int | None) -> None:
    config = XDBConfig(**({"batch_rows": batch_rows} if batch_rows else {}))
    with tempfile.TemporaryDirectory() as data_dir:
        xdb = RemoteXDB(data_dir, config)
        assert xdb.writer is not None
        for s in range(streams):
            xdb.start_session(f"s{s}")
        service = psutil.Process(xdb.writer.process.process.pid)
        before = sum(service.cpu_times()[:2])
        waits, rows = waves(xdb, streams)
        cpu = sum(service.cpu_times()[:2]) - before
        xdb.close()
    print(f"{streams} streams, batch_rows {config.batch_rows}: service {cpu / rows * 1e6:.1f} µs CPU a row; "
          f"flush wait median {statistics.median(waits):.0f} ms, each: {[round(w) for w in waits]}")
    p99 = float(np.percentile(waits, 99))
    print(f"flush wait p99 {p99:.0f} ms: {'within' if p99 <= BOUND_MS else 'OVER'} the {BOUND_MS:.0f} ms bound "
          f"on recent state")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
