"""Karma staging: where a session's karma entries sit in the prompt.

The Karma block comes before State, so writing a new entry into it re-prefills the whole State behind
it: in a long session, every new fact costs a cache miss as large as the history. Instead, an entry
that arrives mid-session is *staged*: it is delivered in the Query block of the request that brings it,
and that user turn (with the entry in it) joins the State, which only grows, so the prefix stays cached.
Staged entries are promoted into the Karma block when the State is rewritten anyway (compaction, or a
governor dropping turns), where the cache breaks regardless. Entries keep their order and text and are
never condensed: compaction promotes them before it summarises the turns that carried them.

The server's own Karma (outcomes a reviewer accepted, server/karma/) follows the client's entries, in the
order they were accepted: an entry accepted mid-session is new at the end of the list, so it is staged like
a client's new entry, and one retracted changes the list, so the block is rewritten without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.limits import KARMA_MAX_ENTRIES
from orchestrator.context_spec import ContextSpec, KarmaEntry
from orchestrator.session import Session


@dataclass(frozen=True)
class KarmaPlan:
    block: tuple[KarmaEntry, ...]   # rendered in the Karma block
    fresh: tuple[KarmaEntry, ...]   # staged by this request: rendered in its Query block
    entries: tuple[KarmaEntry, ...]  # the request's whole list, in order

    def all_in_block(self) -> KarmaPlan:
        """Every entry in the Karma block: for a prompt whose State lost the turns that carried some."""
        return KarmaPlan(self.entries, (), self.entries)


def with_held_karma(spec: ContextSpec, held: tuple[KarmaEntry, ...]) -> ContextSpec:
    """The request's Karma with the server's after the client's own (an id the client already uses is the
    client's entry, not added again), up to KARMA_MAX_ENTRIES in all: the earliest held entries are kept, so
    a new one past the bound changes no prefix already cached."""
    if not held:
        return spec
    own = {entry.id for entry in spec.karma}
    room = max(KARMA_MAX_ENTRIES - len(spec.karma), 0)
    added = [e for e in held if e.id not in own][:room]
    return spec.model_copy(update={"karma": [*spec.karma, *added]})


def plan_karma(entries: list[KarmaEntry], session: Session | None, staging: bool) -> KarmaPlan:
    """Split a request's karma list into the Karma block and the entries this request stages."""
    entries_t = tuple(entries)
    if session is None or not staging:
        return KarmaPlan(entries_t, (), entries_t)
    known = (*session.karma, *session.staged_karma)
    # An earlier entry changed or went (the block must be rewritten), or nothing is behind the Karma
    # block yet (writing it costs nothing): every entry goes in the block.
    if entries_t[:len(known)] != known or not session.messages:
        return KarmaPlan(entries_t, (), entries_t)
    return KarmaPlan(tuple(session.karma), entries_t[len(known):], entries_t)


def promote(session: Session) -> None:
    """Move the staged entries into the Karma block (the State is being rewritten anyway)."""
    session.karma = [*session.karma, *session.staged_karma]
    session.staged_karma = []


def commit(session: Session, plan: KarmaPlan) -> None:
    """After a successful request: the session remembers where each entry now lives."""
    if plan.fresh:
        session.staged_karma = [*session.staged_karma, *plan.fresh]
    elif plan.block == plan.entries:  # promoted or rebuilt: the block holds every entry
        session.karma, session.staged_karma = list(plan.entries), []

