"""Where a writer's rows wait while the disk under the data dir is full or failing (`xdb.on_disk_full: spill`).

The XDB service exits on a disk fault and the server pauses recording (xdb/service/remote.py). In `pause` mode every
row is held in memory, and past `max_queue_rows` the server answers 503. In `spill` mode the rows the writer
has not sent go here instead, to append-only segment files in `xdb.spill_dir` (a directory of this writer's
own under it: `owner` for the process that owns the service, `stream-PID-…` for an attached one), and the
server keeps serving. Once the service commits again, the segments are read back oldest first and sent
before any newer row; a segment's file is removed only once the service has committed its last row. The
owner's next start sends every segment left under `spill_dir` (a server stopped or killed while rows were
spilled), marked as sent before, so rows that were committed already are skipped, before it takes new rows.
A server stopped while the disk still fails writes the rows it held in memory to a segment numbered before
every other (`prepend`: they are older) and stops without waiting for the disk.

A segment is a header line (MAGIC) then records, each a length and CRC-32 then a pickled list of parts,
written and fsynced by the writer's sender thread (never the caller's). A record cut short by a crash ends
its segment's reading. The files hold tenants' prompts and replies: 0600 in 0700 directories
(xdb/private.py), and read back only from this user's own directory.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import threading
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from xdb.private import fsync_path, private_dir
from xdb.rows import TimestepRow, TokenBatch

log = logging.getLogger("ahc.xdb")

Part = list[TimestepRow] | TokenBatch
MAGIC = b"AHC-XDB-SPILL 1\n"
RECORD = struct.Struct("<QI")  # the pickled record's length and CRC-32
SUFFIX = ".spill"
OWNER = "owner"
# A segment is sealed (a new one begun) past this many rows: what replay reads into memory at once.
SEGMENT_ROWS = 16_384
# The first segment's number: those numbered below it hold rows older than every segment (`prepend`).
FIRST_SEQ = 10**9


def check_spill_dir(spill_dir: Path, data_dir: Path) -> None:
    """A clear config error for a spill dir inside the data dir (it fills with it); a warning for one on
    the same filesystem (it fills with it too, but a failing file there may still spare it)."""
    spill, data = spill_dir.resolve(), data_dir.resolve()
    if spill == data or data in spill.parents:
        raise ValueError(f"xdb.spill_dir {spill_dir} lies inside the data dir {data_dir}: it would fill with it; "
                         "name a directory on another disk (AHC_XDB__SPILL_DIR=...)")
    probe = spill
    while not probe.exists():
        probe = probe.parent
    if probe.stat().st_dev == data.stat().st_dev:
        log.warning("xdb.spill_dir %s is on the same filesystem as the data dir %s: a full disk fills both, and "
                    "recording then pauses; name a directory on another disk", spill_dir, data_dir)


@dataclass
class Segment:
    """One spill file: `rows` written to it; `resend`: left by an earlier run, so some of its rows may be
    committed already (the service skips those)."""

    path: Path
    rows: int
    resend: bool = False


class Spill:
    """One writer's spill directory: segments appended, then taken back oldest first."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.dir = private_dir(root / name)
        self._lock = threading.Lock()
        self._segments: deque[Segment] = deque()  # written, not taken back yet, oldest first
        self._file: BinaryIO | None = None  # the newest segment's, while it takes appends
        self._seq = max((_seq_of(p) for p in self.dir.glob(f"*{SUFFIX}")), default=FIRST_SEQ)

    @property
    def unread_rows(self) -> int:
        with self._lock:
            return sum(seg.rows for seg in self._segments)

    def adopt_leftovers(self) -> int:
        """Every segment a stopped or killed server left under the root (this directory's first, then each
        other's), to be sent before anything new; returns their rows."""
        dirs = [self.dir] + sorted(d for d in self.root.iterdir() if d.is_dir() and d != self.dir)
        found = 0
        with self._lock:
            for directory in dirs:
                for path in sorted(directory.glob(f"*{SUFFIX}"), key=_seq_of):
                    if path.stat().st_uid != os.geteuid():
                        log.error("spill file %s is not this user's: left alone", path)
                        continue
                    rows = sum(len(part) for part in read_segment(path))
                    if not rows:
                        path.unlink(missing_ok=True)
                        continue
                    self._segments.append(Segment(path, rows, resend=True))
                    found += rows
        return found

    def append(self, parts: list[Part]) -> None:
        """Write `parts` durably at the end (OSError when the spill dir fails: nothing of them is counted)."""
        rows = sum(len(part) for part in parts)
        if not rows:
            return
        data = pickle.dumps(parts, pickle.HIGHEST_PROTOCOL)
        with self._lock:
            segment = self._segments[-1] if self._file is not None and self._segments else None
            if segment is None or segment.rows >= SEGMENT_ROWS:
                segment = self._begin()
            assert self._file is not None
            start = self._file.tell()
            try:
                self._file.write(RECORD.pack(len(data), zlib.crc32(data)) + data)
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError:
                # A record cut short would end the segment's reading; later appends go to a new segment.
                self._seal()
                with open(segment.path, "r+b") as f:
                    f.truncate(start)
                raise
            segment.rows += rows

    def prepend(self, parts: list[Part]) -> None:
        """Write `parts`, older than every row spilled so far, to a segment read back before them all: the
        rows a writer held in memory when it stops while the disk still fails."""
        if not sum(len(part) for part in parts):
            return
        data = pickle.dumps(parts, pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._seal()
            seq = min((_seq_of(p) for p in self.dir.glob(f"*{SUFFIX}")), default=FIRST_SEQ) - 1
            path = self._create(seq)
            try:
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND), "ab") as f:
                    f.write(RECORD.pack(len(data), zlib.crc32(data)) + data)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError:
                path.unlink(missing_ok=True)
                raise

    def _create(self, seq: int) -> Path:
        """A new, empty segment file (its header only), durably named."""
        path = self.dir / f"{seq:012d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            os.write(fd, MAGIC)
            os.fsync(fd)
            fsync_path(self.dir)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return path

    def _begin(self) -> Segment:
        self._seal()
        self._seq += 1
        path = self._create(self._seq)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._file = os.fdopen(fd, "ab")
        segment = Segment(path, 0)
        self._segments.append(segment)
        return segment

    def _seal(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError:
                log.exception("closing spill segment failed")

    def take(self) -> tuple[Segment, list[Part]] | None:
        """The oldest segment not taken yet and its parts (sealed first if it takes appends), or None."""
        with self._lock:
            if not self._segments:
                return None
            if len(self._segments) == 1 and self._file is not None:
                self._seal()
            segment = self._segments[0]
            parts = read_segment(segment.path)
            self._segments.popleft()
        return segment, parts

    def remove(self, segment: Segment) -> None:
        """A segment whose rows are all committed; an adopted directory left empty goes too."""
        segment.path.unlink(missing_ok=True)
        directory = segment.path.parent
        if directory != self.dir:
            try:
                directory.rmdir()
            except OSError:
                pass  # not empty yet

    def close(self) -> None:
        """Stop appending; an attached writer's directory, left empty, is removed."""
        with self._lock:
            self._seal()
        if self.dir.name != OWNER:
            try:
                self.dir.rmdir()
            except OSError:
                pass  # rows left: the owner's next start sends them


def read_segment(path: Path) -> list[Part]:
    """A segment's parts in the order written, up to the first record cut short."""
    parts: list[Part] = []
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            log.error("spill file %s has no spill header: skipped", path)
            return parts
        while True:
            head = f.read(RECORD.size)
            if len(head) < RECORD.size:
                break
            size, crc = RECORD.unpack(head)
            data = f.read(size)
            if len(data) < size or zlib.crc32(data) != crc:
                log.warning("spill file %s ends in a record cut short (a crash while it was written)", path)
                break
            record: list[Part] = pickle.loads(data)
            for part in record:
                if isinstance(part, TokenBatch):  # activations are not waited for: their time has passed
                    part.join_by = 0.0
            parts.extend(record)
    return parts


def _seq_of(path: Path) -> int:
    try:
        return int(path.name.removesuffix(SUFFIX))
    except ValueError:
        return 0
