"""The batch the XDB service's writer died on, told to the service's next run.

A part the writer cannot store (a fault no check where rows are accepted catches) kills the writer; the
service exits and the server starts another run, sending it every part not yet committed
(xdb/service/remote.py). Sent again as it was, that part would kill every run, and recording would stop for good.
So a dying run writes down where the rows of the batch it died on sit, and the next run commits each part
it is sent again that lies there in a batch of its own. A part that kills that run too, alone in its
batch, is committed by the run after one row a batch; the row that kills that run, alone, is dropped by
the next, logged and chained in the audit log, and the rest of its part is kept. A row is dropped only
after it killed a run alone, so a run killed from outside (a `kill -9`, the machine's OOM killer) loses
nothing, and neither do the other rows of a part that held a bad one.

A fault of the disk (full, read-only, failing: `is_disk_fault`) is no row's fault: the dying run writes no
failure down, so nothing is suspected and nothing dropped; the server pauses recording and starts the
service again with a growing wait, keeping every row (xdb/service/remote.py): in memory, or, with
`xdb.on_disk_full: spill`, the rows gathered meanwhile in files under `xdb.spill_dir` (xdb/service/spill.py).
"""

from __future__ import annotations

import errno
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import duckdb

from xdb.rows import TimestepRow, TokenBatch
from xdb.writer import Part, PartSpan, spans

FILE = "xdb-writer-failure.json"
log = logging.getLogger("ahc.xdb.service")
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.ENOMEM})
# DuckDB reports a failing write as an IOException whose text carries the system's message.
DISK_MESSAGES = ("no space left on device", "input/output error", "read-only file system",
                 "disk quota exceeded", "file too large")


def is_disk_fault(exc: BaseException | None) -> bool:
    """Whether a writer's failure (or anything that caused it) is the disk's, not a row's."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return True
        if isinstance(exc, (OSError, duckdb.IOException)) and any(m in str(exc).lower() for m in DISK_MESSAGES):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def rows_of(part: Part) -> list[Part]:
    """A part as parts of one row each (how a part that killed a run alone is committed next)."""
    if isinstance(part, TokenBatch):
        return [part.slice(i, i + 1) for i in range(len(part))]
    return [[row] for row in part]


def without(part: Part, gone: tuple[PartSpan, ...]) -> list[Part]:
    """The part's rows that lie outside `gone`, as parts."""
    def outside(session: str, tick: int) -> bool:
        return not any(session == s and first <= tick <= last for s, first, last in gone)
    if isinstance(part, TokenBatch):
        return [part.slice(i, i + 1) for i, tick in enumerate(part.ticks) if outside(part.session_id, int(tick))]
    kept: list[TimestepRow] = [row for row in part if outside(row.session_id, row.tick)]
    return [kept] if kept else []


@dataclass(frozen=True)
class WriterFailure:
    """`spans`: where the failed batch's rows sit; `alone`: the batch held one part sent again under
    suspicion, so that part is what kills the writer; with one row, that row."""

    spans: tuple[PartSpan, ...]
    alone: bool

    @property
    def one_row(self) -> bool:
        return len(self.spans) == 1 and self.spans[0][1] == self.spans[0][2]

    def holds(self, part: Part) -> bool:
        """Some row of `part` sits where the failed batch's rows did."""
        return any(session == s and first <= last_f and first_f <= last
                   for session, first, last in spans([part]) for s, first_f, last_f in self.spans)

    def write(self, data_dir: Path) -> None:
        """Durably, before the process exits: the next run reads it first."""
        path = data_dir / FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"spans": [list(span) for span in self.spans], "alone": self.alone}, f)
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def take(cls, data_dir: Path) -> WriterFailure | None:
        """The failure the previous run wrote down, if any; it is read once (the file is removed)."""
        path = data_dir / FILE
        try:
            data = json.loads(path.read_text())
            return cls(tuple((str(s), int(a), int(b)) for s, a, b in data["spans"]), bool(data["alone"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:  # cut short by a crash while it was written
            log.warning("%s cannot be read (%r): the parts sent again are taken as they come", path, exc)
            return None
        finally:
            path.unlink(missing_ok=True)
