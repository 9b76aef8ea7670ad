"""The storage manager: over the byte quota, compress the oldest released records at the finest
level available (token rows → REPLY → SESSION → DAY → WEEK → MONTH → QUARTER → YEAR), never touching
HOT, WARM or SUBMITTED rows. A compressed record keeps the top-k activations (summed), the most
frequent tags and a summary: the served model's (a `summarize` callable) or, with no model attached,
a deterministic extractive one.

Every deletion here is chained in the audit log first (an `AuditEvent`, inside the transaction that
deletes, before its COMMIT): which rows left, how many, and the record that replaced them.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import duckdb

from core.errors import InvalidRequest, NotFound
from xdb.audit.log import AuditEvent
from xdb.interface import reads
from xdb.schema import TOP_K
from xdb.sql import one, one_int, transaction
from xdb.storage import segments
from xdb.storage.fidelity import PROTECTED_WINDOWS, ROW_BYTES, SESSION_HEAT, CompressionLevel, hot_cutoff
from xdb.tables import HOT_TIMESTEPS
from xdb.tags import TAG_MATCH

log = logging.getLogger("ahc.xdb.storage")

Summarize = Callable[[str], str]
SUMMARY_CHARS = 280
# Retention's and `compress_released`'s batch of replies: they compress every reply they find, a batch a scan.
BATCH_GROUPS = 100
# The quota pass (`quota_pass`) sizes its batches by the pressure: the oldest replies whose bytes cover
# what usage is over the target, at least one and at most MAX_BATCH_GROUPS a scan, so a store just over
# compresses a reply or two and one far over scans once for hundreds.
MAX_BATCH_GROUPS = 1_000
# Replies committed a transaction (each with its audit events, chained before the COMMIT): a batch is
# several short transactions, not one long one nor one a reply (a commit each).
TXN_GROUPS = 8
# A quota pass stops between transactions past this: the rest waits for the next pass, so one pass holds
# the compression lock (and the audit log's commit turn, between the writer's batches) for about this long.
# (~21 replies/s with their audit events on 2 cores and the extractive summary: ~100 replies a pass.)
PASS_BUDGET_S = 5.0
# The calendar bucket each coarse level groups its source records by.
# What made a compaction or a compression, as its record stores it: the context window filling
# (the orchestrator's threshold), a client's call, a pass on a schedule (the storage loop's, each
# `xdb.quota_check_s`: retention's aged rows), the byte quota (the quota pass, whoever runs it), and the
# KV cache full (the VRAM governor's compaction of a prompt).
CONTEXT_FULL, MANUAL, SCHEDULED, STORAGE_PRESSURE = "context_full", "manual", "scheduled", "storage_pressure"
KV_CACHE_FULL = "kv_cache_full"
TRIGGERS = (CONTEXT_FULL, MANUAL, SCHEDULED, STORAGE_PRESSURE, KV_CACHE_FULL)
BUCKETS = {CompressionLevel.DAY: "day", CompressionLevel.WEEK: "week", CompressionLevel.MONTH: "month",
           CompressionLevel.QUARTER: "quarter", CompressionLevel.YEAR: "year"}


def extractive_summary(text: str, max_chars: int = SUMMARY_CHARS) -> str:
    """The sentences carrying the most frequent words, in their original order, within max_chars."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    if not sentences:
        return ""
    freq = Counter(w for w in re.findall(r"\w+", text.lower()) if len(w) > 3)
    score = {i: sum(freq[w] for w in re.findall(r"\w+", s.lower()) if len(w) > 3) / (1 + len(s) ** 0.5)
             for i, s in enumerate(sentences)}
    chosen, used = [], 0
    for i in sorted(score, key=lambda i: (-score[i], i)):
        if used + len(sentences[i]) + 1 <= max_chars:
            chosen.append(i)
            used += len(sentences[i]) + 1
    if not chosen:
        return sentences[0][: max_chars - 1] + "…"
    return " ".join(sentences[i] for i in sorted(chosen))


def summarize_with(summarize: Summarize | None, text: str) -> str:
    if summarize is not None:
        try:
            return summarize(text)
        except Exception:  # the model is optional; memory management must not fail with it
            pass
    return extractive_summary(text)


def usage_bytes(cur: duckdb.DuckDBPyConnection) -> int:
    """Logical bytes held: what the quota counts (DuckDB files do not shrink when rows are deleted). The
    segments' from their manifest, less their rows listed as deleted: a pass reads the hot table alone."""
    return one_int(cur.execute(f"""SELECT
        (SELECT count(*) * {ROW_BYTES} + coalesce(sum(strlen(content)), 0) FROM {HOT_TIMESTEPS})
      + (SELECT coalesce(sum(rows * {ROW_BYTES} + content_bytes), 0) FROM segments)
      - (SELECT coalesce(sum({ROW_BYTES} + content_bytes), 0) FROM segment_deletes)
      + (SELECT coalesce(sum(strlen(summary) + strlen(top_k_activations) + 64), 0) FROM compressed_records)"""))


def top_k(scores: Counter[str], k: int = TOP_K) -> dict[str, float]:
    return {name: round(float(v), 6) for name, v in scores.most_common(k)}


def _compress_replies(cur: duckdb.DuckDBPyConnection, summarize: Summarize | None, hot_seconds: float,
                      max_groups: int, audit: AuditEvent | None = None,
                      older_than: datetime | None = None, *, need_bytes: int | None = None,
                      deadline: float | None = None, txn_groups: int = TXN_GROUPS,
                      trigger: str = STORAGE_PRESSURE) -> list[int]:
    """Released token rows → one REPLY record per (session, request), oldest first, each labelled
    with what made the pass (`trigger`, see TRIGGERS). `older_than`
    (retention): instead of released rows, every reply last written before then, HOT or not; pinned
    and SUBMITTED windows are never touched either way. `need_bytes`: only the oldest replies whose
    bytes cover it (at least one). Committed `txn_groups` replies a transaction; past `deadline`
    (time.monotonic()) no further one starts once one is committed."""
    groups = cur.execute(f"""
        WITH h AS ({SESSION_HEAT}), w AS ({PROTECTED_WINDOWS}),
        g AS (SELECT t.session_id, t.request_id, min(t.id) lo, max(t.id) hi, min(t.tick) t0, max(t.tick) t1,
                     min(t.created_at) c0, max(t.created_at) c1, count(*) n,
                     count(*) FILTER (WHERE t.event_type = 'output') tokens,
                     count(*) * {ROW_BYTES} + coalesce(sum(strlen(t.content)), 0) bytes,
                     bool_or(t.tick > h.released_through AND h.last_at > ?) hot
              FROM timesteps t JOIN h USING (session_id) GROUP BY t.session_id, t.request_id)
        SELECT session_id, request_id, lo, hi, t0, t1, c0, c1, n, tokens FROM g
        WHERE (CASE WHEN ?::TIMESTAMP IS NULL THEN NOT hot ELSE c1 < ?::TIMESTAMP END)
          AND NOT EXISTS (SELECT 1 FROM w WHERE w.session_id = g.session_id
                          AND w.start_tick <= g.t1 AND w.end_tick >= g.t0)
        QUALIFY ?::BIGINT IS NULL OR coalesce(sum(bytes) OVER (ORDER BY lo ROWS BETWEEN UNBOUNDED PRECEDING
                                                               AND 1 PRECEDING), 0) < ?::BIGINT
        ORDER BY lo LIMIT ?""", [hot_cutoff(hot_seconds), older_than, older_than, need_bytes, need_bytes,
                                 max_groups]).fetchall()
    made: list[int] = []
    for at in range(0, len(groups), max(txn_groups, 1)):
        records: list[tuple[str, list[Any], dict[str, Any]]] = []
        for group in groups[at:at + max(txn_groups, 1)]:
            if deadline is not None and (made or records) and time.monotonic() >= deadline:
                break
            records.append(_reply_record(cur, summarize, group, trigger))  # read and summarised outside the transaction
        if not records:
            break
        with transaction(cur):
            for where, args, record in records:
                new_id = _insert_record(cur, record)
                # DuckDB answers a DELETE with the number of rows it removed.
                deleted = segments.delete_rows(cur, args[0], where, args, erase=False)
                if audit is not None:
                    session_id, request_id, lo, hi = args
                    audit("compress_timesteps", {"session_id": session_id, "request_id": request_id,
                                                 "timestep_ids": [lo, hi], "ticks": [record["start_tick"],
                                                                                     record["end_tick"]],
                                                 "deleted": deleted, "into_compressed_record": new_id,
                                                 "level": "reply", "trigger": trigger})
                made.append(new_id)
        if deadline is not None and time.monotonic() >= deadline:
            break
    return made


def _reply_record(cur: duckdb.DuckDBPyConnection, summarize: Summarize | None,
                  group: tuple[Any, ...], trigger: str) -> tuple[str, list[Any], dict[str, Any]]:
    """One reply's REPLY record (its text summarised, its activations summed, its tags counted), with
    the condition and arguments that select its rows."""
    session_id, request_id, lo, hi, t0, t1, c0, c1, n, tokens = group
    where = "t.session_id = ? AND t.request_id IS NOT DISTINCT FROM ? AND t.id BETWEEN ? AND ?"
    args = [session_id, request_id, lo, hi]
    text = one(cur.execute(f"SELECT string_agg(CASE WHEN event_type = 'output' THEN content "
                           f"ELSE chr(10) || content || chr(10) END, '' ORDER BY tick) FROM timesteps t "
                           f"WHERE {where}", args))[0] or ""
    acts = cur.execute(f"""SELECT c.name, sum(u.v) FROM (SELECT unnest(t.concept_ids) cid,
                           unnest(t.concept_values) v FROM timesteps t WHERE {where}) u
                           JOIN concepts c ON c.id = u.cid
                           WHERE u.cid IS NOT NULL GROUP BY c.name""", args).fetchall()
    tags = cur.execute(f"""SELECT g.name, count(*) FROM timesteps t JOIN tag_applications a ON {TAG_MATCH}
                           JOIN tags g ON g.id = a.tag_id WHERE {where} GROUP BY g.name""", args).fetchall()
    record = dict(level=CompressionLevel.REPLY, session_id=session_id, start_time=c0, end_time=c1,
                  start_tick=t0, end_tick=t1, summary=summarize_with(summarize, text.strip()),
                  activations=top_k(Counter(dict(acts))),
                  tags=[name for name, _ in Counter(dict(tags)).most_common(TOP_K)],
                  sources=[f"timesteps:{lo}-{hi}" + (f" request:{request_id}" if request_id else "")],
                  token_count=tokens, record_count=n, trigger=trigger)
    return where, args, record


def _insert_record(cur: duckdb.DuckDBPyConnection, r: dict[str, Any]) -> int:
    return one_int(cur.execute(
        "INSERT INTO compressed_records (compression_level, session_id, start_time, end_time, start_tick, end_tick, "
        "summary, top_k_activations, significant_tags, source_record_ids, token_count, record_count, trigger, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now()) RETURNING id",
        [int(r["level"]), r["session_id"], r["start_time"], r["end_time"], r["start_tick"], r["end_tick"],
         r["summary"], json.dumps(r["activations"], sort_keys=True), r["tags"], r["sources"], r["token_count"],
         r["record_count"], r["trigger"]]))


def _merge_level(cur: duckdb.DuckDBPyConnection, source: CompressionLevel,
                 summarize: Summarize | None, audit: AuditEvent | None = None,
                 trigger: str = STORAGE_PRESSURE) -> list[int]:
    """The oldest group of records at `source` → one record a level coarser (reply →
    session → day → week → month → quarter → year)."""
    target = CompressionLevel(source + 1)
    key = "session_id" if target == CompressionLevel.SESSION else f"date_trunc('{BUCKETS[target]}', start_time)"
    oldest = cur.execute(f"SELECT {key} FROM compressed_records WHERE compression_level = ? "
                         "ORDER BY start_time, id LIMIT 1", [int(source)]).fetchone()
    if oldest is None:
        return []
    rows = cur.execute(f"SELECT id, session_id, start_time, end_time, start_tick, end_tick, summary, "
                       f"top_k_activations, significant_tags, token_count, record_count FROM compressed_records "
                       f"WHERE compression_level = ? AND {key} = ? ORDER BY start_time, id",
                       [int(source), oldest[0]]).fetchall()
    acts: Counter[str] = Counter()
    tags: Counter[str] = Counter()
    for r in rows:
        acts.update(json.loads(r[7]))
        tags.update(r[8])
    same_session = target == CompressionLevel.SESSION
    record = dict(level=target, session_id=rows[0][1] if same_session else None,
                  start_time=min(r[2] for r in rows), end_time=max(r[3] for r in rows),
                  start_tick=min(r[4] for r in rows) if same_session else None,
                  end_tick=max(r[5] for r in rows) if same_session else None,
                  summary=summarize_with(summarize, "\n".join(r[6] for r in rows if r[6])),
                  activations=top_k(acts), tags=[t for t, _ in tags.most_common(TOP_K)],
                  sources=[f"compressed:{r[0]}" for r in rows], token_count=sum(r[9] for r in rows),
                  record_count=sum(r[10] for r in rows), trigger=trigger)
    sources = [r[0] for r in rows]
    with transaction(cur):
        new_id = _insert_record(cur, record)
        deleted = one_int(cur.execute("DELETE FROM compressed_records WHERE id IN (SELECT unnest(?))", [sources]))
        if audit is not None:
            audit("merge_compressed_records", {"session_id": record["session_id"], "compressed_record_ids": sources,
                                               "deleted": deleted, "from_level": source.name.lower(),
                                               "into_compressed_record": new_id, "level": target.name.lower(),
                                               "trigger": trigger})
    return [new_id]


def compress_step(cur: duckdb.DuckDBPyConnection, summarize: Summarize | None, hot_seconds: float,
                  max_groups: int = BATCH_GROUPS, audit: AuditEvent | None = None, *, need_bytes: int | None = None,
                  deadline: float | None = None) -> list[int]:
    """One step at the finest level that has anything to compress; [] when nothing can be. The quota's
    step: its records are `storage_pressure`'s."""
    made = _compress_replies(cur, summarize, hot_seconds, max_groups, audit, need_bytes=need_bytes, deadline=deadline,
                             trigger=STORAGE_PRESSURE)
    if made:
        return made
    for level in list(CompressionLevel)[1:-1]:
        made = _merge_level(cur, level, summarize, audit, trigger=STORAGE_PRESSURE)
        if made:
            return made
    return []


# Why a quota pass stopped.
UNDER_TARGET, TIME_BUDGET, NOTHING_LEFT, MAX_STEPS = "under_target", "time_budget", "nothing_to_compress", "max_steps"


@dataclass
class QuotaPass:
    """What one quota pass did: the records it made, the groups it compressed (replies, and groups of
    records merged a level coarser), in how many batches, how long it took, and why it stopped."""

    target_bytes: int
    usage_before: int
    usage_after: int = 0
    record_ids: list[int] = field(default_factory=list)
    groups: int = 0
    batches: int = 0
    largest_batch: int = 0
    seconds: float = 0.0
    stopped: str = UNDER_TARGET

    def report(self) -> dict[str, Any]:
        return {"groups": self.groups, "batches": self.batches, "largest_batch": self.largest_batch,
                "stopped": self.stopped, "seconds": round(self.seconds, 3), "target_bytes": self.target_bytes,
                "usage_before": self.usage_before, "usage_after": self.usage_after}


def quota_pass(cur: duckdb.DuckDBPyConnection, target_bytes: int, summarize: Summarize | None,
               hot_seconds: float, max_steps: int = 1000, audit: AuditEvent | None = None, *,
               budget_s: float | None = PASS_BUDGET_S, max_batch: int = MAX_BATCH_GROUPS) -> QuotaPass:
    """Compress, oldest first, until usage is within `target_bytes`, nothing more may be compressed or
    `budget_s` has passed (None: no limit). Each batch is as many replies as the bytes over call for (at
    most `max_batch`): it grows with how far over the target usage is and shrinks as it comes back."""
    start = time.monotonic()
    deadline = None if budget_s is None else start + budget_s
    usage = usage_bytes(cur)
    done = QuotaPass(target_bytes, usage)
    for _ in range(max_steps):
        if usage <= target_bytes:
            done.stopped = UNDER_TARGET
            break
        if deadline is not None and time.monotonic() >= deadline:
            done.stopped = TIME_BUDGET
            break
        step = compress_step(cur, summarize, hot_seconds, max_batch, audit, need_bytes=usage - target_bytes,
                             deadline=deadline)
        if not step:
            done.stopped = NOTHING_LEFT
            break
        done.record_ids += step
        done.groups += len(step)
        done.batches += 1
        done.largest_batch = max(done.largest_batch, len(step))
        usage = usage_bytes(cur)
    else:
        done.stopped = UNDER_TARGET if usage <= target_bytes else MAX_STEPS
    done.usage_after, done.seconds = usage, time.monotonic() - start
    if done.groups:
        log.info("XDB quota pass: %d groups compressed in %d batches (largest %d) in %.2f s, %d -> %d bytes "
                 "(target %d); stopped: %s", done.groups, done.batches, done.largest_batch, done.seconds,
                 done.usage_before, done.usage_after, target_bytes, done.stopped)
    return done


def enforce_quota(cur: duckdb.DuckDBPyConnection, quota_bytes: int, summarize: Summarize | None,
                  hot_seconds: float, max_steps: int = 1000, audit: AuditEvent | None = None, *,
                  budget_s: float | None = PASS_BUDGET_S) -> list[int]:
    """`quota_pass`'s records: compress until usage is within the quota, nothing more may be compressed,
    or the pass's time budget has passed."""
    return quota_pass(cur, quota_bytes, summarize, hot_seconds, max_steps, audit, budget_s=budget_s).record_ids


def rows_compressed(cur: duckdb.DuckDBPyConnection, record_ids: list[int]) -> dict[str, int]:
    """Per level, the rows (token rows, or finer records) the new records `record_ids` replaced; a
    record merged again within the same pass is counted at each level it passed through."""
    if not record_ids:
        return {}
    rows = cur.execute("SELECT compression_level, sum(record_count) FROM compressed_records WHERE id IN "
                       "(SELECT unnest(?::BIGINT[])) GROUP BY 1", [record_ids]).fetchall()
    return {CompressionLevel(level).name.lower(): int(n) for level, n in rows}


def compaction_record(cur: duckdb.DuckDBPyConnection, session_id: str, up_to_tick: int | None,
                      summary: str | None, summarize: Summarize | None, trigger: str,
                      tokens_after: int | None, tokens_before: int | None = None) -> dict[str, Any]:
    """Record a context compaction of a session up to a tick: its rows leave HOT. `tokens_before` /
    `tokens_after`: the context's tokens as its owner counted them (default: the range's output tokens,
    and the summary's words)."""
    start = one_int(cur.execute("SELECT coalesce(max(range_end), -1) + 1 FROM compaction_records "
                                "WHERE session_id = ?", [session_id]))
    last = cur.execute("SELECT last_tick FROM session_ticks WHERE session_id = ?", [session_id]).fetchone()
    if last is None:
        raise NotFound(f"session {session_id!r} not found")
    # A compaction releases every tick up to its end, including ticks not yet recorded: one past the
    # session's last tick would release (and let compression delete) rows the session has yet to write,
    # and every later compaction would then start beyond the session's end. So the end is at most the
    # last recorded tick.
    if up_to_tick is not None and up_to_tick > last[0]:
        raise InvalidRequest(f"up_to_tick {up_to_tick} is beyond session {session_id!r}'s last tick {last[0]}",
                             param="up_to_tick")
    end = last[0] if up_to_tick is None else up_to_tick
    if end < start:
        raise InvalidRequest(f"ticks up to {end} are already compacted (next is {start})",
                             param="up_to_tick" if up_to_tick is not None else "session_id")
    where = "session_id = ? AND tick BETWEEN ? AND ?"
    args = [session_id, start, end]
    n, tokens, text = one(cur.execute(
        f"SELECT count(*), count(*) FILTER (WHERE event_type = 'output'), string_agg(CASE WHEN event_type = 'output' "
        f"THEN content ELSE chr(10) || content || chr(10) END, '' ORDER BY tick) FROM timesteps WHERE {where}",
        args))
    acts = cur.execute(f"""SELECT c.name, sum(u.v) FROM (SELECT unnest(concept_ids) cid, unnest(concept_values) v
                           FROM timesteps WHERE {where}) u JOIN concepts c ON c.id = u.cid GROUP BY c.name""",
                       args).fetchall()
    summary = summary if summary is not None else summarize_with(summarize, (text or "").strip())
    activations = top_k(Counter(dict(acts)))
    after = tokens_after if tokens_after is not None else len(summary.split())
    tokens = tokens_before if tokens_before is not None else tokens
    rid = one_int(cur.execute(
        "INSERT INTO compaction_records (session_id, created_at, range_start, range_end, timesteps_compacted, "
        "tokens_before, tokens_after, summary, summary_concept_tags, top_k_activations, trigger, result_level) "
        "VALUES (?, now(), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        [session_id, start, end, n, tokens, after, summary, list(activations), json.dumps(activations, sort_keys=True),
         trigger, int(CompressionLevel.REPLY)]))
    return {"id": rid, "session_id": session_id, "range_start": start, "range_end": end, "timesteps_compacted": n,
            "tokens_before": tokens, "tokens_after": after, "summary": summary, "top_k_activations": activations,
            "trigger": trigger}


@reads
def cold_records(cur: duckdb.DuckDBPyConnection, session_id: str | None = None,
                 limit: int = 100) -> list[dict[str, Any]]:
    cols = ("id", "compression_level", "session_id", "start_time", "end_time", "start_tick", "end_tick", "summary",
            "top_k_activations", "significant_tags", "source_record_ids", "token_count", "record_count", "trigger")
    rows = cur.execute(f"SELECT {', '.join(cols)} FROM compressed_records WHERE ? IS NULL OR session_id = ? "
                       "ORDER BY start_time, id LIMIT ?", [session_id, session_id, limit]).fetchall()
    out = []
    for r in rows:
        rec = dict(zip(cols, r))
        rec["level"] = CompressionLevel(rec.pop("compression_level")).name.lower()
        rec["top_k_activations"] = json.loads(rec["top_k_activations"])
        rec["start_time"], rec["end_time"] = rec["start_time"].isoformat() + "Z", rec["end_time"].isoformat() + "Z"
        out.append(rec)
    return out
