"""The event loop's lossless, ordered hand-off of rows to the XDB writer.

Generation never waits for the disk: rows go straight onto the writer's queue while it has room. When
it is full, they wait here, in arrival order (rows arriving later queue behind them, so order is
kept), and one drain task moves them on as room appears, waiting as long as the writer lives. Nothing
accepted is ever dropped. The backlog is what admission reads: while it is over its bound, new
requests wait and are then refused (503), while requests in flight finish and are recorded.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from xdb.rows import TimestepRow, TokenBatch
from xdb.service.remote import RemoteWriter
from xdb.writer import Writer, WriterBackpressure, WriterStopped

log = logging.getLogger("ahc.recorder")

Rows = list[TimestepRow] | TokenBatch

# How long one blocking submit waits in its thread before the drain task looks again (and can be
# cancelled at shutdown); the rows stay first in line meanwhile.
RETRY_S = 1.0


class RecordQueue:
    def __init__(self, writer: Writer | RemoteWriter, max_backlog_rows: int) -> None:
        self.writer = writer
        self.max_backlog_rows = max_backlog_rows
        self._waiting: deque[Rows] = deque()
        self._waiting_rows = 0
        self._drain: asyncio.Task[None] | None = None

    def submit(self, rows: Rows) -> None:
        """Accept rows for the writer; never blocks, never drops."""
        if not rows:
            return
        if not self._waiting and self.writer.try_submit(rows):
            return
        self._waiting.append(rows)
        self._waiting_rows += len(rows)
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_task(self._drain_waiting(), name="ahc-record-drain")
            self._drain.add_done_callback(_log_failure)

    @property
    def backlog_rows(self) -> int:
        """Rows accepted here that the writer has not taken yet."""
        return self._waiting_rows

    @property
    def over_backlog(self) -> bool:
        return self._waiting_rows > self.max_backlog_rows

    async def drained(self) -> None:
        """Until every row accepted so far is on the writer's queue."""
        while self._drain is not None and not self._drain.done():
            await asyncio.shield(self._drain)

    async def _drain_waiting(self) -> None:
        while self._waiting:
            rows = self._waiting[0]
            try:
                # Room now: no thread hop (a backlog of single-token parts would pay one each).
                if not self.writer.try_submit(rows):
                    await asyncio.to_thread(self.writer.submit, rows, RETRY_S)
            except WriterBackpressure:
                continue  # still full: the rows keep their place
            except WriterStopped:
                log.error("the XDB writer has stopped; %d rows could not be recorded", self._waiting_rows)
                raise
            self._waiting.popleft()
            self._waiting_rows -= len(rows)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("recording stopped: %r", task.exception())
