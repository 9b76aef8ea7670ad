"""The admission board shared by the API processes: every process's KV reservations, and the engine's KV
figures, in one small mmap'd file.

Each API process runs its own VRAM governor, which reserves the blocks of the requests it admits until
the engine's usage figure shows them. Alone, a governor would see only its own reservations and N
processes could together admit N times what the cache holds; so each publishes its reserved count in its
own slot (`publish_reserved`, after every change) and adds the others' (`others_reserved`) to what it
counts as taken. And vLLM sends its scheduler stats (the KV usage) to API process 0 alone: process 0
publishes them (`publish_kv`, every engine step) and the others copy them (`read_kv`) before deciding.

Concurrency, without locks. A reserved count is one aligned int64 written by its own process only: a
reader sees the old value or the new one. The KV record has one writer (process 0) and is a seqlock in
its double-buffered form (a "latch"): two copies of the record, each stamped with its sequence and a
CRC of (sequence, fields), and a version naming the newest whole one. The writer fills the copy the
version does not name, then bumps the version; a reader reads the version, then the copy it names, and
takes it only if that copy's stamp is the version and its CRC matches, else reads again. So readers
never wait on a write in progress (a plain seqlock's odd counter would make them spin through every
write, and a writer publishing in a tight loop could starve them), a writer killed in mid-write leaves
the last whole record readable, and a record is never taken torn, not even where the CPU does not keep
the writer's stores in order (Python has no memory fence): fields of two writes, or a stamp of another
write than theirs, fail the check. A reader fails only when the writer laps it (two writes during one
read), and then reads again, a bounded number of times.

A process killed -9 leaves its reserved count behind, holding blocks no request uses: the supervisor
calls `clear(index)` when it sees a worker die, and a worker opening its slot (`SharedBoard(path, i)`)
zeroes it too, as its governor starts with nothing reserved.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.admission.vram_governor import KVStats

_MAGIC = b"AHCBOARD"
_HEADER = struct.Struct("<8sq")  # magic, processes
# The version and the reserved counts are read and written through memoryviews, each one aligned 8-byte
# load or store: struct's pack_into zeroes its span before it writes the fields (and its standard "<"
# forms go byte by byte), so a reader could see a version or a count at zero or half written. The copies
# may be packed so: their CRC catches it.
_VERSION_AT = 64  # the sequence of the newest whole copy of the KV record (0: none yet)
_COPIES_AT = (72, 120)  # copy `sequence % 2` holds the record of that sequence
_KV = struct.Struct("Qqqdqq")  # sequence, total_blocks, block_size, usage, bytes_per_block, crc
_FIGURES = struct.Struct("Qqqdq")  # what the CRC covers: the sequence and the fields
_SLOTS_AT = 192  # one int64 per process from here
_SPINS = 100  # reads of a record lapped by its writer before giving up (a write takes ~1 us)


def _crc(sequence: int, total_blocks: int, block_size: int, usage: float, bytes_per_block: int) -> int:
    return zlib.crc32(_FIGURES.pack(sequence, total_blocks, block_size, usage, bytes_per_block))


class SharedBoard:
    """One process's view of the board. `index`: its slot (None: the supervisor, which owns no slot)."""

    def __init__(self, path: str | os.PathLike[str], index: int | None = None) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        magic, processes = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC or len(self._map) != _SLOTS_AT + 8 * processes:
            self._map.close()
            raise ValueError(f"{self.path} is not an admission board")
        if index is not None and not 0 <= index < processes:
            self._map.close()
            raise ValueError(f"process index {index} out of 0..{processes - 1}")
        self.processes: int = processes
        self.index = index
        self._version = memoryview(self._map)[_VERSION_AT:_VERSION_AT + 8].cast("Q")
        self._slots = memoryview(self._map)[_SLOTS_AT:].cast("q")
        if index is not None:
            self._slots[index] = 0

    @classmethod
    def create(cls, path: str | os.PathLike[str], processes: int) -> SharedBoard:
        """Make (or remake, empty) the board for `processes` API processes; called by the supervisor
        before they start. Returns the supervisor's view (no slot of its own)."""
        if processes < 1:
            raise ValueError("processes must be at least 1")
        path = Path(path)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.write_bytes(_HEADER.pack(_MAGIC, processes).ljust(_SLOTS_AT, b"\0") + bytes(8 * processes))
        os.replace(staging, path)
        return cls(path)

    def publish_reserved(self, blocks: int) -> None:
        """This process's governor's reserved blocks, after each change."""
        if self.index is None:
            raise RuntimeError("the supervisor's view of the board has no slot to publish in")
        self._slots[self.index] = blocks

    def others_reserved(self) -> int:
        """The blocks every other process has reserved (for the supervisor: every process)."""
        total = sum(self._slots)
        return total if self.index is None else total - self._slots[self.index]

    def clear(self, index: int) -> None:
        """Forget process `index`'s reservations: it died (the supervisor saw it) and holds nothing."""
        self._slots[index] = 0

    def publish_kv(self, stats: KVStats) -> None:
        """The engine's KV figures, by the one process that receives its scheduler stats."""
        sequence = self._version[0] + 1
        figures = (stats.total_blocks, stats.block_size, float(stats.usage), stats.bytes_per_block)
        _KV.pack_into(self._map, _COPIES_AT[sequence % 2], sequence, *figures, _crc(sequence, *figures))
        self._version[0] = sequence

    def read_kv(self, into: KVStats) -> bool:
        """Copy the engine's KV figures into `into`. False, leaving it as it was, when none were published
        yet (or, very unlikely, the writer kept lapping this reader through a short spin)."""
        for spin in range(_SPINS):
            version = self._version[0]
            if version == 0:
                return False
            sequence, total_blocks, block_size, usage, bytes_per_block, crc = _KV.unpack_from(
                self._map, _COPIES_AT[version % 2])
            if sequence == version and crc == _crc(sequence, total_blocks, block_size, usage, bytes_per_block):
                into.total_blocks, into.block_size = total_blocks, block_size
                into.usage, into.bytes_per_block = usage, bytes_per_block
                return True
            if spin >= 8:
                time.sleep(0)
        return False

    def kv_version(self) -> int:
        """The KV record's sequence: it changes with every `publish_kv` (0: none yet)."""
        return int(self._version[0])

    def close(self) -> None:
        self._version.release()
        self._slots.release()
        self._map.close()
