"""`/v1/xdb/exports`: the experience database exported while the server runs (it holds the files, so
`ahc xdb export` cannot), listed, and its files downloaded.

An export is each table's rows as Parquet (or JSON lines) partitioned by session, under
DATA_DIR/exports/<id>/, with a manifest: row counts, each file's SHA-256, the audit head at export
time. A tenant exports, lists and downloads its own sessions' rows and documents only.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from ahc.errors import NotFound
from ahc.limits import ID_MAX_CHARS
from server.errors import AHCRoute
from server.request_context import Caller
from server.tenants import Tenant
from xdb import XDBClient


class ExportBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS, description="only this session")
    since: dt.datetime | None = Field(None, description="only rows created from this time on (UTC if no offset)")
    format: Literal["parquet", "jsonl"] = "parquet"


class ExportFile(BaseModel):
    path: str  # relative to the export's directory; GET …/files/{path} downloads it
    bytes: int
    sha256: str


class ExportTable(BaseModel):
    rows: int
    files: list[ExportFile]
    partitioned_by: str | None


class AuditHead(BaseModel):
    seq: int
    hash: str


class ExportManifest(BaseModel):
    id: str
    created_at: str
    format: Literal["parquet", "jsonl"]
    filters: dict[str, str | None]
    audit_head: AuditHead  # the audit chain's head when the export was taken
    rows: int
    tables: dict[str, ExportTable]
    path: str  # the export's directory on the server


class ExportList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ExportManifest]


def export_router(xdb: XDBClient) -> APIRouter:
    """Plain `def` handlers: FastAPI runs them on its thread pool, off the event loop."""
    router = APIRouter(prefix="/v1/xdb/exports", tags=["xdb"], route_class=AHCRoute)

    def manifest(export_id: str, tenant: Tenant) -> dict[str, Any]:
        for found in xdb.exports(tenant.prefix):
            if found["id"] == export_id:
                return dict(found)
        raise NotFound(f"export {export_id!r} not found")

    @router.post("")
    def create(body: ExportBody, tenant: Caller) -> ExportManifest:
        since = body.since.isoformat() if body.since is not None else None
        made = xdb.export(None, body.format, session_id=tenant.scope_opt(body.session_id), since=since,
                          prefix=tenant.prefix)
        return ExportManifest.model_validate(_shown(made, tenant, body.session_id))

    @router.get("")
    def listing(tenant: Caller) -> ExportList:
        return ExportList(data=[ExportManifest.model_validate(_shown(m, tenant)) for m in xdb.exports(tenant.prefix)])

    @router.get("/{export_id}")
    def one(export_id: str, tenant: Caller) -> ExportManifest:
        return ExportManifest.model_validate(_shown(manifest(export_id, tenant), tenant))

    @router.get("/{export_id}/files/{path:path}", response_class=FileResponse)
    def download(export_id: str, path: str, tenant: Caller) -> FileResponse:
        found = manifest(export_id, tenant)
        # Only a file the manifest lists: a path is never joined to the directory unchecked.
        listed = {f["path"] for table in found["tables"].values() for f in table["files"]} | {"manifest.json"}
        if path not in listed:
            raise NotFound(f"export {export_id!r} has no file {path!r}")
        return FileResponse(Path(found["path"]) / path, filename=Path(path).name)

    return router


def _shown(manifest: dict[str, Any], tenant: Tenant, session_id: str | None = None) -> dict[str, Any]:
    """A manifest as the tenant sees it: its session filter as it named it, not the stored prefix."""
    filters = dict(manifest["filters"])
    if filters.get("session_id") is not None:
        filters["session_id"] = session_id or filters["session_id"].removeprefix(tenant.prefix)
    return {**{k: v for k, v in manifest.items() if k != "prefix"}, "filters": filters}
