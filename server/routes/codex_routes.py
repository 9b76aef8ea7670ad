"""`/v1/xdb/documents/{id}/condensed`: a document's condensed rendition for the served model.

Requests make renditions on their own when a prompt needs room; these routes let an operator make
one ahead of time (so no session ever falls back to RAG for want of it) and read what is stored.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from core.errors import Conflict, NotFound
from server.codex.codex_condenser import CodexCondenser, source_document
from server.codex.codex_resolver import CodexResolver, rendition_path
from server.http.errors import AHCRoute
from server.tenancy.tenant_xdb import TenantViews, TenantXDB
from xdb import XDBClient

Version = Annotated[int | None, Query(ge=1, description="the source's version (default: the latest)")]


def codex_router(xdb: XDBClient, resolver: CodexResolver, condenser: CodexCondenser) -> APIRouter:
    router = APIRouter(prefix="/v1/xdb/documents", tags=["xdb"], route_class=AHCRoute)
    views = TenantViews(xdb)

    @router.get("/{doc_id}/condensed")
    async def condensed(doc_id: str, version: Version = None, view: TenantXDB = Depends(views)) -> Any:
        """The stored rendition of the document's version for the served model, or 404."""
        doc = await asyncio.to_thread(view.document, doc_id, version=version)
        try:
            return await asyncio.to_thread(view.find_document, path=rendition_path(resolver.model, doc["content_hash"]))
        except NotFound:
            raise NotFound(f"document {doc_id!r} version {doc['version']} has no condensed rendition for "
                           f"{resolver.model!r}; POST here to make one") from None

    @router.post("/{doc_id}/condensed")
    async def condense(doc_id: str, version: Version = None, view: TenantXDB = Depends(views)) -> Any:
        """Make the rendition now with the served model (or return the stored one)."""
        doc = await asyncio.to_thread(view.document, doc_id, version=version)
        made = await condenser.rendition_for(source_document(doc), view.owner)
        if made is None:
            raise Conflict(f"the served model's rendition of {doc_id!r} version {doc['version']} was no shorter "
                           "than the document (or the document is too long for one call); nothing was stored")
        return await asyncio.to_thread(view.find_document, path=rendition_path(resolver.model, doc["content_hash"]))

    return router
