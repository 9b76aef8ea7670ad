"""Token counts and hashes cached by block text: a block that did not change costs a dict lookup.

The cache is keyed by the text itself: Python caches a string's hash on the object, so a block the
server holds across turns (a session's State, an unchanged Codex) is found without rehashing it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from orchestrator.blocks import sha256_hex


class TokenCounter:
    def __init__(self, encode: Callable[[str], list[int]], capacity: int = 4096) -> None:
        self._encode = encode
        self._cache: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._capacity = capacity
        self.misses = 0

    def stats(self, text: str) -> tuple[str, int]:
        """(sha256, token count) of a text."""
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        self.misses += 1
        value = (sha256_hex(text), len(self._encode(text)) if text else 0)
        self._cache[text] = value
        if len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return value

    def count(self, text: str) -> int:
        return self.stats(text)[1]

    def encode(self, text: str) -> list[int]:
        """Token ids, uncached (a whole rendered prompt is seldom seen twice)."""
        return self._encode(text)
