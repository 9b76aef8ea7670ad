"""The audit log's session keys: `audit.keys` beside the log, a SQLite database with one row a key
(id, session, key, retired).

A session's records are sealed under its current key (xdb/audit/seal.py): its newest key not retired.
A deletion retires the session's keys first (every batch sealed after that takes a new key), and destroys
them once the deletion is committed. SQLite's `secure_delete` overwrites a destroyed key's bytes in the
file, and the write-ahead log is checkpointed and truncated after every destruction, so the key leaves
the disk's files. Keys are looked up by id or session through the database's indexes: opening the file
and destroying a session's keys cost the same with a thousand keys or a million, and SQLite's journal
keeps the file whole through a crash at any point of a write.

A key is committed (and fsynced) when it is made, before any record sealed under it is committed.

Logs from before this layout kept the keys in a text file of the same name, one line
`ID HEX_KEY JSON_SESSION_ID` after a first line `next N`; it is converted when the log is next opened
for writing (`convert_text_keys`), a torn last line (a crash between its write and its fsync, so no
record was ever sealed under it) dropped and reported. `cut_torn_tails` reports that drop with the cut of
a torn last line of the head file, which a log opened for writing chains.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

from xdb.audit.chain import HEAD_FILE, cut_torn_line
from xdb.private import fsync_path, private_files

log = logging.getLogger("ahc.xdb.audit")

KEYS_FILE = "audit.keys"
KEY_BYTES = 32
SQLITE_MAGIC = b"SQLite format 3\x00"
# Sessions whose current key is kept in memory: the recording sessions; a miss costs one indexed lookup.
CACHED_SESSIONS = 4096
# Ids a statement names at most (SQLite's default limit on a statement's parameters is 32,766).
ID_CHUNK = 900
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS keys (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
    "key BLOB NOT NULL, retired INTEGER NOT NULL DEFAULT 0)",
    "CREATE INDEX IF NOT EXISTS keys_by_session ON keys (session_id)",
)


def is_sqlite(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


class SessionKeys:
    """The keys of one audit log; thread-safe. `read_only` never writes (verification, reviewers)."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path, self.read_only = path, read_only
        self._lock = threading.Lock()
        self._current: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self.torn: str | None = None  # a torn last line dropped converting a text keys file
        self.exists = path.exists() and path.stat().st_size > 0
        if self.exists and not is_sqlite(path):
            if read_only:
                self._db = _text_keys_in_memory(path)
                return
            self.torn = convert_text_keys(path)
        if read_only and not self.exists:
            self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        elif read_only:
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False,
                                       isolation_level=None)
            return
        else:
            created = not path.exists()
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            _configure(self._db)
            private_files(path)
            if created:
                fsync_path(path.parent)
            self.exists = True
        for statement in SCHEMA:
            self._db.execute(statement)

    def keys_for(self, session_ids: list[str]) -> dict[str, tuple[int, bytes]]:
        """Each session's current key (id, key); those that have none get one now, committed to the file
        before this returns (so before any record sealed under it can be)."""
        with self._lock:
            found = {s: k for s in session_ids if (k := self._cached(s)) is not None}
            new = [s for s in session_ids if s not in found]
            if not new:
                return found
            if self.read_only:
                raise ValueError(f"{self.path} is open read-only: no key can be made for {new[0]!r}")
            made = {}
            with self._transaction():
                for session_id in new:
                    key = os.urandom(KEY_BYTES)
                    cur = self._db.execute("INSERT INTO keys (session_id, key) VALUES (?, ?)", (session_id, key))
                    assert cur.lastrowid is not None
                    made[session_id] = (int(cur.lastrowid), key)
            for session_id, entry in made.items():
                self._remember(session_id, entry)
            return {**found, **made}

    def _cached(self, session_id: str) -> tuple[int, bytes] | None:
        entry = self._current.get(session_id)
        if entry is not None:
            self._current.move_to_end(session_id)
            return entry
        row = self._db.execute("SELECT id, key FROM keys WHERE session_id = ? AND retired = 0 ORDER BY id DESC "
                               "LIMIT 1", (session_id,)).fetchone()
        if row is None:
            return None
        self._remember(session_id, (int(row[0]), bytes(row[1])))
        return self._current[session_id]

    def _remember(self, session_id: str, entry: tuple[int, bytes]) -> None:
        self._current[session_id] = entry
        self._current.move_to_end(session_id)
        while len(self._current) > CACHED_SESSIONS:
            self._current.popitem(last=False)

    def retire(self, session_id: str) -> list[int]:
        """Retire the session's keys (the next record of the session is sealed under a new one); returns
        every key of the session, retired before or now, for its deletion to destroy."""
        with self._lock:
            with self._transaction():
                self._db.execute("UPDATE keys SET retired = 1 WHERE session_id = ? AND retired = 0", (session_id,))
            self._current.pop(session_id, None)
            return self._session_keys(session_id)

    def session_keys(self, session_id: str) -> list[int]:
        with self._lock:
            return self._session_keys(session_id)

    def _session_keys(self, session_id: str) -> list[int]:
        return [int(k) for (k,) in self._db.execute("SELECT id FROM keys WHERE session_id = ? ORDER BY id",
                                                    (session_id,))]

    def secrets(self, key_ids: Iterable[int]) -> dict[int, bytes]:
        """The keys that still exist among `key_ids`."""
        return {k: key for k, key in self._select("id, key", key_ids) if isinstance(key, bytes)}

    def owners(self, key_ids: Iterable[int]) -> dict[int, str]:
        """The session of each key that still exists among `key_ids`."""
        return {k: str(session) for k, session in self._select("id, session_id", key_ids)}

    def _select(self, columns: str, key_ids: Iterable[int]) -> Iterator[tuple[int, object]]:
        ids = sorted({int(k) for k in key_ids})
        with self._lock:
            for start in range(0, len(ids), ID_CHUNK):
                chunk = ids[start:start + ID_CHUNK]
                marks = ",".join("?" * len(chunk))
                yield from self._db.execute(f"SELECT {columns} FROM keys WHERE id IN ({marks})", chunk).fetchall()

    def destroy(self, key_ids: list[int]) -> None:
        """Delete these keys, their bytes overwritten in the file and the write-ahead log truncated."""
        if not key_ids:
            return
        with self._lock:
            with self._transaction():
                for start in range(0, len(key_ids), ID_CHUNK):
                    chunk = key_ids[start:start + ID_CHUNK]
                    self._db.execute(f"DELETE FROM keys WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            gone = set(key_ids)
            for session_id in [s for s, (k, _) in self._current.items() if k in gone]:
                del self._current[session_id]

    def copy_to(self, dest: Path) -> None:
        """A consistent copy of the file (SQLite's online backup), private to this user."""
        with self._lock, closing(sqlite3.connect(dest)) as copy:
            self._db.backup(copy)
        private_files(dest)

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM keys").fetchone()[0])

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Transaction:
    """BEGIN IMMEDIATE … COMMIT (rolled back on an error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def _configure(db: sqlite3.Connection) -> None:
    # secure_delete: a deleted key's bytes are overwritten, not left in a free page; FULL: a commit is
    # fsynced before it returns.
    for pragma in ("journal_mode = WAL", "synchronous = FULL", "secure_delete = ON"):
        db.execute(f"PRAGMA {pragma}")


def read_text_keys(path: Path) -> tuple[list[tuple[int, str, bytes]], int, str | None]:
    """The key lines of a text keys file, its `next` id, and its torn last line (None if whole)."""
    text = path.read_bytes().decode("utf-8", "surrogateescape")
    torn = None
    if text and not text.endswith("\n"):
        text, _, torn = text.rpartition("\n")
    keys, next_id = [], 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            if line.startswith("next "):
                next_id = max(next_id, int(line[5:]))
                continue
            key_id, key, session = line.split(" ", 2)
            owner, secret = json.loads(session), bytes.fromhex(key)
            if len(secret) != KEY_BYTES or not isinstance(owner, str):
                raise ValueError
        except ValueError:
            raise ValueError(f"{path} line {n}: not a key line (ID HEX_KEY JSON_SESSION_ID)") from None
        keys.append((int(key_id), owner, secret))
        next_id = max(next_id, int(key_id) + 1)
    return keys, next_id, torn


def _load_text(db: sqlite3.Connection, keys: list[tuple[int, str, bytes]], next_id: int) -> None:
    for statement in SCHEMA:
        db.execute(statement)
    db.execute("BEGIN")
    db.executemany("INSERT INTO keys (id, session_id, key) VALUES (?, ?, ?)", keys)
    # A destroyed key's id is never given again: AUTOINCREMENT goes on from the text file's `next`.
    db.execute("DELETE FROM sqlite_sequence WHERE name = 'keys'")
    db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('keys', ?)", (next_id - 1,))
    db.execute("COMMIT")


def convert_text_keys(path: Path) -> str | None:
    """Rewrite a text keys file as the SQLite one, in place (a new file renamed over it); returns the torn
    last line it dropped, if any."""
    keys, next_id, torn = read_text_keys(path)
    tmp = path.with_name(path.name + ".new")
    tmp.unlink(missing_ok=True)
    with closing(sqlite3.connect(tmp, isolation_level=None)) as db:
        _configure(db)
        _load_text(db, keys, next_id)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode = DELETE")  # folded into the one file before the rename
    private_files(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)
    if torn is not None:
        log.warning("%s: dropped a torn last line (%d bytes): a key whose write a crash cut short, no record "
                    "sealed under it", path, len(torn))
    log.info("%s: converted %d session keys from the text layout", path, len(keys))
    return torn


def _text_keys_in_memory(path: Path) -> sqlite3.Connection:
    """A read-only view of a text keys file not yet converted (verifying a log no server has opened since)."""
    keys, next_id, _ = read_text_keys(path)
    db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    _load_text(db, keys, next_id)
    return db


def cut_torn_tails(head_path: Path, keys: SessionKeys) -> list[dict[str, Any]]:
    """Cut a torn last line off the head file (and note one dropped converting a text keys file): what a
    crash between a line's write and its fsync leaves. Each cut is logged here and chained at open."""
    repairs = []
    torn = cut_torn_line(head_path)
    if torn is not None:
        log.warning("audit head file %s ended in a torn line (%d bytes, a crash before its fsync): cut off; the "
                    "last whole line is the anchor", head_path, len(torn))
        repairs.append({"file": HEAD_FILE, "dropped_bytes": len(torn), "dropped": torn[:200]})
    if keys.torn is not None:
        repairs.append({"file": KEYS_FILE, "dropped_bytes": len(keys.torn)})
    return repairs
