"""XDB's methods on its sealed segments (xdb/segments.py): the storage pass's seal and rewrites, and the
live part of an erasure.

A file is written holding nothing; the storage lock (`_compress_lock`, which deletions and compression
take) is held only for the transaction that swaps it into the manifest, and the writer never waits:
recording goes on throughout. `XDB` (xdb/store.py) holds
these methods with the rest of its interface.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import duckdb

from xdb import segments
from xdb.interface import service


class SegmentMethods:
    """What these methods use of the XDB they are part of (set in XDB.__init__)."""

    segment_rows: int
    _compress_lock: threading.Lock
    cursor: Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]

    @service
    def erase_pass(self) -> dict[str, Any]:
        """Take every deleted session's timesteps out of the segment files: the hot table sealed (what is
        in it then holds no deleted row), then each segment holding an erased row rewritten without it.
        What is left of a deletion is in experience.duckdb's free blocks, which a vacuum clears."""
        return self._rewrite_segments(erase_only=True, seal=True)

    def _segment_pass(self) -> dict[str, Any]:
        """The storage pass's part: the hot table sealed once it holds `segment_rows`, the segments that
        hold an erased row or are half deleted rewritten, and adjacent small ones merged."""
        with self.cursor() as cur:
            due = segments.hot_rows(cur) >= self.segment_rows
        report = self._rewrite_segments(erase_only=False, seal=due)
        merged = 0
        while True:
            with self.cursor() as cur:
                run = segments.merge_due(cur, self.segment_rows)
                old = segments.merge(cur, run, self._compress_lock) if run else []
            if not old:
                break
            with self.cursor() as cur:
                segments.retire(cur, old)
            merged += len(old)
        if merged:
            with self.cursor() as cur:
                report.update(segments.usage(cur))
        return {**report, "merged": merged}

    def _rewrite_segments(self, *, erase_only: bool, seal: bool) -> dict[str, Any]:
        sealed = None
        if seal:
            with self.cursor() as cur:
                sealed = segments.seal(cur, self._compress_lock)
        with self.cursor() as cur:
            due = segments.due(cur, erase_only=erase_only)
        rewritten, pending = 0, list[tuple[Path, float]]()
        for segment in due:
            with self.cursor() as cur:
                replaced = segments.rewrite(cur, segment, self._compress_lock)
            if replaced is not None:  # an old file goes once its grace has passed: the disk holds few more
                rewritten += 1
                now = time.monotonic()
                pending.append((replaced, now))
                self._retire([p for p in pending if now - p[1] >= segments.GRACE_S])
                pending = [p for p in pending if now - p[1] < segments.GRACE_S]
        self._retire(pending)
        with self.cursor() as cur:
            return {"sealed": sealed, "rewritten": rewritten, **segments.usage(cur)}

    def _retire(self, pending: list[tuple[Path, float]]) -> None:
        with self.cursor() as cur:
            for path, since in pending:
                segments.retire(cur, [path], since)
