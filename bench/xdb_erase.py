"""What `ahc bench xdb` measures of storage: bytes on disk a recorded token (the experience file and the
audit log, written through the real writer by bench/audit_bytes.py), and a deletion's erasure while
recording goes on — the seconds until a deleted session's text is in no file under the data dir
(`erase_s`: the deletion, then the experience file rewritten whole by the XDB service's vacuum), and the
p99 commit wait a recording stream sees meanwhile against the same stream's idle p99.

The deleted session's rows carry a marker text no other row has, so "in no file" is checked by reading
every file under the data dir for its bytes.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import numpy as np

from bench.audit_bytes import sizes, write
from core.config import XDBConfig
from xdb import TimestepRow
from xdb.service.remote_xdb import RemoteXDB

IDLE_S = 2.0  # the recording stream's idle commit waits are taken over this long before the deletion
COMMIT_EVERY_S = 0.05  # the recording stream submits a row and waits for its commit this often


def storage_figures(work: Path, tokens: int) -> dict[str, float]:
    """bytes_per_token and audit_bytes_share over `tokens` generated tokens, then the erasure figures on
    the same data dir."""
    data = work / "storage"
    seconds = write(data, tokens)
    files = sizes(data)
    audit = sum(v for k, v in files.items() if k.startswith("audit/"))
    experience = sum(v for k, v in files.items() if k.startswith("experience.duckdb"))
    figures = {"bytes_per_token": round((audit + experience) / tokens, 1),
               "audit_bytes_share": round(audit / max(audit + experience, 1), 3),
               "storage_write_s": round(seconds, 1)}
    figures.update(erase_figures(data))
    return figures


def erase_figures(data: Path) -> dict[str, float]:
    marker = f"ERASE-ME-{uuid.uuid4().hex}"
    with RemoteXDB(data, XDBConfig(vacuum_max_bytes=None)) as xdb:
        victim = "bench-erased-session"
        xdb.writer.submit([TimestepRow(victim, tick, "input", "user", f"{marker} {tick}")
                           for tick in xdb.next_ticks(victim, 100)])
        xdb.writer.flush()
        stream = CommitWaits(xdb)
        stream.start()
        time.sleep(IDLE_S)
        idle = stream.waits_ms()
        started = time.monotonic()
        xdb.delete_session(victim)
        xdb.vacuum()
        erase_s = time.monotonic() - started
        stream.stop()  # the commit the erasure held up ends now: it counts as during
        during = stream.waits_ms()[len(idle):]
    left = [name for name, _ in sizes(data).items() if marker.encode() in (data / name).read_bytes()]
    if left:
        raise RuntimeError(f"xdb bench: the deleted session's text is still in {', '.join(left)}")
    return {"erase_s": round(erase_s, 3),
            "erase_commit_wait_p99_ms": round(float(np.percentile(during or [0.0], 99)), 1),
            "idle_commit_wait_p99_ms": round(float(np.percentile(idle or [0.0], 99)), 1)}


class CommitWaits(threading.Thread):
    """A recording stream: a row every COMMIT_EVERY_S, each waited for until committed; the waits in ms."""

    def __init__(self, xdb: RemoteXDB) -> None:
        super().__init__(name="bench-commit-waits", daemon=True)
        self.xdb, self._waits, self._stopping = xdb, list[float](), threading.Event()

    def run(self) -> None:
        session = "bench-recording-stream"
        while not self._stopping.is_set():
            started = time.perf_counter()
            self.xdb.writer.submit([TimestepRow(session, self.xdb.next_ticks(session)[0], "system", None, "tick")])
            self.xdb.writer.flush()
            self._waits.append((time.perf_counter() - started) * 1000)
            self._stopping.wait(COMMIT_EVERY_S)

    def waits_ms(self) -> list[float]:
        return list(self._waits)

    def stop(self) -> None:
        self._stopping.set()
        self.join()
