"""`CodexRetriever`: the Orchestrator's `Retriever` protocol over one CodexIndex.

The index is synced to the request's Codex before each search; an unchanged Codex costs one sha256
per document and no database writes. DuckDB and torch block, so both run in a worker thread.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, Sequence

from orchestrator.formatters import Excerpt
from orchestrator.retrieval.codex_index import CodexIndex
from orchestrator.retrieval.tool import QUERY_ARCHIVE_TOOL, query_archive


class _Doc(Protocol):  # orchestrator.context_spec.CodexDoc
    id: str
    text: str


class CodexRetriever:
    def __init__(self, index: CodexIndex) -> None:
        self.index = index

    async def retrieve(self, docs: Sequence[_Doc], query: str, k: int) -> list[Excerpt]:
        return await asyncio.to_thread(self._retrieve, [(d.id, d.text) for d in docs], query, k)

    def tool(self) -> dict[str, Any]:
        return QUERY_ARCHIVE_TOOL

    async def run_tool(self, arguments: dict[str, Any] | str) -> dict[str, Any]:
        """Execute a `query_archive` call against the Codex last synced."""
        return await asyncio.to_thread(query_archive, self.index, arguments)

    def _retrieve(self, docs: list[tuple[str, str]], query: str, k: int) -> list[Excerpt]:
        self.index.sync(docs)  # CodexTooLarge propagates: the server answers 413
        if not query.strip():
            return []
        return [Excerpt(r.chunk.doc_id, r.chunk.chunk_index, r.chunk.text) for r in self.index.search(query, k)]
