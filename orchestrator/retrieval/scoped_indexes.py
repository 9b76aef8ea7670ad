"""One CodexIndex per session, so sessions with different Codexes do not take turns re-syncing one.

A single shared index would mirror whichever Codex was synced last: two agents with different
Codexes would re-chunk and re-embed on every alternation, and a `query_archive` call could search
the other agent's documents. Here each scope (a session id, or None for requests without one) has
its own DuckDB file under `root`, opened on first use and kept open in LRU order up to `max_open`;
all share one embedder. An index is closed only when no search or sync is using it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.retrieval.codex_index import CodexIndex
from orchestrator.retrieval.embedder import Embedder
from orchestrator.retrieval.limits import RagLimits


class ScopedIndexes:
    def __init__(self, root: Path | None, embedder: Embedder | None = None, limits: RagLimits = RagLimits(),
                 max_open: int = 8, threads: int | None = None) -> None:
        """`root` None keeps every index in memory (tests); else a directory of DuckDB files."""
        self.root = Path(root) if root is not None else None
        self.embedder = embedder or Embedder()
        self.limits = limits
        self.max_open = max_open
        self.threads = threads
        self._open: OrderedDict[str | None, CodexIndex] = OrderedDict()
        self._users: dict[str | None, int] = {}
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
            index = self._open.get(scope)
            if index is None:
                index = self._open[scope] = CodexIndex(self.path_of(scope), embedder=self.embedder,
                                                       limits=self.limits, threads=self.threads)
            self._open.move_to_end(scope)
            self._users[scope] = self._users.get(scope, 0) + 1
        try:
            yield index
        finally:
            with self._lock:
                self._users[scope] -= 1
                self._close_idle_beyond_cap()

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

    def _close_idle_beyond_cap(self) -> None:
        for scope in list(self._open):
            if len(self._open) <= self.max_open:
                return
            if self._users.get(scope, 0) == 0 and self.root is not None:  # in memory: closing loses it
                self._open.pop(scope).close()
                self._users.pop(scope, None)
