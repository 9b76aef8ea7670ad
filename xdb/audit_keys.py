"""The audit log's session keys: `audit.keys` beside the log, one line `ID HEX_KEY JSON_SESSION_ID` per
key, after a first line `next N` (the next key id, so a destroyed key's id is never given again).

A session's records are sealed under its current key (xdb/audit_seal.py). Deleting the session destroys
its keys: the file is written anew without them and renamed over the old one, so the keys leave the
disk's files with it (a DuckDB file could keep a deleted row in a free block; this one is replaced
whole). A new key is appended when a batch is sealed, and fsynced before that batch is committed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from xdb.private import fsync_path, private_files

KEYS_FILE = "audit.keys"
KEY_BYTES = 32


class SessionKeys:
    """The keys of one audit log; thread-safe. `read_only` never writes (verification, reviewers)."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path, self.read_only = path, read_only
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._unsynced = False  # keys appended and not yet fsynced
        self.keys: dict[int, tuple[str, bytes]] = {}
        self.current: dict[str, int] = {}
        self.next_id = 0
        self.exists = path.exists()
        if self.exists:
            self._load()

    def _load(self) -> None:
        for n, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                if line.startswith("next "):
                    self.next_id = max(self.next_id, int(line[5:]))
                    continue
                key_id, key, session = line.split(" ", 2)
                entry = (json.loads(session), bytes.fromhex(key))
                if len(entry[1]) != KEY_BYTES or not isinstance(entry[0], str):
                    raise ValueError
            except ValueError:
                raise ValueError(f"{self.path} line {n}: not a key line (ID HEX_KEY JSON_SESSION_ID)") from None
            self.keys[int(key_id)] = entry
            self.current[entry[0]] = int(key_id)
            self.next_id = max(self.next_id, int(key_id) + 1)

    def keys_for(self, session_ids: list[str]) -> dict[str, tuple[int, bytes]]:
        """Each session's current key (id, key); those that have none get one now, written to the file
        (made durable by `sync`, which the audit log runs before it commits records sealed under them)."""
        with self._lock:
            found = {s: (k, self.keys[k][1]) for s in session_ids if (k := self.current.get(s)) is not None}
            new = [s for s in session_ids if s not in found]
            if new and self.read_only:
                raise ValueError(f"{self.path} is open read-only: no key can be made for {new[0]!r}")
            made = {s: (self.next_id + i, os.urandom(KEY_BYTES)) for i, s in enumerate(new)}
            if made:
                self._append("".join(f"{k} {key.hex()} {json.dumps(s)}\n" for s, (k, key) in made.items()),
                             self.next_id + len(made))
                for session_id, (key_id, key) in made.items():
                    self.keys[key_id], self.current[session_id] = (session_id, key), key_id
                self.next_id += len(made)
            return {**found, **made}

    def session_keys(self, session_id: str) -> list[int]:
        with self._lock:
            return sorted(k for k, (s, _) in self.keys.items() if s == session_id)

    def secrets(self) -> dict[int, bytes]:
        with self._lock:
            return {k: key for k, (_, key) in self.keys.items()}

    def owners(self) -> dict[int, str]:
        with self._lock:
            return {k: s for k, (s, _) in self.keys.items()}

    def destroy(self, key_ids: list[int]) -> None:
        """Write the file anew without these keys and rename it over the old one (fsynced)."""
        with self._lock:
            gone = [k for k in key_ids if k in self.keys]
            if not gone:
                return
            for key_id in gone:
                session, _ = self.keys.pop(key_id)
                if self.current.get(session) == key_id:
                    del self.current[session]
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            tmp = self.path.with_name(self.path.name + ".new")
            lines = [f"next {self.next_id}\n"] + [f"{k} {key.hex()} {json.dumps(s)}\n"
                                                  for k, (s, key) in sorted(self.keys.items())]
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, "".join(lines).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_path(self.path.parent)
            self._unsynced = False  # every key left is in the new file, fsynced

    def _append(self, lines: str, next_id: int) -> None:
        if self._fd is None:
            created = not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            private_files(self.path)
            if created:
                lines = f"next {next_id}\n" + lines
                fsync_path(self.path.parent)
            self.exists = True
        os.write(self._fd, lines.encode())
        self._unsynced = True

    def sync(self) -> None:
        """fsync the keys appended since the last sync, if any."""
        with self._lock:
            if self._unsynced and self._fd is not None:
                os.fsync(self._fd)
            self._unsynced = False

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

