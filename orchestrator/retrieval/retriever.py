"""`CodexRetriever`: the Orchestrator's `Retriever` protocol over one CodexIndex per session.

A session's index is synced to the request's Codex before each search; an unchanged Codex costs one
sha256 per document and no database writes. DuckDB and torch block, so both run in a worker thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from opentelemetry import trace

from orchestrator.formatters import Excerpt
from orchestrator.retrieval.scoped_indexes import ScopedIndexes
from orchestrator.retrieval.tool import QUERY_ARCHIVE_TOOL, query_archive

tracer = trace.get_tracer(__name__)


def search_attributes(scope: str | None, k: int | None = None) -> dict[str, Any]:
    """A search's span attributes. The index it reads is a session's or, for requests without one, their
    tenant's: the scope is not always a session id, so the enclosing spans carry that."""
    attributes: dict[str, Any] = {"ahc.retrieval.scope": scope or ""}
    if k is not None:
        attributes["ahc.retrieval.k"] = k
    return attributes


class _Doc(Protocol):  # orchestrator.context_spec.CodexDoc; read-only, as its frozen fields are
    @property
    def id(self) -> str: ...
    @property
    def text(self) -> str: ...


class CodexRetriever:
    def __init__(self, indexes: ScopedIndexes) -> None:
        self.indexes = indexes
        # Per tenant (its prefix, what its ids start with): whose Codex a call without a session searches.
        self._last_scope: dict[str, str | None] = {}
        self._lock = threading.Lock()

    async def retrieve(self, docs: Sequence[_Doc], query: str, k: int, scope: str | None = None,
                       tenant_prefix: str = "") -> list[Excerpt]:
        """The k best excerpts of `docs` (the Codex of session `scope`, a request of the tenant whose ids start
        with `tenant_prefix`) for `query`."""
        with tracer.start_as_current_span("ahc.retrieval", attributes=search_attributes(scope, k)) as span:
            excerpts = await asyncio.to_thread(self._retrieve, [(d.id, d.text) for d in docs], query, k, scope,
                                               tenant_prefix)
            span.set_attribute("ahc.retrieval.excerpts", len(excerpts))
            return excerpts

    def tool(self) -> dict[str, Any]:
        return QUERY_ARCHIVE_TOOL

    async def run_tool(self, arguments: dict[str, Any] | str, scope: str | None = None,
                       tenant_prefix: str = "") -> dict[str, Any]:
        """Execute a `query_archive` call against session `scope`'s Codex (without one: the Codex of
        the most recent RAG request of the tenant whose ids start with `tenant_prefix`; never another
        tenant's)."""
        with self._lock:
            scope = scope if scope is not None else self._last_scope.get(tenant_prefix, tenant_prefix or None)
        with tracer.start_as_current_span("ahc.retrieval.query_archive", attributes=search_attributes(scope)):
            return await asyncio.to_thread(self._run_tool, arguments, scope, tenant_prefix)

    def _retrieve(self, docs: list[tuple[str, str]], query: str, k: int, scope: str | None,
                  tenant_prefix: str) -> list[Excerpt]:
        with self.indexes.using(scope) as index:
            index.sync(docs)  # CodexTooLarge propagates: the server answers 413
            with self._lock:
                self._last_scope[tenant_prefix] = scope
            if not query.strip():
                return []
            return [Excerpt(r.chunk.doc_id, r.chunk.chunk_index, r.chunk.text) for r in index.search(query, k)]

    def _run_tool(self, arguments: dict[str, Any] | str, scope: str | None, tenant_prefix: str) -> dict[str, Any]:
        if not self.indexes.exists(scope):
            if scope is None or scope == tenant_prefix:
                message = "no request has used RAG mode yet: there is no Codex to search"
            else:
                message = (f"session {scope.removeprefix(tenant_prefix)!r} has no Codex in RAG mode yet: "
                           "nothing to search")
            return {"error": {"type": "invalid_arguments", "message": message}}
        with self.indexes.using(scope) as index:
            return query_archive(index, arguments)
