"""Sessions a client names without handing the server their State (an `X-Session-ID` header, OpenAI's
`prompt_cache_key`): the client resends its history each turn, and all the server keeps is the last
request's block hashes, so each report can still say where the prefix changed since that request."""

from __future__ import annotations

from collections import OrderedDict


class NamedSessions:
    """The last block hashes of the most recently used named sessions (least recently used dropped)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._hashes: OrderedDict[str, dict[str, str]] = OrderedDict()

    def last_hashes(self, session_id: str | None) -> dict[str, str] | None:
        if session_id is None:
            return None
        hashes = self._hashes.get(session_id)
        if hashes is not None:
            self._hashes.move_to_end(session_id)
        return hashes

    def remember(self, session_id: str, hashes: dict[str, str]) -> None:
        self._hashes[session_id] = hashes
        self._hashes.move_to_end(session_id)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """What the cache holds after a failed request is no longer known."""
        self._hashes.pop(session_id, None)
