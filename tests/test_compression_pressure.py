"""The quota pass adapts to the pressure: its batches are as many of the oldest replies as the bytes over
the target call for (not a fixed 100), committed a few a transaction, within a time budget; the storage
loop follows a pass cut short by its budget sooner than `quota_check_s`."""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

import pytest

from core.config import XDBConfig
from server.recording import quota_loop
from xdb import XDB, TimestepRow
from xdb.storage import compression
from xdb.storage.compression import (
    BATCH_GROUPS,
    NOTHING_LEFT,
    TIME_BUDGET,
    UNDER_TARGET,
    quota_pass,
    usage_bytes,
)

REPLY_TOKENS = 10


def write(xdb: XDB, replies: int, sessions: int = 10, tokens: int = REPLY_TOKENS) -> None:
    """`replies` replies of `tokens` tokens over `sessions` sessions, all released (hot_seconds=0)."""
    assert xdb.writer is not None
    for r in range(replies):
        session = f"s{r % sessions}"
        ticks = xdb.next_ticks(session, tokens)
        xdb.writer.submit([TimestepRow(session, t, "output", "assistant", f"word{t} ", request_id=f"{session}-r{r}",
                                       concept_activations={"joy": 0.5}) for t in ticks])
    xdb.writer.flush()


def reply_bytes(xdb: XDB) -> int:
    """What one reply's token rows count in the quota (every reply here is the same size)."""
    with xdb.cursor() as cur:
        return int(cur.execute("SELECT max(b) FROM (SELECT count(*) * ? + sum(strlen(content)) b FROM timesteps "
                               "GROUP BY request_id)", [compression.ROW_BYTES]).fetchone()[0])


def test_far_over_one_scan_takes_what_the_pressure_calls_for(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=0)) as xdb:
        write(xdb, 260)
        size = reply_bytes(xdb)
        with xdb.cursor() as cur:
            usage = usage_bytes(cur)
            target = usage // 2  # ~130 replies to compress: more than the old fixed batch
            done = quota_pass(cur, target, None, 0, audit=xdb.audit_event, budget_s=None)
        assert done.stopped == UNDER_TARGET and done.usage_after <= target
        assert done.largest_batch > BATCH_GROUPS  # one scan sized to the excess, not 100 at a time
        assert done.batches <= 3  # the first scan covers the excess in bytes; the records' own bytes are left
        # No overshoot by a whole fixed batch: it stops within a few replies of the target.
        assert target - done.usage_after < 3 * size, (target, done.report())
        assert done.report()["groups"] == done.groups == len(done.record_ids)


def test_slightly_over_compresses_little(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=0)) as xdb:
        write(xdb, 300)
        with xdb.cursor() as cur:
            usage = usage_bytes(cur)
            done = quota_pass(cur, usage - 10, None, 0, audit=xdb.audit_event)  # 10 bytes over
            assert done.stopped == UNDER_TARGET and done.groups == 1  # the fixed batch compressed 100
            assert done.largest_batch == 1
            # Under the target: nothing at all, in no batch.
            again = quota_pass(cur, usage_bytes(cur), None, 0, audit=xdb.audit_event)
            assert (again.groups, again.batches, again.stopped) == (0, 0, UNDER_TARGET)


def test_a_pass_respects_its_time_budget_and_the_next_goes_on(tmp_path: Path) -> None:
    def slow_model(text: str) -> str:  # a served model's summary: ~30 ms a reply
        time.sleep(0.03)
        return text[:40]

    budget = 0.5
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=0)) as xdb:
        write(xdb, 120)
        with xdb.cursor() as cur:
            target = usage_bytes(cur) // 2  # ~60 replies: ~2 s of summaries at least
            passes = []
            while not passes or passes[-1].stopped == TIME_BUDGET:
                passes.append(quota_pass(cur, target, slow_model, 0, audit=xdb.audit_event, budget_s=budget))
                assert len(passes) <= 40
        first = passes[0]
        assert first.stopped == TIME_BUDGET and first.groups >= 1 and first.usage_after > target
        # A pass stops at the first transaction boundary past its budget: at most one transaction of
        # compression.TXN_GROUPS replies (their summaries read before it) beyond it.
        longest = max(p.seconds for p in passes)
        assert longest < budget + compression.TXN_GROUPS * 0.2, [p.report() for p in passes]
        assert passes[-1].stopped == UNDER_TARGET and passes[-1].usage_after <= target
        assert len(passes) >= 3  # the work did not fit one budget; it was spread over passes


def test_nothing_left_to_compress_is_said(tmp_path: Path) -> None:
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=10**9)) as xdb:  # every row HOT: none may go
        write(xdb, 20)
        with xdb.cursor() as cur:
            done = quota_pass(cur, 0, None, 10**9, audit=xdb.audit_event)
        assert (done.stopped, done.groups) == (NOTHING_LEFT, 0)


def test_the_storage_loop_catches_up_sooner_than_its_interval(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Far over the quota: XDB.compact's passes, each cut at a small budget, follow each other after a
    pause as long as the pass (not `quota_check_s`) until usage is back under the target."""
    budget, every_s = 0.4, 3.0
    # XDB.compact's pass, at the small budget, whichever of the two it calls.
    monkeypatch.setattr(compression, "enforce_quota", functools.partial(compression.enforce_quota, budget_s=budget))
    monkeypatch.setattr(compression, "quota_pass", functools.partial(compression.quota_pass, budget_s=budget))
    monkeypatch.setattr(quota_loop, "PASS_BUDGET_S", budget)
    with XDB.open(tmp_path / "x", XDBConfig(hot_seconds=0)) as xdb:
        # Replies of 100 tokens: each frees far more than its audit event adds (the audit log counts in
        # the quota too, and a compression's events make it grow).
        write(xdb, 80, tokens=100)
        with xdb.cursor() as cur:
            rows = usage_bytes(cur)
        xdb.quota_bytes = int((rows * 0.6 + xdb.audit_bytes()) / xdb.compress_at)  # ~32 replies over
        passes: list[tuple[float, dict[str, Any]]] = []

        def under(report: dict[str, Any]) -> bool:
            return bool(report["usage_bytes"] <= xdb.compress_at * report["quota_bytes"])

        async def run() -> None:
            task = asyncio.create_task(quota_loop.enforce_quota_forever(
                xdb, every_s, lambda text: text[:40], lambda report: passes.append((time.monotonic(), report))))
            while not passes or not under(passes[-1][1]):
                await asyncio.sleep(0.02)
                assert len(passes) <= 30
            task.cancel()

        asyncio.run(run())
    assert len(passes) >= 2  # the budget cut the first pass short
    for (t0, report), (t1, _) in zip(passes, passes[1:]):
        # Cut at its budget, the next pass came after a pause as long as this one took: within quota_check_s.
        assert report["pass_s"] >= budget and t1 - t0 < every_s, passes
