"""Size limits on a Codex sent for RAG: over one, the request is refused (HTTP 413) before any work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.errors import PayloadTooLarge


class CodexTooLarge(PayloadTooLarge):
    """A Codex over one of the limits; `limit` names it, `value` is its setting, `actual` what came."""

    def __init__(self, limit: str, value: int, actual: int, detail: str = "") -> None:
        self.limit, self.value, self.actual = limit, value, actual
        where = f" ({detail})" if detail else ""
        super().__init__(f"codex too large: {limit}={value:,} exceeded{where}: got {actual:,}", param="context.codex")


@dataclass(frozen=True)
class RagLimits:
    # Defaults match core.config's rag_* settings: ~20M characters is ~5M tokens, ~30k chunks.
    max_documents: int = 1_000
    max_document_chars: int = 2_000_000
    max_total_chars: int = 20_000_000

    def check(self, docs: Sequence[tuple[str, str]]) -> None:
        """Raise CodexTooLarge before any work is done (cheap: lengths only)."""
        if len(docs) > self.max_documents:
            raise CodexTooLarge("max_documents", self.max_documents, len(docs))
        total = 0
        for doc_id, text in docs:
            if len(text) > self.max_document_chars:
                raise CodexTooLarge("max_document_chars", self.max_document_chars, len(text),
                                    f"document {doc_id!r}")
            total += len(text)
        if total > self.max_total_chars:
            raise CodexTooLarge("max_total_chars", self.max_total_chars, total)
