"""The conversations table (`orchestrator.conversations.Conversations`) shared by several API processes.

When `ahc serve` runs several API processes on one listening socket, a session's successive requests land
on any of them; with a table in each process's memory each would infer a session of its own from the same
resent history and split the conversation. `SharedConversations` keeps the same table, with the same
semantics, in one SQLite file that every process opens: WAL so readers never wait for the writer, a busy
timeout so writers queue rather than fail, and `synchronous=OFF` since the file is a cache for the server's
lifetime (it lives in the server's temporary directory and goes with it), never worth an fsync.

Each call is a few statements prepared once: `find` one indexed lookup of the request's heads (the last
few first, where a continued conversation's head is, so a hit is usually one short query), writing only
when it changes the order of use (the tenant or the head not already the most recent, which a conversation
just advanced is); `advance` one short `BEGIN IMMEDIATE` transaction. Orders of use are counters kept in
the file (one per tenant for its heads, one across tenants), so every process sees and extends the same
least-recently-used order.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from orchestrator.conversations import MAX_TENANTS

# How long a writer waits for another process's transaction before failing; each lasts microseconds, so
# only a stalled process would ever make one wait this long.
BUSY_TIMEOUT_S = 10.0

# The request's last heads looked up first: a request that continues a conversation resends its latest
# head as one of its last few messages (the reply, then the new question or tool results).
_FIRST_CHUNK = 8
# The rest are looked up in chunks padded to one of a few sizes (so a few statements serve every length and
# stay prepared), each well under SQLite's parameter limit wherever it was built.
_LARGEST_CHUNK = 512


class ConversationTable(Protocol):
    """What the orchestrator asks of a conversations table: `Conversations` in one process's memory, or
    `SharedConversations` across processes."""

    def find(self, heads: list[str], tenant: str = "") -> tuple[str, int] | None: ...

    def seen(self, session_id: str, heads: list[str], tenant: str = "") -> int | None: ...

    def advance(self, session_id: str, head: str, asked: str | None = None, tenant: str = "") -> None: ...


class SharedConversations:
    """`Conversations` (see there for what each call means) kept in the SQLite file at `path`, which any
    number of processes open at once; `name` keeps tables apart that share a file (the inferred and the
    named sessions' tables). Each process has its own connection (a forked child opens one of its own, a
    SQLite connection must not cross a fork), used under a lock from any thread."""

    def __init__(self, path: str | os.PathLike[str], capacity: int, max_tenants: int = MAX_TENANTS,
                 name: str = "conversations") -> None:
        if not name.isidentifier():
            raise ValueError(f"table name {name!r} is not an identifier")
        self.path = os.fspath(path)
        self.name = name
        self.capacity = max(capacity, 1)
        self.max_tenants = max(max_tenants, 1)
        self._sql = _Statements(name)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = self._connect()
        _OPEN.add(self)

    def _connection(self) -> sqlite3.Connection:
        """This process's connection (a forked child opens its own on its first call)."""
        db = self._db
        if db is None:
            db = self._db = self._connect()
        return db

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False,
                             cached_statements=64)
        # Switching a new file to WAL takes its lock without waiting for the busy timeout (processes
        # opening it at once find it locked), so that one step is retried until the same deadline.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                    break
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    db.close()
                    raise
            if time.monotonic() > deadline:
                db.close()
                raise sqlite3.OperationalError(f"{self.path}: could not switch to WAL")
            time.sleep(0.001)
        db.execute("PRAGMA synchronous=OFF")
        with _transaction(db):
            for statement in self._sql.schema:
                db.execute(statement)
        return db

    def close(self) -> None:
        with self._lock:
            _OPEN.discard(self)
            if self._db is not None:
                self._db.close()

    def find(self, heads: list[str], tenant: str = "") -> tuple[str, int] | None:
        """As `Conversations.find`."""
        sql = self._sql
        with self._lock:
            db = self._connection()
            row = db.execute(sql.tenant, (tenant,)).fetchone()
            if row is None:
                return None
            tenant_id, used, latest_used, clock, _ = row
            found: tuple[str, int] | None = None
            head_used = clock
            hi = len(heads)
            while hi > 0 and found is None:
                lo = max(hi - (_FIRST_CHUNK if hi == len(heads) else _LARGEST_CHUNK), 0)
                chunk = heads[lo:hi]
                size = _padded(len(chunk))
                chunk += chunk[-1:] * (size - len(chunk))
                best = -1
                for head, session_id, row_used in db.execute(sql.find[size], (*chunk, tenant_id)):
                    index = _last_index(heads, head, lo, hi)
                    if index > best:
                        best, found, head_used = index, (session_id, index + 1), row_used
                hi = lo
            # What `Conversations` does to its orders of use, written only when it changes them.
            if used != latest_used or head_used != clock:
                with _transaction(db):
                    if used != latest_used:
                        db.execute(sql.touch_tenant, (tenant_id,))
                    if found is not None and head_used != clock:
                        now = db.execute(sql.tick, (tenant_id,)).fetchone()[0]
                        db.execute(sql.touch_head, (now, tenant_id, heads[best], found[0]))
            return found

    def seen(self, session_id: str, heads: list[str], tenant: str = "") -> int | None:
        """As `Conversations.seen`."""
        with self._lock:
            row = self._connection().execute(self._sql.seen, (tenant, session_id)).fetchone()
        if row is not None:
            for head in row:
                if head is not None:
                    index = _last_index(heads, head, 0, len(heads))
                    if index >= 0:
                        return index + 1
        return None

    def advance(self, session_id: str, head: str, asked: str | None = None, tenant: str = "") -> None:
        """As `Conversations.advance`."""
        sql = self._sql
        with self._lock, _transaction(self._connection()) as db:
            row = db.execute(sql.tenant, (tenant,)).fetchone()
            if row is None:
                tenant_id = db.execute(sql.add_tenant, (tenant,)).fetchone()[0]
                size = clock = 0
                self._drop_tenants(db)
            else:
                tenant_id, used, latest_used, clock, size = row
                if used != latest_used:
                    db.execute(sql.touch_tenant, (tenant_id,))
            size -= db.execute(sql.drop_previous, (tenant_id, session_id)).rowcount
            stale = db.execute(sql.take_head, (tenant_id, head)).fetchone()  # a session that ended on the same messages
            if stale is not None:
                size -= 1
                db.execute(sql.forget_head, (tenant_id, stale[0]))
            clock += 1
            db.execute(sql.add_head, (tenant_id, head, session_id, clock))
            db.execute(sql.set_latest, (tenant_id, session_id, head, asked))
            size += 1
            if size > self.capacity:
                dropped = db.execute(sql.trim, (tenant_id, size - self.capacity - 1)).fetchall()
                db.executemany(sql.drop_latest, [(tenant_id, session) for session, in dropped])
                size -= len(dropped)
            db.execute(sql.set_size, (size, clock, tenant_id))

    def _drop_tenants(self, db: sqlite3.Connection) -> None:
        """The least recently heard-from tenants' tables, past `max_tenants`."""
        sql = self._sql
        excess = db.execute(sql.count_tenants).fetchone()[0] - self.max_tenants
        if excess > 0:
            for tenant_id, in db.execute(sql.oldest_tenants, (excess,)).fetchall():
                for statement in sql.drop_tenant:
                    db.execute(statement, (tenant_id,))


class _Statements:
    """Every statement of one table, built once (the sqlite3 module keeps each prepared by its text)."""

    def __init__(self, name: str) -> None:
        tenants, heads, latest = f"{name}_tenants", f"{name}_heads", f"{name}_latest"
        self.schema = (
            # A tenant's id (never reused: a process may still hold a dropped tenant's), its place in the
            # order of use across tenants, how many heads it holds and its heads' last order of use.
            f"CREATE TABLE IF NOT EXISTS {tenants} (id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL"
            " UNIQUE, used INTEGER NOT NULL, size INTEGER NOT NULL, clock INTEGER NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {tenants}_used ON {tenants} (used)",
            # Each latest head: the session it continues and its place in its tenant's order of use.
            f"CREATE TABLE IF NOT EXISTS {heads} (tenant INTEGER NOT NULL, head TEXT NOT NULL, session_id TEXT"
            " NOT NULL, used INTEGER NOT NULL, PRIMARY KEY (tenant, head)) WITHOUT ROWID",
            f"CREATE INDEX IF NOT EXISTS {heads}_used ON {heads} (tenant, used)",
            # Each session's latest head (none once another session ended on it) and last request's head.
            f"CREATE TABLE IF NOT EXISTS {latest} (tenant INTEGER NOT NULL, session_id TEXT NOT NULL, head TEXT,"
            " asked TEXT, PRIMARY KEY (tenant, session_id)) WITHOUT ROWID",
        )
        self.tenant = (f"SELECT id, used, (SELECT max(used) FROM {tenants}), clock, size FROM {tenants}"
                       " WHERE tenant = ?")
        # The heads given that are latest heads: one index search each, in the order given (a VALUES list
        # searched in turn costs less than an IN list, which is sorted into a temporary index first).
        self.find = {size: f"SELECT h.head, h.session_id, h.used FROM (VALUES {', '.join(['(?)'] * size)}) v"
                           f" CROSS JOIN {heads} h ON h.tenant = ? AND h.head = v.column1" for size in _sizes()}
        self.touch_tenant = f"UPDATE {tenants} SET used = (SELECT max(used) FROM {tenants}) + 1 WHERE id = ?"
        # A head made its tenant's most recently used: the tenant's clock moved on, then the head set to it.
        self.tick = f"UPDATE {tenants} SET clock = clock + 1 WHERE id = ? RETURNING clock"
        self.touch_head = f"UPDATE {heads} SET used = ? WHERE tenant = ? AND head = ? AND session_id = ?"
        self.seen = (f"SELECT l.head, l.asked FROM {latest} l JOIN {tenants} t ON l.tenant = t.id"
                     " WHERE t.tenant = ? AND l.session_id = ?")
        self.add_tenant = (f"INSERT INTO {tenants} (tenant, used, size, clock) VALUES"
                           f" (?, coalesce((SELECT max(used) FROM {tenants}), 0) + 1, 0, 0) RETURNING id")
        self.count_tenants = f"SELECT count(*) FROM {tenants}"
        self.oldest_tenants = f"SELECT id FROM {tenants} ORDER BY used LIMIT ?"
        self.drop_tenant = (f"DELETE FROM {heads} WHERE tenant = ?", f"DELETE FROM {latest} WHERE tenant = ?",
                            f"DELETE FROM {tenants} WHERE id = ?")
        # The session's latest head, which it leaves.
        self.drop_previous = (f"DELETE FROM {heads} WHERE tenant = ?1 AND session_id = ?2 AND head ="
                              f" (SELECT head FROM {latest} WHERE tenant = ?1 AND session_id = ?2)")
        self.take_head = f"DELETE FROM {heads} WHERE tenant = ? AND head = ? RETURNING session_id"
        self.forget_head = f"UPDATE {latest} SET head = NULL WHERE tenant = ? AND session_id = ?"
        self.add_head = f"INSERT INTO {heads} (tenant, head, session_id, used) VALUES (?, ?, ?, ?)"
        self.set_latest = (f"INSERT INTO {latest} (tenant, session_id, head, asked) VALUES (?, ?, ?, ?)"
                           " ON CONFLICT DO UPDATE SET head = excluded.head, asked = coalesce(excluded.asked, asked)")
        # The `n + 1` least recently used heads (`used` is unique within a tenant).
        self.trim = (f"DELETE FROM {heads} WHERE tenant = ?1 AND used <= (SELECT used FROM {heads} WHERE tenant = ?1"
                     " ORDER BY used LIMIT 1 OFFSET ?2) RETURNING session_id")
        self.drop_latest = f"DELETE FROM {latest} WHERE tenant = ? AND session_id = ?"
        self.set_size = f"UPDATE {tenants} SET size = ?, clock = ? WHERE id = ?"


def _sizes() -> list[int]:
    return [1, 2, 4, 8, 16, *range(32, _LARGEST_CHUNK + 1, 32)]


def _padded(n: int) -> int:
    """The statement size that takes `n` heads: a power of two to 16, then a multiple of 32 (a padded
    place costs a lookup, a statement size one more prepared statement)."""
    return 1 << (n - 1).bit_length() if n <= 16 else -(-n // 32) * 32


def _last_index(heads: list[str], head: str, lo: int, hi: int) -> int:
    """The last index of `head` in `heads[lo:hi]`, -1 if absent (a chain's heads are distinct, so this is
    its only one; the last is what `Conversations` finds)."""
    window = heads[lo:hi]
    window.reverse()
    try:
        return hi - 1 - window.index(head)
    except ValueError:
        return -1


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction, holding the file's write lock from its start: one that began as a read would
    fail, not wait, on finding that another process wrote meanwhile."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


# Every open table, for a forked child to open anew. The child keeps its parent's connections and never
# uses or closes them: SQLite's locks and write-ahead log state do not survive the copy, and closing one
# there could act on the log as if the parent had let go of it.
_OPEN: weakref.WeakSet[SharedConversations] = weakref.WeakSet()
_INHERITED: list[sqlite3.Connection] = []


def _forget_after_fork() -> None:
    for table in list(_OPEN):
        if table._db is not None:
            _INHERITED.append(table._db)
        table._db = None
        table._lock = threading.Lock()  # held, perhaps, by a parent's thread that the child does not have


os.register_at_fork(after_in_child=_forget_after_fork)
