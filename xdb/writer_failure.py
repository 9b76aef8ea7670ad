"""The batch the XDB service's writer died on, told to the service's next run.

A part the writer cannot store (a fault no check where rows are accepted catches) kills the writer; the
service exits and the server starts another run, sending it every part not yet committed
(xdb/remote.py). Sent again as it was, that part would kill every run, and recording would stop for good.
So a dying run writes down where the rows of the batch it died on sit, and the next run commits each part
it is sent again that lies there in a batch of its own. A part that kills that run too, alone in its
batch, is the one: the run after drops it, once, logged and chained in the audit log, and takes the
rest. A part is dropped only after it killed two runs, the second time alone, so a run killed from
outside (a `kill -9`, the machine's OOM killer) loses nothing.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from xdb.writer import Part, PartSpan, spans

FILE = "xdb-writer-failure.json"
log = logging.getLogger("ahc.xdb.service")


@dataclass(frozen=True)
class WriterFailure:
    """`spans`: where the failed batch's rows sit; `alone`: the batch held one part sent again under
    suspicion, so that part is what kills the writer."""

    spans: tuple[PartSpan, ...]
    alone: bool

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
