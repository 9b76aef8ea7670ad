"""The concept dictionary: concept names are stored once, timesteps carry their integer ids.

Integer ids keep the activation columns small and make a concept filter an integer compare. The
writer thread is the only one that adds names; readers only look names up, and Python's dict and list
reads are atomic, so no lock is needed on the read side.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np


class ConceptIndex:
    def __init__(self, pairs: list[tuple[int, str]]) -> None:
        self._ids: dict[str, int] = {}
        self._names: dict[int, str] = {}
        for cid, name in pairs:
            self._ids[name] = cid
            self._names[cid] = name
        self._next = max(self._names, default=-1) + 1
        self._lock = threading.Lock()  # registration only

    def ids_for(self, names: Iterable[str], count: int) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Ids for `count` names, registering unknown ones; returns (ids, newly added pairs)."""
        names = list(names) if not isinstance(names, list) else names
        try:  # the common case: every name known, one C-level pass
            return np.fromiter(map(self._ids.__getitem__, names), dtype=np.int32, count=count), []
        except KeyError:
            pass
        added: list[tuple[int, str]] = []
        with self._lock:
            for name in dict.fromkeys(names):
                if name not in self._ids:
                    if not isinstance(name, str) or not name:
                        raise ValueError(f"concept names must be non-empty strings, got {name!r}")
                    added.append((self._next, name))
                    self._ids[name] = self._next
                    self._names[self._next] = name
                    self._next += 1
        return np.fromiter(map(self._ids.__getitem__, names), dtype=np.int32, count=count), added

    def id_of(self, name: str) -> int | None:
        return self._ids.get(name)

    def name_of(self, cid: int) -> str:
        return self._names[cid]

    def names(self) -> list[str]:
        return list(self._ids)

    def by_id(self, values: dict[str, float], fill: float = float("nan")) -> np.ndarray:
        """`values` (by concept name) as an array indexed by concept id, `fill` elsewhere."""
        with self._lock:
            out = np.full(self._next, fill)
            for name, value in values.items():
                if name in self._ids:
                    out[self._ids[name]] = value
        return out
