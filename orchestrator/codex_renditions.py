"""Which rendition of each Codex document a prompt carries: the full text, or its condensed rendition
when the prompt needs room before the orchestrator would switch to RAG.

Condensing is all or nothing per prompt: every document that has a condensed rendition and is not
verbatim uses it, so a session's Codex block changes at most once (full → condensed) as its State
grows, instead of flickering document by document and breaking the prefix cache each time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.context_spec import CodexDoc, StoredCodexDoc

FULL = "full"
CONDENSED = "condensed"
CONDENSE_ACTION = "codex_condensed"


def condensable(doc: CodexDoc) -> bool:
    return not doc.verbatim


def condensed_codex(docs: Sequence[CodexDoc]) -> tuple[CodexDoc, ...]:
    """The Codex with each condensable document's condensed rendition in place of its text, where it
    has one (same id, so the block's shape and the retrieval index stay the same)."""
    return tuple(doc.model_copy(update={"text": doc.condensed})
                 if doc.condensed is not None and condensable(doc) else doc for doc in docs)


def wanting_rendition(docs: Sequence[CodexDoc]) -> tuple[CodexDoc, ...]:
    """The documents a condensed rendition would help and that have none yet."""
    return tuple(doc for doc in docs if condensable(doc) and doc.condensed is None and doc.text)


def report_entries(docs: Sequence[CodexDoc], rendition: str, included: bool) -> tuple[dict[str, Any], ...]:
    """Per document, for the cache report: where its text came from and which rendition the prompt
    carries (`excerpts` when the Codex was left out for RAG)."""
    entries = []
    for doc in docs:
        used = "excerpts" if not included else (rendition if doc.condensed is not None and condensable(doc)
                                                 else FULL)
        entry: dict[str, Any] = {"id": doc.id, "rendition": used, "verbatim": doc.verbatim}
        if isinstance(doc, StoredCodexDoc):
            entry.update(document=doc.document, version=doc.version, sha256=doc.sha256)
            if used == CONDENSED:
                entry["condensed_document"] = doc.condensed_version
        entries.append(entry)
    return tuple(entries)
