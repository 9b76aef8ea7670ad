"""`/v1/xdb/documents/{id}/condensed`: a document's condensed rendition for the served model.

Requests make renditions on their own when a prompt needs room; these routes let an operator make
one ahead of time (so no session ever falls back to RAG for want of it) and read what is stored.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ahc.errors import Conflict, NotFound
from server.codex_condenser import CodexCondenser, source_document
from server.codex_resolver import CodexResolver, rendition_path
from server.errors import AHCRoute
from server.request_context import Caller
from server.tenants import Tenant
from server.xdb_routes import unscoped
from xdb import XDBClient

Version = Annotated[int | None, Query(ge=1, description="the source's version (default: the latest)")]


def codex_router(xdb: XDBClient, resolver: CodexResolver, condenser: CodexCondenser) -> APIRouter:
    router = APIRouter(prefix="/v1/xdb/documents", tags=["xdb"], route_class=AHCRoute)

    async def source(doc_id: str, version: int | None, tenant: Tenant) -> dict[str, Any]:
        return await asyncio.to_thread(xdb.document, tenant.scope(doc_id), version=version)

    @router.get("/{doc_id}/condensed")
    async def condensed(doc_id: str, tenant: Caller, version: Version = None) -> Any:
        """The stored rendition of the document's version for the served model, or 404."""
        doc = await source(doc_id, version, tenant)
        path = rendition_path(resolver.model, doc["content_hash"])
        try:
            rendition = await asyncio.to_thread(xdb.find_document, path=path, id_prefix=tenant.owner)
        except NotFound:
            raise NotFound(f"document {doc_id!r} version {doc['version']} has no condensed rendition for "
                           f"{resolver.model!r}; POST here to make one") from None
        return unscoped(tenant, rendition, "id")

    @router.post("/{doc_id}/condensed")
    async def condense(doc_id: str, tenant: Caller, version: Version = None) -> Any:
        """Make the rendition now with the served model (or return the stored one)."""
        doc = await source(doc_id, version, tenant)
        made = await condenser.rendition_for(source_document({**doc, "id": doc_id}), tenant.owner)
        if made is None:
            raise Conflict(f"the served model's rendition of {doc_id!r} version {doc['version']} was no shorter "
                           "than the document (or the document is too long for one call); nothing was stored")
        stored = await asyncio.to_thread(xdb.find_document, path=rendition_path(resolver.model, doc["content_hash"]),
                                         id_prefix=tenant.owner)
        return unscoped(tenant, stored, "id")

    return router
