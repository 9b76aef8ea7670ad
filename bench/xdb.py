"""XDB: our writer (Arrow batches + audit chain + experience insert) against a raw DuckDB Arrow
insert of the same rows into the same columns, then recall p95 over 1M rows."""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

from bench.result import BenchResult
from xdb import XDB, TimestepRow
from xdb.concepts import ConceptIndex
from xdb.rows import TIMESTEP_COLUMNS, rows_to_arrow
from xdb.schema import MIGRATIONS

WRITE_ROWS = 200_000
RECALL_ROWS = 1_000_000
BATCH = 50_000
WORDS = ["the", " cat", "ing", " sat", ".", " on", " mat", " A", " moves", " right"]


def token_rows(n: int, sessions: int = 16, start: int = 0) -> list[TimestepRow]:
    rng = random.Random(start)
    concepts = [f"concept-{i}" for i in range(256)]
    return [TimestepRow(f"s{i % sessions}", i // sessions, "output", "assistant", rng.choice(WORDS),
                        token_id=rng.randrange(32000), request_id=f"s{i % sessions}-r{i // (sessions * 200)}",
                        concept_activations={c: rng.random() for c in rng.sample(concepts, 10)},
                        activation_source="hidden_state") for i in range(start, start + n)]


def raw_rows_per_s(rows: list[TimestepRow], work: Path) -> float:
    """The reference: the same rows already in Arrow, inserted one batch per transaction."""
    table, _ = rows_to_arrow(rows, 0, ConceptIndex([]))
    table = table.drop_columns(["steering"])
    con = duckdb.connect(str(work / "raw.duckdb"))
    timesteps_ddl = next(sql for sql in MIGRATIONS[0][1] if "CREATE TABLE timesteps" in sql)
    con.execute(timesteps_ddl)
    cols = ", ".join(TIMESTEP_COLUMNS)
    start = time.perf_counter()
    for off in range(0, table.num_rows, BATCH):
        con.register("batch", table.slice(off, BATCH))
        con.execute("BEGIN")
        con.execute(f"INSERT INTO timesteps ({cols}) SELECT {cols} FROM batch")
        con.execute("COMMIT")
    elapsed = time.perf_counter() - start
    con.close()
    return len(rows) / elapsed


def writer_rows_per_s(rows: list[TimestepRow], work: Path) -> float:
    """Ours: TimestepRow objects submitted like the server does (1,000 at a time), then flushed."""
    xdb = XDB.open(work / "ours", batch_rows=BATCH)
    start = time.perf_counter()
    for off in range(0, len(rows), 1000):
        xdb.writer.submit(rows[off:off + 1000])
    xdb.writer.flush()
    elapsed = time.perf_counter() - start
    xdb.close()
    return len(rows) / elapsed


def recall_latencies_ms(work: Path) -> dict[str, list[float]]:
    xdb = XDB.open(work / "recall", batch_rows=100_000, max_queue_rows=2_000_000)
    for off in range(0, RECALL_ROWS, 100_000):
        xdb.writer.submit(token_rows(min(100_000, RECALL_ROWS - off), start=off))
    xdb.writer.flush()
    for s in range(16):
        xdb.tag("interesting", session_id=f"s{s}", tick_range=(1000 * s, 1000 * s + 50))
    queries = {
        "session_tick": lambda i: dict(session_id=f"s{i % 16}", tick_from=(i * 997) % 60000, tick_to=(i * 997) % 60000 + 100),
        "tag": lambda i: dict(tags=["interesting"], limit=100),
        "concept": lambda i: dict(concept=f"concept-{i % 256}", min_activation=0.9, limit=100),
        "text": lambda i: dict(text=" moves", session_id=f"s{i % 16}", limit=100),
    }
    out: dict[str, list[float]] = {}
    for name, make in queries.items():
        times = []
        for i in range(20):
            start = time.perf_counter()
            rows = xdb.recall(make(i))
            times.append((time.perf_counter() - start) * 1000)
            assert rows, name
        out[name] = times
    xdb.close()
    return out


def run() -> BenchResult:
    work = Path(tempfile.mkdtemp(prefix="ahc-bench-xdb-"))
    try:
        rows = token_rows(WRITE_ROWS)
        # Interleave the two sides and keep each one's best, so machine noise hits both alike.
        raw, ours = [], []
        for i in range(2):
            (work / f"r{i}").mkdir()
            raw.append(raw_rows_per_s(rows, work / f"r{i}"))
            ours.append(writer_rows_per_s(rows, work / f"r{i}"))
        latencies = recall_latencies_ms(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    every = [t for ts in latencies.values() for t in ts]
    figures: dict[str, float | int] = {
        "writer_rows_per_s": round(max(ours)), "raw_duckdb_rows_per_s": round(max(raw)),
        "recall_p95_ms": round(float(np.percentile(every, 95)), 2), "rows": RECALL_ROWS,
        **{f"recall_{name}_p95_ms": round(float(np.percentile(ts, 95)), 2) for name, ts in latencies.items()},
    }
    return BenchResult("xdb", figures, {"writer_over_raw": round(max(ours) / max(raw), 3)},
                       notes={"writer": "TimestepRow → Arrow → audit chain (SHA-256 per row) → experience insert",
                              "raw": "the same rows pre-converted to Arrow, inserted into the same columns",
                              "write_rows": str(WRITE_ROWS)})
