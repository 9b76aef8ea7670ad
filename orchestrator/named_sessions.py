"""Sessions a client names without handing the server their State (an `X-Session-ID` header, OpenAI's
`prompt_cache_key`, Claude Code's metadata): the client resends its history each turn, and all the server
keeps is the last request's block hashes, so each report can still say where the prefix changed since
that request.

Agents send side requests under their session's id: a title, a summary, a quota or topic check, a
sub-agent's conversation. They carry no tools beside turns that carry the agent's, or neither continue
the session's history nor keep its tools (or, without tools, its system prompt): such a request is a
side call of the session (`side`), reported against its own last request, and neither becomes the
session's turn nor breaks the next turn's report. A session whose first requests offered no tools takes
its turns' tools from the first request that offers some (an agent's first turn after a side call it
sent first): the requests before it read as side calls (xdb/recall/browse.py)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

NO_TOOLS = ""
SIDE = "\x1fside:"  # a side call's hashes are kept apart from the session's turns'


def tools_key(tools: Iterable[dict[str, Any]]) -> str:
    """The tool set a request offers, by name (a client's tool descriptions may change; its names do not)."""
    names = sorted({str((tool.get("function") or tool).get("name") or "") for tool in tools if isinstance(tool, dict)})
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16] if names else NO_TOOLS


class NamedSessions:
    """The last block hashes of the most recently used named sessions (least recently used dropped), and
    each one's main tool set."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._hashes: OrderedDict[str, tuple[str | None, dict[str, str]]] = OrderedDict()

    def side(self, session_id: str, thread: str, continues: bool, identity: str | None) -> bool:
        """Whether a request of the session is a side call: offering no tools where its turns offer some
        (whatever its messages: a summary call resends the history); not continuing the session's history
        with other tools than its turns' (a sub-agent's); or, in a session without tools, neither
        continuing its history nor keeping its turns' system prompt (`identity`, the block's hash: a title
        call; Aider lays each turn out anew under the same system prompt). A request offering tools to a
        session whose requests offered none is its turn: an agent's first, after side calls it sent first."""
        known = self._hashes.get(session_id)
        if known is None:
            return False
        main, hashes = known
        if thread == main:
            return thread == NO_TOOLS and not continues and hashes.get("identity") != identity
        if thread == NO_TOOLS:
            return True
        return main != NO_TOOLS and not continues

    def _main(self, session_id: str) -> str | None:
        known = self._hashes.get(session_id)
        return known[0] if known is not None else None

    def last_hashes(self, session_id: str | None, thread: str | None = None,
                    side: bool = False) -> dict[str, str] | None:
        """The hashes of the session's last turn (of its last side call, for a side call); None when unknown,
        or for an agent's first turn after side calls that came first (its tools, where they had none)."""
        if session_id is None:
            return None
        key = session_id + SIDE + (thread or "") if side else session_id
        known = self._hashes.get(key)
        if known is None:
            return None
        self._hashes.move_to_end(key)
        main, hashes = known
        if not side and main == NO_TOOLS and thread not in (None, NO_TOOLS):
            return None
        return hashes

    def remember(self, session_id: str, hashes: dict[str, str], thread: str | None = None,
                 side: bool = False) -> None:
        """A request's hashes; a turn's tools become the session's main tool set."""
        key = session_id + SIDE + (thread or "") if side else session_id
        self._hashes[key] = (thread, hashes)
        self._hashes.move_to_end(key)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """What the cache holds after a failed request is no longer known."""
        self._hashes.pop(session_id, None)
