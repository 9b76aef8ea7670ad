"""Measuring the DuckLake backend: what shipping costs the writer, how fast the shipper fills the lake,
and how recall over the lake answers at scale. `run(...)` returns the figures; `ahc bench xdb` runs it
beside the duckdb backend (its load's `lake_*` fields). Without a catalog a throwaway PostgreSQL
(LocalPostgres) is started in a temporary directory.

    ingest_rows_per_s      {duckdb, ducklake}: token rows through XDB's writer (TokenBatch, 32 rows
                           a part as the server's recorder sends them), submit to flushed; with
                           ducklake the shipper runs alongside at its interval. The median of
                           `ingest_rounds` rounds, the backends alternated
    ducklake_catch_up      per round: what the shipper had left when the writer was done, and how long
                           shipping it took
    ship_rows_per_s        a backlog of `rows` timesteps (and their audit records) shipped by
                           `ship_now()` in `ship_batch_rows` transactions: timestep rows a second
    recall_ms              lake recall over `recall_rows` rows generated in the lake with SQL (4
                           replicas, 1,000 sessions, `recall_files` data files): p50 / p95 per filter
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from core.config import LakeConfig, XDBConfig
from server.cluster.catalog import LocalPostgres
from xdb.lake.lake import Lake
from xdb.owner import EVERY
from xdb.rows import TokenBatch
from xdb.store import XDB

PART_ROWS = 32
CONCEPTS = [f"concept.{i}" for i in range(64)]


def _ingest(data_dir: Path, config: XDBConfig, rows: int) -> tuple[float, XDB]:
    """Rows a second from the first submit until all are committed locally; the XDB stays open."""
    xdb = XDB.open(data_dir, config)
    rng = np.random.default_rng(0)
    parts = []
    for start in range(0, rows, PART_ROWS):
        n = min(PART_ROWS, rows - start)
        session = f"bench-{(start // PART_ROWS) % 64}"
        index = np.argsort(rng.random((n, len(CONCEPTS))), axis=1)[:, :10].astype(np.int32)  # 10 distinct
        parts.append((session, n, index, rng.random((n, 10), dtype=np.float32)))
    writer = xdb.writer
    assert writer is not None
    began = time.perf_counter()
    for session, n, index, values in parts:
        ticks = xdb.next_ticks(session, n)
        writer.submit(TokenBatch(session, ticks, [" tok"] * n, token_ids=list(range(n)), request_id=session,
                                 concept_names=CONCEPTS, concept_index=index, concept_values=values))
    writer.flush()
    return rows / (time.perf_counter() - began), xdb


def _percentiles(samples: list[float]) -> dict[str, float]:
    p50, p95 = np.percentile(samples, [50, 95])
    return {"p50_ms": round(float(p50) * 1000, 2), "p95_ms": round(float(p95) * 1000, 2)}


def _generate(lake: Lake, rows: int, files: int) -> None:
    """`rows` timesteps of 4 replicas straight into the lake (SQL, `files` inserts), with concepts and tags."""
    a = lake.alias
    with lake.cursor() as cur:
        for r in range(4):
            cur.execute(f"INSERT INTO {a}.concepts SELECT 'gen-{r}', i, 'concept.' || ((i + {r}) % 64) "
                        "FROM range(64) t(i)")
            cur.execute(f"INSERT INTO {a}.tags (replica, id, name, tag_type, created_at, created_by, shipped_at, "
                        f"row_hash) VALUES ('gen-{r}', 1, 'marked', 'custom', now(), 'bench', now(), 0)")
            cur.execute(f"INSERT INTO {a}.tag_applications (replica, id, tag_id, session_id, target_type, range_start, "
                        "range_end, confidence, source, created_at) SELECT 'gen-' || (i % 4), i, 1, 's' || (i % 1000), "
                        "'range', 10, 20, 1.0, 'manual', now() FROM range(40) t(i) WHERE i % 4 = " + str(r))
        step = -(-rows // files)
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            cur.execute(f"""INSERT INTO {a}.timesteps
                SELECT 'gen-' || (i % 4), i // 4, 's' || ((i // 32) % 1000), i // 32000 * 32 + i % 32,
                       CASE WHEN i % 100 = 0 THEN 'input' ELSE 'output' END, 'assistant',
                       'token ' || (i % 5000), i % 50000, 'req-' || (i // 32),
                       [((i * 7 + j * 13) % 64)::INTEGER FOR j IN range(10)],
                       [(((i * 31 + j * 17) % 1000) / 1000.0)::FLOAT FOR j IN range(10)],
                       'hidden_state', TIMESTAMP '2026-01-01' + INTERVAL (i // 100) SECOND, NULL
                FROM range({lo}, {hi}) t(i)""")


def _recall(lake: Lake, repeats: int) -> dict[str, dict[str, float]]:
    filters: dict[str, dict[str, Any]] = {
        "session": {"session_id": "s123"},
        "session_ticks": {"session_id": "s123", "tick_from": 100, "tick_to": 400},
        "event_types": {"event_types": ["input"], "limit": 100},
        "text": {"text": "token 4242", "limit": 100},
        "concept": {"concept": "concept.7", "min_activation": 0.9, "limit": 100},
        "session_concept": {"session_id": "s77", "concept": "concept.7", "min_activation": 0.5},
        "tags": {"tags": ["marked"], "limit": 100},
    }
    out = {}
    for name, f in filters.items():
        lake.recall(f, owner=EVERY)  # warm the catalog's metadata
        samples = []
        for _ in range(repeats):
            began = time.perf_counter()
            lake.recall(f, owner=EVERY)
            samples.append(time.perf_counter() - began)
        out[name] = _percentiles(samples)
    return out


def run(rows: int = 200_000, recall_rows: int = 1_000_000, *, catalog: str | None = None,
        data_path: Path | None = None, recall_files: int = 10, repeats: int = 20, ingest_rounds: int = 3,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ahc-lake-bench-"))
    work.chmod(0o755)  # as root, the throwaway PostgreSQL runs as `postgres` under it
    pg = None
    try:
        if catalog is None:
            pg = LocalPostgres(work / "pg").start()
            catalog = pg.dsn
        lake_config = LakeConfig(catalog=catalog, data_path=str(data_path or work / "lake"), replica_id="bench-a")
        result: dict[str, Any] = {"rows": rows, "recall_rows": recall_rows}

        rates: dict[str, list[float]] = {"duckdb": [], "ducklake": []}
        catch_up = []
        for rnd in range(ingest_rounds):  # alternated, so both see the same machine
            log(f"ingest {rows} rows, backend duckdb (round {rnd + 1})")
            rate, plain = _ingest(work / f"duckdb-{rnd}", XDBConfig(), rows)
            plain.close()
            rates["duckdb"].append(rate)
            log(f"ingest {rows} rows, backend ducklake (round {rnd + 1})")
            replica = lake_config.model_copy(update={"replica_id": f"bench-a{rnd}"})
            rate, lake_xdb = _ingest(work / f"ducklake-{rnd}", XDBConfig(backend="ducklake", lake=replica), rows)
            try:
                assert lake_xdb.lake is not None
                began = time.perf_counter()
                left = lake_xdb.lake.ship_now()  # what the shipper had not caught up with when the writer was done
                catch_up.append({"seconds": round(time.perf_counter() - began, 2), "rows_left": left})
            finally:
                lake_xdb.close()
            rates["ducklake"].append(rate)
        result["ingest_rows_per_s"] = {k: round(statistics.median(v)) for k, v in rates.items()}
        result["ingest_rows_per_s_each"] = {k: [round(x) for x in v] for k, v in rates.items()}
        result["ducklake_catch_up"] = catch_up

        log(f"ship a backlog of {rows} rows")
        paused = lake_config.model_copy(update={"replica_id": "bench-b", "ship_interval_s": 3600.0})
        _, backlog = _ingest(work / "backlog", XDBConfig(backend="ducklake", lake=paused), rows)
        try:
            assert backlog.lake is not None
            began = time.perf_counter()
            shipped = backlog.lake.ship_now()
            elapsed = time.perf_counter() - began
        finally:
            backlog.close()
        result["ship_rows_per_s"] = round(shipped.get("timesteps", 0) / elapsed)
        result["ship_seconds"] = round(elapsed, 2)
        result["ship_batch_rows"] = paused.ship_batch_rows

        if not recall_rows:
            return result
        log(f"generate {recall_rows} rows in the lake, then recall")
        # A lake of their own when the catalog is ours; else added to the given lake (its rows counted).
        recall_lake = lake_config.model_copy(update={"replica_id": "bench-reader"})
        if pg is not None:
            recall_lake = recall_lake.model_copy(update={"catalog": pg.create_database("recall"),
                                                         "data_path": str(work / "recall-lake")})
        reader = Lake.open(recall_lake)
        try:
            _generate(reader, recall_rows, recall_files)
            with reader.cursor() as cur:
                found = cur.execute(f"SELECT count(*) FROM {reader.alias}.timesteps").fetchone()
            result["recall_lake_rows"] = int(found[0]) if found else 0
            result["recall_files"] = recall_files
            result["recall_ms"] = _recall(reader, repeats)
        finally:
            reader.close()
        return result
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)

