"""XDB: our writer (Arrow batches + audit chain + experience insert) against a raw DuckDB Arrow
insert of the same rows into the same columns, then recall p95 per filter over 10M token rows
(generated directly in DuckDB, as hours of agents would have written them). Recall is timed as the
server answers it (XDB.recall_page, under xdb.recall_deadline_s), and the bench fails when a filter's
p95 passes the design's bound, RECALL_BOUND_MS; it reports how many timed recalls came back partial.

The writer is measured two ways on the same rows: as TokenBatch columns (how a reply's generated
tokens are meant to arrive) and as TimestepRow objects (one Python object a row).

The load is `LOADS` (bench/load.py): `BENCH_XDB_LOAD="smoke"` or e.g. `"write_rows=20000,recall_rows=100000"`:
`write_rows` through each writer, `rounds` alternated rounds of the writers (and of the lake's
backends), `recall_rows` generated for recall, `recall_queries` timed queries a filter, and the DuckLake
backend's `lake_write_rows` and `lake_recall_rows`, `restart_records`, the audit history a start is
timed over (bench/restart.py: XDB's open and its service's start against a whole re-hash),
`storage_tokens`, what bytes a token and a deletion's erasure are measured over (bench/xdb_erase.py),
and `history_rows`, the year-shaped history 1% of whose sessions are erased (bench/xdb_history.py).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from bench.load import DEFAULT, SMOKE, Loads
from bench.restart import restart_figures, synthetic_history
from bench.result import BenchResult
from bench.xdb_erase import storage_figures
from bench.xdb_history import history_figures
from core.config import XDBConfig
from xdb import XDB, TimestepRow
from xdb.concepts import ConceptIndex
from xdb.owner import EVERY
from xdb.rows import TIMESTEP_COLUMNS, TokenBatch, batch_to_arrow
from xdb.schema import MIGRATIONS, TOP_K
from xdb.storage import segments
from xdb.store import default_threads
from xdb.tables import HOT_TIMESTEPS

# The page query reads 100 rows after an id up to 10,000 rows before the end.
MIN_RECALL_ROWS = 20_000
TURN = 64  # tokens a session writes before the next one takes its turn
BATCH = 50_000
SESSIONS = 16
WORDS = ["the", " cat", "ing", " sat", ".", " on", " mat", " A", " moves", " right"]
CONCEPTS = [f"concept-{i}" for i in range(256)]
# The design's operating bound: recall answers within 500 ms (a partial answer at its deadline counts).
RECALL_BOUND_MS = 500.0


@dataclass(frozen=True)
class XDBLoad:
    """The rows each writer takes and recall runs over, locally and in the lake."""

    # 10 batches: the writer is a three-stage pipeline, so a run of 4 batches (200k rows) spent a third
    # of its time filling and draining it rather than measuring its steady rate.
    write_rows: int = 500_000
    rounds: int = 3
    recall_rows: int = 10_000_000
    recall_queries: int = 20
    lake_write_rows: int = 200_000
    lake_recall_rows: int = 1_000_000
    restart_records: int = 10_000_000
    storage_tokens: int = 2_000_000
    # A year-shaped history of ~20 GB on disk (50.6 bytes a row in segments): bench/xdb_history.py.
    history_rows: int = 400_000_000

    def __post_init__(self) -> None:
        if self.recall_rows < MIN_RECALL_ROWS:
            raise ValueError(f"recall_rows must be at least {MIN_RECALL_ROWS:,}")


LOADS = Loads("xdb", {DEFAULT: XDBLoad(),
                      SMOKE: XDBLoad(write_rows=20_000, rounds=1, recall_rows=100_000, recall_queries=3,
                                     lake_write_rows=2000, lake_recall_rows=20_000, restart_records=120_000,
                                     storage_tokens=20_000, history_rows=200_000)})


def token_batches(n: int, chunk: int = 1000, seed: int = 0) -> list[TokenBatch]:
    """n synthetic generated tokens in chunks of `chunk`, the sessions taking turns (as concurrent
    replies would); each token has 10 distinct concepts out of 256 with random values."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS, dtype=object)
    batches, ticks = [], [0] * SESSIONS
    for i, off in enumerate(range(0, n, chunk)):
        m = min(chunk, n - off)
        s = i % SESSIONS
        index = np.argpartition(rng.random((m, len(CONCEPTS))), TOP_K, axis=1)[:, :TOP_K]
        batches.append(TokenBatch(
            f"s{s}", np.arange(ticks[s], ticks[s] + m), words[rng.integers(0, len(WORDS), m)].tolist(),
            rng.integers(0, 32000, m), request_id=f"s{s}-r{ticks[s] // 200}", concept_names=CONCEPTS,
            concept_index=index, concept_values=rng.random((m, TOP_K), dtype=np.float32),
            activation_source="hidden_state", created_at=time.time()))
        ticks[s] += m
    return batches


def as_rows(batch: TokenBatch) -> list[TimestepRow]:
    """The same tokens as TimestepRow objects."""
    return [TimestepRow(batch.session_id, int(tick), batch.event_type, batch.role, content, token_id=int(tid),
                        request_id=batch.request_id,
                        concept_activations={CONCEPTS[j]: float(v) for j, v in zip(index, values)},
                        activation_source=batch.activation_source, created_at=batch.created_at)
            for tick, content, tid, index, values in zip(batch.ticks, batch.contents, batch.token_ids,
                                                           batch.concept_index, batch.concept_values)]


def raw_rows_per_s(batches: list[TokenBatch], work: Path, threads: int | None = None) -> float:
    """The reference: the same rows already in Arrow, inserted one batch per transaction (DuckDB's
    default threads unless `threads`)."""
    concepts, first, tables = ConceptIndex([]), 0, []
    for b in batches:
        tables.append(batch_to_arrow(b, first, concepts)[0])
        first += len(b)
    table = pa.concat_tables(tables).drop_columns(["steering"]).combine_chunks()
    con = duckdb.connect(str(work / "raw.duckdb"))
    if threads is not None:
        con.execute(f"SET threads = {threads}")
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
    return table.num_rows / elapsed


def writer_rows_per_s(parts: list, work: Path) -> float:
    """Ours: parts (TokenBatches, or lists of 1,000 TimestepRows) submitted like the server does, then
    flushed: conversion, the audit chain and both files' commits all inside the timing."""
    xdb = XDB.open(work, XDBConfig(batch_rows=BATCH))
    start = time.perf_counter()
    for part in parts:
        xdb.writer.submit(part)
    xdb.writer.flush()
    elapsed = time.perf_counter() - start
    rows = xdb.writer.rows_written
    xdb.close()
    return rows / elapsed


def generate_rows(data_dir: Path, n: int) -> None:
    """n token rows straight into a new XDB's experience file with DuckDB's own generator: SESSIONS
    sessions taking turns of TURN tokens, 10 distinct concepts of 256 a token with uniform values (a hash
    of the row and slot, so every run recalls over the same file), one row a millisecond up to now; plus
    the concept names, each session's last tick and a tag on a 51-tick range per session. Laid out as the
    storage pass lays a history out: sealed into segments of `xdb.segment_rows`, the rest hot."""
    XDB.open(data_dir).close()  # schema, migrations, audit log
    con = duckdb.connect(str(data_dir / "experience.duckdb"))
    words = ", ".join(f"'{w}'" for w in WORDS)
    con.execute("INSERT INTO concepts SELECT i, 'concept-' || i FROM range(256) t(i)")
    step = XDBConfig().segment_rows
    for start in range(0, n, step):
        con.execute(f"""
            INSERT INTO {HOT_TIMESTEPS}
            SELECT i, 's' || ((i // {TURN}) % {SESSIONS}), (i // {TURN * SESSIONS}) * {TURN} + i % {TURN},
                   'output', 'assistant', [{words}][1 + (hash(i) % {len(WORDS)})::INTEGER],
                   (hash(i * 7) % 32000)::INTEGER,
                   's' || ((i // {TURN}) % {SESSIONS}) || '-r' || (i // {TURN * SESSIONS * 4}),
                   list_transform(range(10), k -> ((i * 37 + k * 26) % 256)::INTEGER)::INTEGER[10],
                   list_transform(range(10), k -> ((hash(i * 10 + k) % 1000003) / 1000003)::FLOAT)::FLOAT[10],
                   'hidden_state',
                   now()::TIMESTAMP - to_milliseconds({n} - i), NULL
            FROM range({start}, {min(start + step, n)}) t(i)""")
        if start + step <= n:
            segments.seal(con)
    con.execute("INSERT INTO session_ticks SELECT session_id, max(tick) FROM timesteps GROUP BY 1")
    con.execute(f"INSERT INTO xdb_meta VALUES ('last_timestep_id', '{n - 1}')")
    con.close()


def p95(times: list[float]) -> float:
    return round(float(np.percentile(times, 95)), 2)


def check_recall_bound(latencies: dict[str, list[float]], bound_ms: float = RECALL_BOUND_MS) -> None:
    """Raise naming every filter whose recall p95 is over `bound_ms`."""
    over = {name: p95(ts) for name, ts in latencies.items() if p95(ts) > bound_ms}
    if over:
        raise AssertionError("xdb bench: recall p95 over the bound of "
                             f"{bound_ms:g} ms: " + ", ".join(f"{name} {ms:g} ms" for name, ms in over.items()))


def recall_latencies_ms(work: Path, rows: int, queries_per_filter: int) -> tuple[dict[str, list[float]],
                                                                                  dict[str, int]]:
    """Each filter's timed recall pages (ms) and how many of them came back partial."""
    generate_rows(work / "recall", rows)
    xdb = XDB.open(work / "recall", XDBConfig(batch_rows=100_000, max_queue_rows=2_000_000))
    for s in range(SESSIONS):
        xdb.tag("interesting", session_id=f"s{s}", tick_range=(1000 * s, 1000 * s + 50), owner=EVERY)
    last_tick = rows // SESSIONS - TURN
    span_ms = rows  # one row a millisecond
    now = time.time()

    def at(fraction: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - span_ms / 1000 * (1 - fraction)))

    queries = {
        "session_tick": lambda i: dict(session_id=f"s{i % 16}", tick_from=(i * 99_991) % last_tick,
                                       tick_to=(i * 99_991) % last_tick + 100),
        "tag": lambda i: dict(tags=["interesting"], limit=100),
        "concept": lambda i: dict(concept=f"concept-{i % 256}", min_activation=0.9, limit=100),
        "concept_band": lambda i: dict(concept=f"concept-{i % 256}", min_activation=0.4, max_activation=0.45,
                                       session_id=f"s{i % 16}", limit=100),
        "text": lambda i: dict(text=" moves", session_id=f"s{i % 16}", limit=100),
        "time_range": lambda i: dict(time_from=at(i / 20), time_to=at(i / 20 + 0.01), limit=100),
        "page": lambda i: dict(session_id=f"s{i % 16}", after_id=(i * 499_979) % (rows - 10_000), limit=100),
    }
    out: dict[str, list[float]] = {}
    partial: dict[str, int] = {}
    for name, make in queries.items():
        xdb.recall_page(make(0), owner=EVERY)  # warm: the first query of a kind reads its columns from disk
        times, partial[name] = [], 0
        for i in range(queries_per_filter):
            start = time.perf_counter()
            page = xdb.recall_page(make(i), owner=EVERY)
            times.append((time.perf_counter() - start) * 1000)
            partial[name] += page["partial"]
            assert page["data"] or page["partial"], name
        out[name] = times
    xdb.close()
    return out, partial


def run(load: XDBLoad) -> BenchResult:
    work = Path(tempfile.mkdtemp(prefix="ahc-bench-xdb-"))
    try:
        batches = token_batches(load.write_rows)
        rows = [as_rows(b) for b in batches]
        # Interleave the sides and keep each one's best, so machine noise hits them alike.
        raw, raw_1, columns, objects = [], [], [], []
        for i in range(load.rounds):
            raw.append(raw_rows_per_s(batches, _fresh(work, f"raw{i}")))
            raw_1.append(raw_rows_per_s(batches, _fresh(work, f"raw1-{i}"), threads=1))
            columns.append(writer_rows_per_s(batches, _fresh(work, f"cols{i}")))
            objects.append(writer_rows_per_s(rows, _fresh(work, f"rows{i}")))
        latencies, partial = recall_latencies_ms(work, load.recall_rows, load.recall_queries)
        check_recall_bound(latencies)
        synthetic_history(work / "history", load.restart_records)
        restart = restart_figures(work / "history")
        storage = storage_figures(work, load.storage_tokens)
        shutil.rmtree(work, ignore_errors=True)  # the history takes the disk's room
        work.mkdir()
        history = history_figures(work, load.history_rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    every = [t for ts in latencies.values() for t in ts]
    figures: dict[str, float | int] = {
        "writer_rows_per_s": round(max(columns)), "writer_timesteprow_rows_per_s": round(max(objects)),
        "raw_duckdb_rows_per_s": round(max(raw)), "raw_duckdb_1thread_rows_per_s": round(max(raw_1)),
        "recall_p95_ms": p95(every), "rows": load.recall_rows,
        **{f"recall_{name}_p95_ms": p95(ts) for name, ts in latencies.items()},
        "recall_partial_queries": sum(partial.values()),
        **{f"recall_{name}_partial_queries": n for name, n in partial.items()},
        "restart_records": load.restart_records, "restart_open_s": round(restart["open_s"], 3),
        "restart_service_s": round(restart["service_s"], 3),
        "restart_full_verify_s": round(restart["full_verify_s"], 3),
        "storage_tokens": load.storage_tokens, **storage, **history,
    }
    ratios = {"writer_over_raw": round(max(columns) / max(raw), 3),
              "writer_timesteprow_over_raw": round(max(objects) / max(raw), 3),
              "writer_over_raw_1thread": round(max(columns) / max(raw_1), 3),
              "full_verify_over_restart_open": round(restart["full_verify_s"] / restart["open_s"], 1),
              "history_commit_wait_over_idle": round(history["history_commit_wait_p99_ms"]
                                                     / max(history["history_idle_commit_wait_p99_ms"], 0.1), 2)}
    lake_notes = lake_figures(figures, ratios, load)
    return BenchResult("xdb", figures, ratios,
                       notes={**lake_notes, "writer": "TokenBatch columns → Arrow → audit chain (SHA-256 per row) and "
                                        "experience insert, overlapped; the experience commits after the audit",
                              "writer_timesteprow": "the same rows as TimestepRow objects, 1,000 a submit",
                              "raw": "the same rows pre-converted to Arrow, inserted into the same columns "
                                     "(DuckDB's default threads; raw_1thread: one thread, as XDB runs the "
                                     f"experience file here: xdb.store.default_threads() = {default_threads()})",
                              "write_rows": str(load.write_rows),
                              "recall": f"{load.recall_rows:,} token rows generated in DuckDB ({SESSIONS} sessions, "
                                        f"10 of 256 concepts a token); {load.recall_queries} queries a filter after "
                                        "one warm-up, each a page as the server answers it (recall_page, "
                                        f"deadline xdb.recall_deadline_s = {XDBConfig().recall_deadline_s} s); "
                                        "goal p95 <= 50 ms a filter; the bench fails past "
                                        f"{RECALL_BOUND_MS:g} ms; recall_partial_queries: pages cut short by "
                                        "the deadline",
                              "storage": f"{load.storage_tokens:,} generated tokens through the real writer "
                                         "(bench/audit_bytes.py): bytes_per_token on disk with the audit, "
                                         "audit_bytes_share; erase_s: one session deleted and its text gone "
                                         "from every file under the data dir (the deletion, then the XDB "
                                         "service's whole-file vacuum) while a stream records a row every "
                                         "50 ms: its commit wait p99 during the erasure against idle "
                                         "(bench/xdb_erase.py); goals <= 80 bytes a token, share <= 50%, "
                                         "erase commit wait <= 2x idle",
                              "history": f"{load.history_rows:,} timesteps over a year in segments "
                                         "(bench/xdb_history.py), 1% of sessions deleted while 2,000 rows/s "
                                         "record: history_erase_s until their text is in no file, the commit "
                                         "wait p99 and rows recorded a second during it against idle, restart "
                                         "and recall p95 over the history; goals: erase within "
                                         "xdb.erase_within_s, commit wait <= 2x idle",
                              "restart": f"{load.restart_records:,} audit records (commits of 50,000); open: the "
                                         "tail verified, the rest re-hashed in the background; full_verify: what "
                                         "a start re-hashed before; goal <= 30 s at 100M, flat in the history"})


def _fresh(work: Path, name: str) -> Path:
    path = work / name
    path.mkdir(parents=True)
    return path


def lake_figures(figures: dict[str, float | int], ratios: dict[str, float], load: XDBLoad) -> dict[str, str]:
    """The DuckLake backend, measured in the same run (bench/lake.py): the writer's rows/s with the
    duckdb and the ducklake backends alternated, the shipper's rows/s into the lake, and lake recall at
    `load.lake_recall_rows` rows. Needs PostgreSQL (Debian's `postgresql`); without it the note says so."""
    from bench import lake as lake_bench
    from server.cluster.catalog import postgres_available

    if not postgres_available():
        return {"lake": "not measured: PostgreSQL is not installed (Debian package `postgresql`)"}
    lake = lake_bench.run(rows=load.lake_write_rows, recall_rows=load.lake_recall_rows, repeats=load.recall_queries,
                          ingest_rounds=load.rounds, log=lambda _: None)
    ingest = lake["ingest_rows_per_s"]
    recall_p95 = {name: ms["p95_ms"] for name, ms in lake["recall_ms"].items()}
    figures.update({"duckdb_backend_writer_rows_per_s": ingest["duckdb"],
                    "ducklake_backend_writer_rows_per_s": ingest["ducklake"],
                    "lake_ship_rows_per_s": lake["ship_rows_per_s"], "lake_rows": lake["recall_lake_rows"],
                    "lake_recall_p95_ms": max(recall_p95.values()),
                    **{f"lake_recall_{name}_p95_ms": p95 for name, p95 in recall_p95.items()}})
    ratios["ducklake_over_duckdb_writer"] = round(ingest["ducklake"] / ingest["duckdb"], 3)
    return {"lake": f"{load.lake_write_rows:,} token rows through the writer per backend (median of alternated "
                    f"rounds, the shipper running alongside with ducklake); a backlog shipped by ship_now(); "
                    f"recall over {lake['recall_lake_rows']:,} rows generated in the lake (p95 per filter, "
                    "lake_recall_p95_ms the slowest filter's)"}
