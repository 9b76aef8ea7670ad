"""A remote writer's side of `xdb.on_disk_full: spill` (xdb/service/remote.py): while recording is paused on a
failed disk, the rows the writer gathers go to its spill (xdb/service/spill.py) rather than memory; once the
service commits again they are read back oldest first and sent before any newer row, and a segment's file
goes once the service has committed its last row. A close while the disk still fails leaves every row not
committed there for the owner's next start, which adopts them and sends them before anything new.

`SpillSender` keeps the spill's counts under the writer's own lock, since they change with the writer's
queue: a row leaves the queue and joins the spill (or comes back) in one step, so the rows held in memory,
which back-pressure bounds, never count the spilled ones.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from xdb.service.spill import OWNER, Part, Segment, Spill, check_spill_dir

log = logging.getLogger("ahc.xdb")

SPILL_EVERY_S = 0.05  # while paused, how often the rows gathered go to the spill dir
READ_RETRY_S = 1.0  # after reading the spill dir failed, how long until it is tried again


class SpillSender:
    """One writer's spill, named for it under `spill_dir` (the owner's `owner`, an attached writer's
    `stream-PID-…`); `cond` is the writer's lock, which guards the counts here with its queue."""

    def __init__(self, spill_dir: Path, data_dir: Path, attached: bool, cond: threading.Condition) -> None:
        check_spill_dir(spill_dir, data_dir)
        name = f"stream-{os.getpid()}-{secrets.token_hex(4)}" if attached else OWNER
        self.spill = Spill(spill_dir, name)
        self._data_dir = data_dir
        self._cond = cond
        self.failed: str | None = None  # why spilling fell back to pausing, until recording resumes
        self.unread = 0  # rows in the spill files not read back yet (accepted, in no deque of the writer's)
        self._sent: deque[tuple[int, Segment]] = deque()  # read back and sent: (rows sent up to it, segment)
        self.left = 0  # rows left in the spill dir by a close while the disk failed

    @property
    def dir(self) -> Path:
        return self.spill.dir

    def adopt_leftovers(self) -> int:
        """The rows a stopped or killed server left in the spill dir, to be sent before anything new."""
        self.unread = self.spill.adopt_leftovers()
        return self.unread

    @contextmanager
    def meanwhile(self, spill: Callable[[], None]) -> Iterator[None]:
        """`spill` called every SPILL_EVERY_S on a thread of its own while the body runs (the writer starting
        a run of the service, which takes a while); the thread has stopped by the time the body is left, so
        the writer's sender alone decides what goes next."""
        stop = threading.Event()

        def spill_until_stopped() -> None:
            while not stop.wait(SPILL_EVERY_S):
                spill()

        spiller = threading.Thread(target=spill_until_stopped, name="xdb-spill", daemon=True)
        spiller.start()
        try:
            yield
        finally:
            stop.set()
            spiller.join()

    def spill_pending(self, pending: deque[Part]) -> bool:
        """The rows accepted and not sent (the writer's `pending`), to the end of the spill (after every row
        spilled before them). False if the spill dir fails: they stay first in `pending` and recording pauses
        with them in memory. Only while the writer's sender restarts the service (`meanwhile`), so nothing
        else takes `pending` meanwhile."""
        if self.failed is not None:
            return True
        with self._cond:
            parts = list(pending)
            pending.clear()
            rows = sum(len(part) for part in parts)
            self.unread += rows
            self._cond.notify_all()  # room in memory again
        if not parts:
            return True
        try:
            self.spill.append(parts)
        except OSError as exc:
            with self._cond:
                pending.extendleft(reversed(parts))
                self.unread -= rows
                self.failed = repr(exc)
            log.error("the XDB spill dir %s failed too (%r): recording pauses, rows held in memory", self.dir, exc)
            return False
        return True

    def leave(self, held: list[Part], pending: list[Part]) -> bool:
        """Closing while the disk fails: the rows the writer `held` (sent to the dead run) before every row
        spilled (they are older), its `pending` ones after them, so the next start sends them all in order.
        False if the spill dir failed (closing then waits for the disk, as with `pause`)."""
        try:
            self.spill.prepend(held)
            self.spill.append(pending)
        except OSError as exc:
            log.error("the XDB spill dir %s failed (%r): closing waits for the disk under %s",
                      self.dir, exc, self._data_dir)
            with self._cond:
                self.failed = repr(exc)
            return False
        return True

    def take(self) -> tuple[Segment, list[Part]] | None:
        """The oldest segment not read back yet and its parts; None if there is none (the count was off: it
        is set right) or reading it failed (tried again after READ_RETRY_S)."""
        try:
            taken = self.spill.take()
        except OSError as exc:
            log.error("reading the XDB spill dir %s failed (%r); trying again", self.dir, exc)
            with self._cond:
                self._cond.wait(READ_RETRY_S)
            return None
        if taken is None:
            with self._cond:
                self.unread = 0
        return taken

    def sending(self, segment: Segment, parts: list[Part], sent: int) -> int:
        """Under the writer's lock: `segment`'s `parts`, read back, are sent, the last making `sent` rows sent
        since open; returns the rows it lost (a record cut short by a crash while it was written)."""
        self.unread -= segment.rows
        read = sum(len(part) for part in parts)
        if read != segment.rows:
            log.error("XDB spill segment %s held %d rows, %d could be read back", segment.path, segment.rows, read)
        self._sent.append((sent, segment))
        return segment.rows - read

    def committed(self, rows_written: int) -> list[Segment]:
        """Under the writer's lock: the segments whose rows are all among the `rows_written` committed."""
        done: list[Segment] = []
        while self._sent and self._sent[0][0] <= rows_written:
            done.append(self._sent.popleft()[1])
        return done

    def remove(self, segments: list[Segment]) -> None:
        for segment in segments:
            try:
                self.spill.remove(segment)
            except OSError as exc:
                log.error("removing the committed XDB spill segment %s failed: %r", segment.path, exc)

    def close(self) -> None:
        self.spill.close()
