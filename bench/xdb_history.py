"""What `ahc bench xdb` measures of a year-shaped history: `history_rows` timesteps over a year, as
retention-free recording lays them out (sealed and merged into segments of SEGMENT_ROWS), then 1% of its
sessions deleted while a fleet of streams records.

The history is generated straight into segments with DuckDB's own generator (xdb/storage/segments.py
`add`; no audit log: the audit is bounded by retention, and its bytes are bench/audit_bytes.py's): a
generation of CONCURRENT sessions takes turns of TURN tokens for TURNS turns, then the next generation
starts, so a session's rows span ~half a million ids and a few days, and every session's first token of a
turn carries a note naming it (`note-h<n>`), the text whose erasure is checked.

    history_bytes                 the segments' bytes on disk (and history_bytes_per_row)
    history_restart_s             the XDB service from spawn to its first recall over the history
    history_recall_p95_ms         a session's tick range, its text, and a concept over the history
    history_erase_s               1% of sessions deleted, then `vacuum` (the erase pass: their segments
                                  rewritten, experience.duckdb copied): until their text is in no file
    history_erase_held_s          of it, the time recording and every call waited (the last copy)
    history_commit_wait_p99_ms    a stream committing a row every 50 ms: p99 during the erase (…_idle_…
                                  before it)
    history_recording_rows_per_s  a fleet recording FLEET_ROWS_S rows a second: what it committed a
                                  second during the erase (…_idle_… before it)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import numpy as np

from bench.xdb_erase import IDLE_S, CommitWaits
from core.config import XDBConfig
from xdb import XDB, TimestepRow
from xdb.owner import EVERY
from xdb.schema import EXPERIENCE_FILE
from xdb.service.remote_xdb import RemoteXDB
from xdb.storage import segments

TURN, CONCURRENT, TURNS = 64, 16, 500  # a session: 32,000 tokens in a generation of 16
SEGMENT_ROWS = 16_000_000  # a sealed segment merged twice (xdb.segment_rows 1M, segments.MERGE_FAN 4)
WORDS = ["the", " cat", "ing", " sat", ".", " on", " mat", " A", " moves", " right"]
YEAR_US = 365 * 86_400 * 1_000_000
DELETED_SHARE = 100  # every 100th session is deleted: 1%
FLEET_ROWS_S = 2_000  # the recording fleet: 20 streams of 100 tokens a second
RECALL_QUERIES = 10


def session_of(i: str) -> str:
    generation, offset = f"({i} // {TURN * CONCURRENT * TURNS})", f"({i} % {TURN * CONCURRENT * TURNS})"
    return f"({generation} * {CONCURRENT} + ({offset} // {TURN}) % {CONCURRENT})"


def rows_query(start: int, end: int) -> str:
    """Timesteps `start`..`end` of the history, in the timesteps view's columns."""
    words = ", ".join(f"'{w}'" for w in WORDS)
    session = session_of("i")
    offset = f"(i % {TURN * CONCURRENT * TURNS})"
    return f"""SELECT i AS id, 'h' || {session} AS session_id,
        ({offset} // {TURN * CONCURRENT}) * {TURN} + i % {TURN} AS tick, 'output' AS event_type,
        'assistant' AS role,
        CASE WHEN i % {TURN} = 0 THEN 'note-h' || {session} || ' ' ELSE '' END
            || [{words}][1 + (hash(i) % {len(WORDS)})::INTEGER] AS content,
        (hash(i * 7) % 32000)::INTEGER AS token_id, 'h' || {session} || '-r' || ({offset} // {TURN * CONCURRENT * 8})
            AS request_id,
        list_transform(range(10), k -> ((i * 37 + k * 26) % 256)::INTEGER)::INTEGER[10] AS concept_ids,
        list_transform(range(10), k -> ((hash(i * 10 + k) % 1000003) / 1000003)::FLOAT)::FLOAT[10]
            AS concept_values,
        'hidden_state' AS activation_source,
        TIMESTAMP '2025-11-29' + to_microseconds((i * ({YEAR_US} / {max(end, 1)}))::BIGINT) AS created_at,
        NULL::VARCHAR AS metadata
        FROM range({start}, {end}) t(i)"""


def generate(data_dir: Path, rows: int, segment_rows: int) -> float:
    """The history written as segments; returns the seconds it took."""
    started = time.monotonic()
    XDB.open(data_dir).close()  # the schema, the audit log
    con = duckdb.connect(str(data_dir / EXPERIENCE_FILE))
    try:
        con.execute("INSERT INTO concepts SELECT i, 'concept-' || i FROM range(256) t(i)")
        for start in range(0, rows, segment_rows):
            segments.add(con, rows_query(start, min(start + segment_rows, rows)))
        con.execute("INSERT INTO session_ticks SELECT session_id, max(tick) FROM timesteps GROUP BY 1")
        con.execute("INSERT INTO xdb_meta VALUES ('last_timestep_id', ?)", [str(rows - 1)])
    finally:
        con.close()
    return time.monotonic() - started


def sessions(rows: int) -> int:
    return -(-rows // (TURN * TURNS))


class Fleet(threading.Thread):
    """Streams recording FLEET_ROWS_S rows a second in tenth-second parts; `committed()` counts the rows
    committed so far."""

    def __init__(self, xdb: RemoteXDB) -> None:
        super().__init__(name="bench-fleet", daemon=True)
        self.xdb, self._stopping, self._sent = xdb, threading.Event(), 0

    def run(self) -> None:
        n = FLEET_ROWS_S // 10
        while not self._stopping.wait(0.1):
            session = f"fleet-{self._sent // 1000 % 20}"
            self.xdb.writer.submit([TimestepRow(session, t, "output", "assistant", " tok")
                                    for t in self.xdb.next_ticks(session, n)])
            self._sent += n

    def committed(self) -> int:
        self.xdb.writer.flush()
        return self._sent

    def stop(self) -> None:
        self._stopping.set()
        self.join()


def history_figures(work: Path, rows: int) -> dict[str, float]:
    data = work / "history-year"
    segment_rows = min(SEGMENT_ROWS, max(rows // 4, 1))
    generate_s = generate(data, rows, segment_rows)
    size = sum(p.stat().st_size for p in segments.folder(data).iterdir())
    figures: dict[str, float] = {"history_rows": rows, "history_bytes": size,
                                 "history_bytes_per_row": round(size / rows, 1),
                                 "history_generate_s": round(generate_s, 1)}
    victims = [f"h{n}" for n in range(0, sessions(rows), DELETED_SHARE)]
    started = time.monotonic()
    with RemoteXDB(data, XDBConfig(vacuum_max_bytes=None)) as xdb:
        xdb.recall_page({"session_id": "h0", "limit": 1}, owner=EVERY)
        figures["history_restart_s"] = round(time.monotonic() - started, 2)
        figures["history_recall_p95_ms"] = recall_p95_ms(xdb, rows)
        figures.update(erase(xdb, victims))
    left = holding(data, victims)
    if left:
        raise RuntimeError(f"xdb bench: deleted sessions' text is still in {', '.join(left)}")
    return figures


def recall_p95_ms(xdb: RemoteXDB, rows: int) -> float:
    times = []
    last = sessions(rows) - 1
    for i in range(RECALL_QUERIES):
        session = f"h{(i * 7919) % (last + 1)}"
        for filters in ({"session_id": session, "tick_from": 1000, "tick_to": 1100},
                        {"session_id": session, "text": "note-", "limit": 20},
                        {"session_id": session, "concept": f"concept-{i}", "min_activation": 0.9, "limit": 20}):
            began = time.perf_counter()
            xdb.recall_page(filters, owner=EVERY)
            times.append((time.perf_counter() - began) * 1000)
    return round(float(np.percentile(times, 95)), 1)


def erase(xdb: RemoteXDB, victims: list[str]) -> dict[str, float]:
    waits, fleet = CommitWaits(xdb), Fleet(xdb)
    waits.start()
    fleet.start()
    time.sleep(IDLE_S)
    idle_rows, idle_waits = fleet.committed(), waits.waits_ms()
    idle_s = IDLE_S
    started = time.monotonic()
    for victim in victims:
        xdb.delete_session(victim)
    result = xdb.vacuum()
    erase_s = time.monotonic() - started
    during_rows = fleet.committed() - idle_rows
    waits.stop()
    fleet.stop()
    during = waits.waits_ms()[len(idle_waits):]
    return {"history_deleted_sessions": len(victims), "history_erase_s": round(erase_s, 1),
            "history_erase_held_s": result["held_s"],
            "history_segments_rewritten": result["segments"]["rewritten"],
            "history_commit_wait_p99_ms": round(float(np.percentile(during or [0.0], 99)), 1),
            "history_idle_commit_wait_p99_ms": round(float(np.percentile(idle_waits or [0.0], 99)), 1),
            "history_recording_rows_per_s": round(during_rows / erase_s),
            "history_idle_recording_rows_per_s": round(idle_rows / idle_s)}


def holding(data: Path, victims: list[str]) -> list[str]:
    """The files under `data` still holding a deleted session's text: a segment by its rows, any other
    file by its bytes."""
    notes = [f"note-{v} ".encode() for v in victims]
    left = [str(p.relative_to(data)) for p in data.rglob("*")
            if p.is_file() and p.parent != segments.folder(data) and any(n in p.read_bytes() for n in notes)]
    listed = ", ".join(f"'{v}'" for v in victims)
    for path in sorted(segments.folder(data).glob(f"*{segments.SUFFIX}")):
        with duckdb.connect(str(path), read_only=True) as con:
            if con.execute(f"SELECT count(*) FROM timesteps WHERE session_id IN ({listed})").fetchone() != (0,):
                left.append(f"segments/{path.name}")
    return left


if __name__ == "__main__":  # python -m bench.xdb_history ROWS [WORK_DIR]: the history's figures alone, as JSON
    import json
    import shutil
    import sys
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="ahc-bench-history-", dir=sys.argv[2] if len(sys.argv) > 2 else None))
    try:
        print(json.dumps(history_figures(work, int(sys.argv[1]))))
    finally:
        shutil.rmtree(work, ignore_errors=True)
