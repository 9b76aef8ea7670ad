"""One CodexIndex per session, so sessions with different Codexes do not take turns re-syncing one.

A single shared index would mirror whichever Codex was synced last: two agents with different
Codexes would re-chunk and re-embed on every alternation, and a `query_archive` call could search
the other agent's documents. Here each scope (a session id, or None for requests without one) has
its own DuckDB file under `root`, opened on first use and kept open in LRU order up to `max_open`;
all share one embedder. An index is closed only when no search or sync is using it.

An index is a cache: every request in RAG mode carries its Codex and syncs the index to it, so a
deleted one is rebuilt (re-embedded) on its session's next RAG request. Hence the files are bounded:
past `max_files` the least recently used idle ones are deleted when a new one is made (files from an
earlier run rank by their modification time), and `drop` deletes a scope's file outright.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.retrieval.codex_index import CodexIndex
from orchestrator.retrieval.embedder import Embedder
from orchestrator.retrieval.limits import RagLimits

log = logging.getLogger(__name__)


class ScopedIndexes:
    def __init__(self, root: Path | None, embedder: Embedder | None = None, limits: RagLimits = RagLimits(),
                 max_open: int = 8, threads: int | None = None, max_files: int = 256) -> None:
        """`root` None keeps every index in memory (tests); else a directory of DuckDB files."""
        self.root = Path(root) if root is not None else None
        self.embedder = embedder or Embedder()
        self.limits = limits
        self.max_open = max_open
        self.max_files = max_files
        self.threads = threads
        self._open: OrderedDict[str | None, CodexIndex] = OrderedDict()
        self._users: dict[str | None, int] = {}
        self._last_used: dict[Path, float] = {}  # wall-clock time, comparable with earlier files' mtimes
        self._dropped: set[str | None] = set()  # in use when dropped: deleted when its last user leaves
        self._lock = threading.Lock()

    def path_of(self, scope: str | None) -> Path | None:
        if self.root is None:
            return None
        name = "default" if scope is None else hashlib.sha256(scope.encode()).hexdigest()[:32]
        return self.root / f"{name}.duckdb"

    @contextmanager
    def using(self, scope: str | None) -> Iterator[CodexIndex]:
        """The scope's index, held open for the duration of the block."""
        with self._lock:
            self._dropped.discard(scope)  # used again: wanted after all
            index = self._open.get(scope)
            if index is None:
                path = self.path_of(scope)
                if path is not None and not path.exists():
                    self._delete_idle_beyond(self.max_files - 1)  # room for the file about to be made
                index = self._open[scope] = CodexIndex(path, embedder=self.embedder, limits=self.limits,
                                                       threads=self.threads)
            self._open.move_to_end(scope)
            self._users[scope] = self._users.get(scope, 0) + 1
            self._touch(scope)
        try:
            yield index
        finally:
            with self._lock:
                self._users[scope] -= 1
                self._touch(scope)
                if scope in self._dropped and not self._users[scope]:
                    self._dropped.discard(scope)
                    self._delete(scope)
                self._close_idle_beyond_cap()

    def drop(self, scope: str | None) -> bool:
        """Close the scope's index and delete its file, for a scope that is gone (its session forgotten).
        An index in use is not pulled from under its user: it is deleted when its last user is done,
        unless it is used again before that. True when deleted now."""
        with self._lock:
            if self._users.get(scope, 0):
                self._dropped.add(scope)
                return False
            self._delete(scope)
            return True

    def exists(self, scope: str | None) -> bool:
        """Whether the scope has an index (open, or a file from an earlier run)."""
        with self._lock:
            path = self.path_of(scope)
            return scope in self._open or (path is not None and path.exists())

    def open_scopes(self) -> list[str | None]:
        with self._lock:
            return list(self._open)

    def close(self) -> None:
        with self._lock:
            for index in self._open.values():
                index.close()
            self._open.clear()

    def _touch(self, scope: str | None) -> None:
        path = self.path_of(scope)
        if path is not None:
            self._last_used[path] = time.time()

    def _close_idle_beyond_cap(self) -> None:
        for scope in list(self._open):
            if len(self._open) <= self.max_open:
                return
            if self._users.get(scope, 0) == 0 and self.root is not None:  # in memory: closing loses it
                self._open.pop(scope).close()
                self._users.pop(scope, None)

    def _delete(self, scope: str | None) -> None:
        """Close an idle scope's index and delete its file (lock held)."""
        index = self._open.pop(scope, None)
        self._users.pop(scope, None)
        if index is not None:
            index.close()
        path = self.path_of(scope)
        if path is not None:
            _unlink(path)
            self._last_used.pop(path, None)

    def _delete_idle_beyond(self, keep: int) -> None:
        """Delete the least recently used index files not in use until at most `keep` remain (lock held)."""
        assert self.root is not None
        files = list(self.root.glob("*.duckdb"))
        if len(files) <= keep:
            return
        in_use = {self.path_of(scope) for scope, users in self._users.items() if users}
        by_path = {self.path_of(scope): scope for scope in self._open}
        idle = sorted((self._last_used.get(path) or _mtime(path), path) for path in files if path not in in_use)
        for _, path in idle[:len(files) - keep]:
            if path in by_path:
                self._delete(by_path[path])
            else:
                _unlink(path)
                self._last_used.pop(path, None)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # deleted meanwhile
        return 0.0


def _unlink(path: Path) -> None:
    """Delete a DuckDB file and its write-ahead log; a failure is logged, not raised (the index is a
    cache: a file left behind costs disk space, and the next pass tries again)."""
    for file in (path, path.with_name(path.name + ".wal")):
        try:
            file.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not delete RAG index file %s: %s", file, exc)
