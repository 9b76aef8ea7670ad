"""The XDB storage loop: every `quota_check_s`, apply retention (compress rows past
`xdb.retention.verbatim_days`, delete sessions idle past `delete_after_days`) and, past
`compress_at` of the byte quota, compress the oldest cold records, and seal the hot timesteps into
segments (xdb/storage/segments.py). Once a session was deleted, it erases it from the files (`vacuum`: the
segments holding its rows rewritten, then experience.duckdb; at most every quarter of
`xdb.erase_within_s`), so its text is in no file within that bound.

A pass compresses for at most xdb.storage.compression.PASS_BUDGET_S; one that stopped there (still over its
target) is followed by the next after a pause as long as it took rather than `quota_check_s`, so a store
far over its quota comes back under in passes that leave XDB to its other calls half the time.

The pass is `scheduled`: retention's compressions are labelled so; those the quota calls for, as every
quota pass's, `storage_pressure` (the `trigger` of xdb/storage/compression.py's records).

The pass runs in a worker thread; compression summaries come from the served model through a hidden
call (the worker thread hands the coroutine to the server's event loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from core.errors import Conflict
from server.model.hidden_calls import HiddenCaller
from xdb import XDBClient
from xdb.storage.compression import PASS_BUDGET_S, SCHEDULED, TIME_BUDGET

log = logging.getLogger("ahc.xdb.storage")

SUMMARY_INSTRUCTION = "Summarise these recorded agent events in a few factual sentences. Keep numbers and names."


def model_summarizer(hidden: HiddenCaller, loop: asyncio.AbstractEventLoop, max_tokens: int) -> Callable[[str], str]:
    def summarize(text: str) -> str:
        messages = [{"role": "system", "content": SUMMARY_INSTRUCTION}, {"role": "user", "content": text}]
        # The storage pass summarises many tenants' rows: salted as none of them.
        future = asyncio.run_coroutine_threadsafe(hidden.summarize(messages, max_tokens, system=True), loop)
        return future.result(timeout=300)

    return summarize


async def enforce_quota_forever(xdb: XDBClient, every_s: float, summarize: Callable[[str], str],
                                on_pass: Callable[[dict[str, Any]], None] | None = None,
                                erase_within_s: float | None = None) -> None:
    """Until cancelled (at shutdown): bring XDB within its quota and retention, erase deleted sessions
    from its files (`vacuum`) when a deletion waits and a quarter of `erase_within_s` has passed since
    the last, then sleep; `on_pass` hears each pass's report (the metrics)."""
    vacuumed_at = -float("inf")
    pause = every_s
    while True:
        await asyncio.sleep(pause)
        pause = every_s
        started = time.monotonic()
        try:
            report = await asyncio.to_thread(xdb.compact, summarize=summarize, trigger=SCHEDULED)
        except Exception:  # a failed pass must not stop the next; it is logged loudly
            log.exception("XDB storage manager pass failed")
            continue
        report["pass_s"] = took = round(time.monotonic() - started, 3)
        if behind(report, took):
            pause = min(every_s, took)
        if report["deleted_sessions"]:
            log.info("retention deleted %d idle sessions", len(report["deleted_sessions"]))
        if (erase_within_s is not None and report.get("vacuum_due")
                and time.monotonic() - vacuumed_at >= erase_within_s / 4):
            vacuumed_at = time.monotonic()
            try:
                report["vacuum"] = await asyncio.to_thread(xdb.vacuum)
            except Conflict as exc:  # XDB in the server's own process, or a file too large to vacuum live
                log.warning("deleted sessions' rows stay in the experience file's blocks: %s", exc)
            except Exception:
                log.exception("XDB vacuum failed; the file is as it was")
        if on_pass is not None:
            on_pass(report)
        log.debug("XDB storage manager pass: %s", report)


def behind(report: dict[str, Any], took_s: float) -> bool:
    """Whether a pass stopped at its time budget with usage still over the target: its report's
    `quota_pass` says so (`stopped`); a report without one, by a pass that took the whole budget."""
    quota = report.get("quota_pass")
    if isinstance(quota, dict):
        return quota.get("stopped") == TIME_BUDGET
    return took_s >= PASS_BUDGET_S
