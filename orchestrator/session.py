"""Sessions: the State the server keeps for a `session_id`, append-only between compactions.

Persisted through a pair of callables (XDB in the server) so a restart resumes the session. One lock
per session keeps its turns in request order when a client sends concurrently; when several processes
serve the same sessions (`SharedSessions`), the lock also takes the session's lease across them, and a
session another process served since this one last did is read again from the store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any, Protocol

from orchestrator.context_spec import KarmaEntry
from orchestrator.message import Message
from orchestrator.turn_retry import TurnMark


@dataclass
class Session:
    session_id: str
    messages: list[Message] = field(default_factory=list)
    summary: str | None = None
    last_hashes: dict[str, str] | None = None
    compactions: int = 0
    compacted_turns: int = 0  # turns (a user message and what follows it) condensed so far
    karma: list[KarmaEntry] = field(default_factory=list)         # in the Karma block
    staged_karma: list[KarmaEntry] = field(default_factory=list)  # in State messages (orchestrator/karma.py)
    # The server (replica) that saved this State last. Loaded by another, the prefix its hashes describe
    # is in that one's cache, not here: `moved_from` says so until this server's first turn commits.
    replica: str | None = None
    moved_from: str | None = None
    # Where the Codex sits (orchestrator/codex_placement.py), the Codex it was decided for, and how
    # often that changed.
    placement: str | None = None
    placement_key: str | None = None
    mode_switches: int = 0
    last_turn: TurnMark | None = None  # what undoes the last turn, for its retry (orchestrator/turn_retry.py)
    # A client asked for a compaction: the next turn compacts first, its summary call continuing that
    # turn's cached prompt (only a turn brings the Identity and Codex the prompt is made of).
    compaction_requested: bool = False

    def without_last_turn(self) -> Session:
        """A copy as the State was before its last turn, for a retry of that turn to take its place: it
        becomes the session's State when the retry commits (`SessionStore.save`), so a retry that fails
        leaves the State as it was."""
        mark = self.last_turn
        assert mark is not None
        return replace(self, messages=self.messages[:mark.messages_before], karma=list(mark.karma_before),
                       staged_karma=list(mark.staged_karma_before), last_turn=None)

    def to_json(self) -> str:
        return json.dumps({
            "session_id": self.session_id, "messages": [m.to_message() for m in self.messages],
            "summary": self.summary, "last_hashes": self.last_hashes, "replica": self.replica,
            "compactions": self.compactions, "compacted_turns": self.compacted_turns,
            "karma": [k.model_dump() for k in self.karma],
            "staged_karma": [k.model_dump() for k in self.staged_karma],
            "placement": self.placement, "placement_key": self.placement_key, "mode_switches": self.mode_switches,
            "last_turn": self.last_turn.to_dict() if self.last_turn is not None else None,
            "compaction_requested": self.compaction_requested,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Session:
        data = json.loads(text)
        # A State saved while its messages were called turns holds them under "turns"; it loads the same.
        messages = data["messages"] if "messages" in data else data["turns"]
        return cls(session_id=data["session_id"], messages=[Message.from_message(m) for m in messages],
                   summary=data.get("summary"), last_hashes=data.get("last_hashes"), replica=data.get("replica"),
                   compactions=data.get("compactions", 0), compacted_turns=data.get("compacted_turns", 0),
                   karma=[KarmaEntry.model_validate(k) for k in data.get("karma", [])],
                   staged_karma=[KarmaEntry.model_validate(k) for k in data.get("staged_karma", [])],
                   placement=data.get("placement"), placement_key=data.get("placement_key"),
                   mode_switches=data.get("mode_switches", 0),
                   last_turn=TurnMark.from_dict(data["last_turn"]) if data.get("last_turn") else None,
                   compaction_requested=data.get("compaction_requested", False))


class Lease(Protocol):
    """A session held across processes, until `release`."""

    @property
    def moved(self) -> bool: ...  # another process held it since this one last did
    def release(self) -> None: ...


class Leases(Protocol):
    async def acquire(self, session_id: str) -> Lease: ...


@dataclass(frozen=True)
class SharedSessions:
    """What a store needs when other processes serve the same sessions from the same State store."""

    leases: Leases
    on_moved: Callable[[str], None]  # another process served the session: forget what else is cached of it
    # A lease goes once this process's records of the turn are stored, or the next process would continue
    # the session's ticks from before them: `unsettled` says some are not yet, `settle` waits for them.
    unsettled: Callable[[], bool]
    settle: Callable[[], Awaitable[None]]


@dataclass
class _Hold:
    requests: int = 0  # this process's requests of the session that hold it
    lease: Lease | None = None
    taking: asyncio.Lock = field(default_factory=asyncio.Lock)  # the first request takes the lease; the rest wait


class SessionHolds:
    """A session held across processes for as long as any of this process's requests of it runs: the
    first takes the lease (dropping what is cached of the session if another process served it since),
    the last lets it go once its records are stored. Requests of one session in this process run side by
    side as before (an agent's side calls); across processes they take turns."""

    def __init__(self, store: SessionStore, shared: SharedSessions) -> None:
        self._store, self._shared = store, shared
        self._holds: dict[str, _Hold] = {}
        self._releasing: set[asyncio.Task[None]] = set()  # held, or the loop may drop one mid-settle

    async def take(self, session_id: str) -> None:
        hold = self._holds.setdefault(session_id, _Hold())
        hold.requests += 1
        try:
            async with hold.taking:
                if hold.lease is None:
                    lease = await self._shared.leases.acquire(session_id)
                    if lease.moved:
                        self._store.forget(session_id)
                        self._shared.on_moved(session_id)
                    hold.lease = lease
        except BaseException:
            self.give(session_id)
            raise

    def give(self, session_id: str) -> None:
        hold = self._holds[session_id]
        hold.requests -= 1
        if hold.requests:
            return
        del self._holds[session_id]  # a request that comes now takes the lease again, after this release
        if hold.lease is None:
            return
        if self._shared.unsettled():
            task = asyncio.get_running_loop().create_task(self._release_settled(hold.lease))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)
        else:
            hold.lease.release()

    async def _release_settled(self, lease: Lease) -> None:
        try:
            await self._shared.settle()
        finally:  # stored or failed, the session is not held forever
            lease.release()


class SessionLock:
    """A session's lock, as asyncio.Lock's interface: its turns in order in this process and, with
    `SharedSessions`, across processes (the lease is taken after the local lock, so a process waits
    for its own earlier turns before it asks the others)."""

    def __init__(self, store: SessionStore, session_id: str) -> None:
        self._store, self._session_id = store, session_id
        self._local = asyncio.Lock()
        self._held = False

    async def acquire(self) -> bool:
        await self._local.acquire()
        if self._store.holds is not None:
            try:
                await self._store.holds.take(self._session_id)
            except BaseException:
                self._local.release()
                raise
            self._held = True
        return True

    def release(self) -> None:
        if self._held and self._store.holds is not None:
            self._held = False
            self._store.holds.give(self._session_id)
        self._local.release()

    def locked(self) -> bool:
        return self._local.locked()

    @property
    def _waiters(self) -> Any:
        """asyncio.Lock's own, read by `busy` checks (a released lock wakes its next waiter before that
        waiter holds it)."""
        return getattr(self._local, "_waiters", None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


@dataclass
class _Entry:
    lock: SessionLock
    session: Session | None = None
    saving: Any = None  # the last save's receipt, when the save callable returns a future
    stored: str | None = None  # the State as this server last loaded or saved it
    undelivered: TurnMark | None = None  # a turn whose save failed or went unanswered: loaded, undelivered

    def busy(self) -> bool:
        """In use: its lock held or awaited (a released lock wakes its next waiter before that waiter
        holds it, so `locked()` alone would miss it), or its last save not yet on disk (a reload
        would read the State before it)."""
        if self.lock.locked() or getattr(self.lock, "_waiters", None):
            return True
        done = getattr(self.saving, "done", None)
        return callable(done) and not done()


class SessionStore:
    """The sessions in memory, least recently used first. Past `max_sessions` the least recently used
    idle ones are dropped (with their locks), so memory does not grow with every session ever seen; a
    dropped session is loaded again from its saved State when it returns. Without a `load` callable
    a dropped session's State is lost, so that store keeps everything (tests, the library's examples).
    `on_evict` is called with each dropped session's id, for what else is kept per session."""

    def __init__(self, load: Callable[[str], str | None] | None = None,
                 save: Callable[[str, str], object] | None = None, max_sessions: int = 10_000,
                 on_evict: Callable[[str], object] | None = None, replica: str | None = None,
                 shared: SharedSessions | None = None) -> None:
        self._load, self._save = load, save
        # Other processes serve the same sessions (None: this one alone).
        self.holds = SessionHolds(self, shared) if shared is not None else None
        self.replica = replica  # this server's name among several sharing one store (None: alone)
        self.max_sessions = max_sessions
        self._on_evict = on_evict
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    @property
    def resident(self) -> int:
        """Sessions in memory now (no `__len__`: an empty store must stay truthy)."""
        return len(self._entries)

    def _entry(self, session_id: str) -> _Entry:
        entry = self._entries.get(session_id)
        if entry is None:
            entry = self._entries[session_id] = _Entry(SessionLock(self, session_id))
            self._trim()
        else:
            self._entries.move_to_end(session_id)
        return entry

    def _trim(self) -> None:
        if self._load is None or len(self._entries) <= self.max_sessions:
            return
        idle = (sid for sid, entry in self._entries.items() if not entry.busy())
        for session_id in list(islice(idle, len(self._entries) - self.max_sessions)):
            del self._entries[session_id]
            if self._on_evict is not None:
                self._on_evict(session_id)

    def lock(self, session_id: str) -> SessionLock:
        return self._entry(session_id).lock

    def get(self, session_id: str) -> Session:
        entry = self._entry(session_id)
        if entry.session is None:
            self._take(entry, session_id, self._load(session_id) if self._load else None)
        assert entry.session is not None
        return entry.session

    async def aget(self, session_id: str) -> Session:
        """`get`, reading the store on a worker thread. Among several servers (`replica` set) a session
        held in memory is read again too: another replica may have served it since (a failover, then
        its way back), and its State there is newer than the one held here."""
        entry = self._entry(session_id)
        if self._load is None or (entry.session is not None and self.replica is None):
            return self.get(session_id)
        if isinstance(entry.saving, concurrent.futures.Future):  # this server's last save first (its
            await asyncio.wait([asyncio.wrap_future(entry.saving)])  # failure is the turn's that made it)
        stored = await asyncio.to_thread(self._load, session_id)
        # A State stored before and gone now was deleted (on any replica): the session starts afresh.
        if entry.session is None or stored != entry.stored:
            self._take(entry, session_id, stored)
        assert entry.session is not None
        return entry.session

    def _take(self, entry: _Entry, session_id: str, stored: str | None) -> None:
        session = Session.from_json(stored) if stored else Session(session_id)
        if session.last_turn is not None and session.last_turn == entry.undelivered:
            session.last_turn.delivered = False  # its client got the error, not the reply
        entry.undelivered = None
        if self.replica is not None and session.replica not in (None, self.replica):
            session.moved_from = session.replica
        entry.session, entry.stored = session, stored

    def forget(self, session_id: str) -> None:
        """Drop the State held in memory (not its lock): the next turn loads what is stored, e.g. after a
        rollback or a deletion. Call it holding the session's lock."""
        entry = self._entries.get(session_id)
        if entry is not None:
            entry.session = None

    def reload(self, session_id: str, undelivered: TurnMark | None = None) -> None:
        """A save of the session failed: memory may hold a turn the store does not, so the next request
        reads the stored State instead (without a `load` callable memory is all there is: kept).
        `undelivered`: the failed turn's mark; stored after all, that turn is read back undelivered."""
        entry = self._entries.get(session_id)
        if entry is not None and self._load is not None:
            entry.session, entry.saving, entry.stored = None, None, None
            entry.undelivered = undelivered

    def save(self, session: Session) -> Any:
        """Persist, and hold `session` as the session's State (a retried turn commits a copy); returns
        what the save callable returns (the server's is a Future to await)."""
        entry = self._entries.get(session.session_id)
        if entry is not None:
            entry.session = session
        if self._save is None:
            return None
        session.replica = self.replica
        state = session.to_json()
        receipt = self._save(session.session_id, state)
        if entry is not None:
            entry.saving, entry.stored = receipt, state
        return receipt
