"""Where a session's Codex sits in its prompt: decided once per session, kept until the Codex changes.

`auto` weighs the payload, not the prompt: the Codex's own tokens (the rendition that would be used)
against `cag_threshold × max_model_len`. Under it the whole Codex is in the prompt (CAG, its full text,
else its condensed rendition); over it the Codex is left out and retrieved from (RAG). The decision is
taken before the session's first turn and kept, because a mode that follows the whole prompt flaps as
the State grows and is compacted, and every flap breaks the prefix cache at the Codex. Room for the
State comes from compaction. Only a Codex that cannot fit beside a fully compacted State moves the
session one step along full → condensed → RAG, once; each change of placement is a mode switch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.codex_renditions import CONDENSED, FULL, condensed_codex
from orchestrator.context_spec import CodexDoc

RAG = "rag"
ORDER: tuple[str, ...] = (FULL, CONDENSED, RAG)


@dataclass(frozen=True)
class Placement:
    rendition: str  # full | condensed | rag
    key: str  # the Codex (and mode, threshold, formatter) it was decided for

    @property
    def mode(self) -> str:
        return "rag" if self.rendition == RAG else "cag"


def codex_key(docs: Sequence[CodexDoc], mode: str, threshold: float, formatter: str) -> str:
    """A digest of everything the decision depends on: a change of any of it decides again."""
    digest = hashlib.sha256(f"{mode}\0{threshold!r}\0{formatter}".encode())
    for doc in docs:
        digest.update(b"\1" + doc.id.encode() + (b"\2v" if doc.verbatim else b"\2") + doc.text.encode())
        if doc.condensed is not None:
            digest.update(b"\3" + doc.condensed.encode())
    return digest.hexdigest()


def decide(docs: tuple[CodexDoc, ...], mode: str, limit: float, tokens: Callable[[tuple[CodexDoc, ...]], int]) -> str:
    """The placement before any turn: `tokens` counts a Codex's rendered block; `limit` is the
    threshold in tokens."""
    if mode == "rag":
        return RAG
    if mode == "cag" or not docs or tokens(docs) < limit:
        return FULL
    condensed = condensed_codex(docs)
    if condensed != docs and tokens(condensed) < limit:
        return CONDENSED
    return RAG


def moved(rendition: str, docs: tuple[CodexDoc, ...], mode: str) -> str | None:
    """The next placement for a Codex that cannot fit beside a compacted State (None: nowhere to go).
    A forced `cag` may be condensed but never leaves the prompt; `rag` has nowhere to go."""
    steps = [p for p in ORDER[ORDER.index(rendition) + 1:]
             if (p != CONDENSED or condensed_codex(docs) != docs) and (p != RAG or mode == "auto")]
    return steps[0] if steps else None
