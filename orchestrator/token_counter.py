"""Token counts and hashes cached by block text: a block that did not change costs a dict lookup.

The cache is keyed by the text itself: Python caches a string's hash on the object, so a block the
server holds across turns (a session's State, an unchanged Codex) is found without rehashing it.
Since the keys are whole texts (a Codex may be 20 MB), the cache is bounded by their total length as
well as by their number.

Tokenizing is the one slow step of assembly: a 20 MB Codex takes seconds. `prefetch` counts long
texts on a worker thread before the (synchronous) assembly asks for them, so the event loop keeps
serving other requests meanwhile (the tokenizer releases the GIL while it encodes; see `count_long`
for what it does not).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable

from orchestrator.blocks import sha256_hex

# Texts longer than this are counted on a worker thread by `prefetch`; shorter ones take well under
# 10 ms and cost less than the hand-off.
OFFLOAD_CHARS = 8_192
# Characters of text the cache may hold: three sessions' 20 MB Codexes with room to spare. Keep it
# above orchestrator.rag_max_total_chars, or a Codex at that limit is re-tokenized on every request.
MAX_CHARS = 64 << 20


class TokenCounter:
    def __init__(self, encode: Callable[[str], list[int]], capacity: int = 4096,
                 offload_chars: int = OFFLOAD_CHARS, max_chars: int = MAX_CHARS,
                 count_long: Callable[[str], int] | None = None) -> None:
        """`count_long`: how `prefetch`'s worker thread counts a long text, if not `len(encode(text))`;
        the server's counts a very long one in a child process, since the tokenizer holds the GIL while
        it builds (and frees) its result, which for a 20 MB text stalls the event loop for a second."""
        self._encode = encode
        self._count_long = count_long
        self._cache: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._capacity = capacity
        self.max_chars = max_chars
        self._chars = 0  # total length of the cached texts
        # The last text too long to cache, so the assembly that follows its `prefetch` does not count
        # it again on the event loop; replaced by the next one.
        self._oversize: tuple[str, tuple[str, int]] | None = None
        self.offload_chars = offload_chars
        self.misses = 0

    @property
    def cached_chars(self) -> int:
        return self._chars

    def __len__(self) -> int:
        return len(self._cache)

    def stats(self, text: str) -> tuple[str, int]:
        """(sha256, token count) of a text."""
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        if self._oversize is not None and self._oversize[0] == text:
            return self._oversize[1]
        self.misses += 1
        return self.remember(text, self.measure(text))

    def measure(self, text: str) -> tuple[str, int]:
        """(sha256, token count), uncached and touching no state: safe on any thread."""
        return sha256_hex(text), len(self._encode(text)) if text else 0

    def measure_long(self, text: str) -> tuple[str, int]:
        """`measure` through `count_long`, for a worker thread."""
        if self._count_long is None or not text:
            return self.measure(text)
        return sha256_hex(text), self._count_long(text)

    def remember(self, text: str, value: tuple[str, int]) -> tuple[str, int]:
        """Cache a measured text. Called on the event loop's thread only, so the cache needs no lock.

        A text longer than `max_chars` is not cached: it would first evict everything else, and the
        next long text would evict it in turn. It is only held as the last oversize text, so that the
        request that brought it does not count it twice."""
        if len(text) > self.max_chars:
            self._oversize = (text, value)
            return value
        if text not in self._cache:
            self._chars += len(text)
        self._cache[text] = value
        self._cache.move_to_end(text)
        while len(self._cache) > self._capacity or self._chars > self.max_chars:
            evicted, _ = self._cache.popitem(last=False)
            self._chars -= len(evicted)
        return value

    def cached(self, text: str) -> bool:
        return text in self._cache

    def _known(self, text: str) -> bool:
        return text in self._cache or (self._oversize is not None and self._oversize[0] == text)

    async def prefetch(self, texts: Iterable[str]) -> None:
        """Count the long, uncached texts on a worker thread, so later `stats`/`count` calls for them
        are cache hits; short or known texts are left to those calls."""
        for text in texts:
            if len(text) > self.offload_chars and not self._known(text):
                self.misses += 1
                self.remember(text, await asyncio.to_thread(self.measure_long, text))

    def count(self, text: str) -> int:
        return self.stats(text)[1]

    def encode(self, text: str) -> list[int]:
        """Token ids, uncached (a whole rendered prompt is seldom seen twice)."""
        return self._encode(text)
