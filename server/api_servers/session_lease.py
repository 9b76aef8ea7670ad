"""Session leases across the API processes: one turn of a session at a time, whichever process takes it,
and word to a process when another one served the session since it last did.

With several API processes on one socket, any request of a session may land in any process, and each
process caches the session's State and its next tick. So a turn (1) must exclude the session's turns in
every other process, and (2) must know whether its cached State is still the session's: if another
process took a turn in between, the cache is stale and is dropped (the State is read from the store).

Locks. The supervisor makes a directory of `stripes` lock files (4096 by default) and one epoch table.
A session maps to a stripe by blake2b of its id (stable across processes, unlike Python's salted
`hash`). A lease is `flock(LOCK_EX)` on the stripe's file through a file descriptor opened for that one
lease: flock locks belong to the open file description, so two leases in one process exclude each other
as two processes' do (POSIX record locks, `lockf`, belong to the process: it would take the same stripe
twice and one release would free the other's). The kernel drops the lock when its holder dies, even by
kill -9, as it closes the holder's descriptors. An uncontended lease costs open + flock(LOCK_NB), no
thread; a contended one waits in a thread of this module's own pool, never the event loop's default
executor: a turn holding its lease may need `asyncio.to_thread` to finish (loading a State), and
waiters must not take every thread it could use. Hold one lease at a time in a task (two, taken in
varying order, could deadlock), and do not fork while holding one (the child shares the lock).

Epochs. The epoch table is an mmap of one 16-byte slot per stripe, (pid of the last taker, counter),
read and written only under the stripe's lock. Taking a lease bumps the counter — at acquisition, not
release, so a holder killed in mid-turn has counted as a taker (it may have saved the State before
dying). Each process remembers, per stripe, the counter it last wrote, and when it finds another value
there it notes that another process took the stripe ("foreign" up to that counter); per session it
remembers the counter of its own last lease. A lease is `moved` when a foreign taking of the stripe is
newer than this process's last lease of the session, or, for a session this process does not remember
(never held, or forgotten past `max_remembered`), when any foreign taking of the stripe is known.

Collisions. Sessions sharing a stripe share its lock and its counter: a turn may wait for another
session's, and another process serving a colliding session marks this one `moved` too, which only costs
a reload of the State from the store. A move is never missed: any taking of the stripe by another
process after this process's last lease of the session leaves the counter different from what this
process last wrote, which it sees at its next lease of the stripe, whichever session that is for.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import mmap
import os
import struct
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

EPOCHS = "epochs"
STRIPES = 4096
_MAGIC = b"AHCLEASE"
_HEADER = struct.Struct("<8sq")  # magic, stripes
_SLOT = struct.Struct("<qq")  # pid of the last taker, counter (0: never taken)
_WAITERS = 64  # threads of one process waiting for contended stripes at once; more queue behind them


def _stripe_file(directory: Path, stripe: int) -> Path:
    return directory / f"stripe-{stripe:05d}"


class Lease:
    """One held session lease. `release()` (idempotent) frees it; also a context manager."""

    __slots__ = ("session_id", "stripe", "moved", "previous_pid", "waited", "_fd")

    def __init__(self, session_id: str, stripe: int, moved: bool, previous_pid: int, waited: bool,
                 fd: int) -> None:
        self.session_id = session_id
        self.stripe = stripe
        self.moved = moved  # another process may have served the session since this one last did
        self.previous_pid = previous_pid  # the stripe's last taker (0: none), for logs
        self.waited = waited  # the stripe was held when asked for
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            warnings.warn(f"session lease for {self.session_id!r} dropped unreleased", ResourceWarning,
                          stacklevel=1)
            self.release()

    def __repr__(self) -> str:
        return f"Lease({self.session_id!r}, stripe={self.stripe}, moved={self.moved}, held={self.held})"


class SessionLeases:
    """One process's handle on the leases directory made by `SessionLeases.create`."""

    def __init__(self, directory: str | os.PathLike[str], max_remembered: int = 1 << 17) -> None:
        self.directory = Path(directory)
        fd = os.open(self.directory / EPOCHS, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        magic, stripes = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC or len(self._map) != _HEADER.size + stripes * _SLOT.size:
            self._map.close()
            raise ValueError(f"{self.directory / EPOCHS} is not a session lease table")
        self.stripes: int = stripes
        self._paths = [os.fsencode(_stripe_file(self.directory, i)) for i in range(stripes)]
        self.max_remembered = max_remembered
        self._book = threading.Lock()  # the dicts below, touched by the event loop and by waiter threads
        self._pid = os.getpid()
        self._written: dict[int, int] = {}  # stripe -> the counter this process last wrote there
        self._foreign: dict[int, int] = {}  # stripe -> the newest counter known written by another process
        self._sessions: dict[str, int] = {}  # session -> the counter of this process's last lease of it
        self._pool: ThreadPoolExecutor | None = None

    @staticmethod
    def create(directory: str | os.PathLike[str], stripes: int = STRIPES) -> Path:
        """Make (or remake, every counter at zero) the leases directory; called by the supervisor before
        the API processes start. Returns the directory, to pass to each process."""
        if stripes < 1:
            raise ValueError("stripes must be at least 1")
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        for stripe in range(stripes):
            _stripe_file(path, stripe).touch()
        staging = path / f".{EPOCHS}.{os.getpid()}"
        staging.write_bytes(_HEADER.pack(_MAGIC, stripes) + bytes(stripes * _SLOT.size))
        os.replace(staging, path / EPOCHS)  # last: a process that finds the table finds every stripe
        return path

    def stripe(self, session_id: str) -> int:
        digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.stripes

    async def acquire(self, session_id: str) -> Lease:
        """Wait for the session's lease. Cancelling the wait leaves nothing held."""
        stripe = self.stripe(session_id)
        fd = os.open(self._paths[stripe], os.O_RDONLY | os.O_CLOEXEC)
        waited = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            await self._wait(fd)  # on failure or cancellation it has seen to the descriptor
        except BaseException:
            os.close(fd)
            raise
        return self._take(session_id, stripe, fd, waited)

    def acquire_blocking(self, session_id: str) -> Lease:
        """`acquire` for a thread (not the event loop's): blocks until the lease is held."""
        stripe = self.stripe(session_id)
        fd = os.open(self._paths[stripe], os.O_RDONLY | os.O_CLOEXEC)
        waited = False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return self._take(session_id, stripe, fd, waited)

    async def _wait(self, fd: int) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_WAITERS, thread_name_prefix="session-lease")
        waiting: Future[None] = self._pool.submit(fcntl.flock, fd, fcntl.LOCK_EX)
        try:
            await asyncio.wrap_future(waiting)
        except BaseException:
            # Cancelled or failed. A thread still blocked in flock uses the descriptor: it is closed
            # (and a lock got late released with it) once that thread is done, never under it.
            if waiting.cancel():
                os.close(fd)
            else:
                waiting.add_done_callback(lambda _: os.close(fd))
            raise

    def _take(self, session_id: str, stripe: int, fd: int, waited: bool) -> Lease:
        """Holding the stripe's lock: read and bump its epoch, decide `moved`."""
        try:
            offset = _HEADER.size + stripe * _SLOT.size
            previous_pid, counter = _SLOT.unpack_from(self._map, offset)
            pid = os.getpid()
            with self._book:
                if pid != self._pid:  # a forked child: what the parent wrote is not this process's
                    self._pid = pid
                    self._written.clear()
                    self._foreign.clear()
                    self._sessions.clear()
                if counter != self._written.get(stripe, 0):
                    self._foreign[stripe] = counter
                moved = self._foreign.get(stripe, 0) > self._sessions.pop(session_id, 0)
                _SLOT.pack_into(self._map, offset, pid, counter + 1)
                self._written[stripe] = self._sessions[session_id] = counter + 1
                if len(self._sessions) > self.max_remembered:  # the oldest half: unknown now, so moved
                    for old in list(self._sessions)[: len(self._sessions) // 2]:  # on any foreign taking
                        del self._sessions[old]
        except BaseException:
            os.close(fd)
            raise
        return Lease(session_id, stripe, moved, previous_pid, waited, fd)

    def close(self) -> None:
        """Unmap the table and stop the waiter threads (after their waits end); held leases stay held."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._map.close()
