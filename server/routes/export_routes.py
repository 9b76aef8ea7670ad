"""`/v1/xdb/exports`: the experience database exported while the server runs (it holds the files, so
`ahc xdb export` cannot), listed, and its files downloaded.

An export is each table's rows as Parquet (or JSON lines) partitioned by session, under
DATA_DIR/exports/<id>/, with a manifest: row counts, each file's SHA-256, the audit head at export
time. A tenant exports, lists, downloads and deletes its own sessions' rows and documents only.

An export is a full copy, so it is bounded: a tenant makes one at a time and holds at most
`xdb.max_exports_per_tenant` (429 past either, with when to retry), each is deleted
`xdb.export_ttl_s` after it was made, and their bytes count against `xdb.quota_bytes` (the oldest
go first). Manifests name files relative to the export, never the server's own paths.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from core.errors import NotFound, RateLimited
from core.limits import ID_MAX_CHARS
from server.http.errors import AHCRoute
from server.tenancy.tenant_xdb import TenantViews, TenantXDB
from server.tenancy.tenants import Tenant
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
    bytes: int  # of its files
    expires_at: str  # when the server deletes it
    # Engines that recorded into this XDB and must travel with its rows: "emulated:PROFILE" (absent: none).
    engines: list[str] | None = None


class ExportList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ExportManifest]


class ExportDeleted(BaseModel):
    id: str
    object: Literal["export"] = "export"
    deleted: bool = True


class TenantExports:
    """One export at a time per tenant, and at most `limit` held."""

    def __init__(self, limit: int, ttl_s: float) -> None:
        self.limit, self.ttl_s = limit, ttl_s
        self._running: set[str] = set()
        self._lock = threading.Lock()

    @contextmanager
    def making(self, tenant: Tenant, held: list[dict[str, Any]]) -> Iterator[None]:
        if len(held) >= self.limit:
            oldest = _expires_at(held[-1], self.ttl_s) - dt.datetime.now(dt.UTC)
            raise RateLimited(f"this tenant holds {len(held)} exports, the most it may; delete one "
                              "(DELETE /v1/xdb/exports/{id}) or wait for the oldest to expire",
                              retry_after_s=max(1, round(oldest.total_seconds())), code="export_limit")
        with self._lock:
            if tenant.name in self._running:
                raise RateLimited("this tenant's previous export is still being made; retry when it is done",
                                  retry_after_s=5, code="export_running")
            self._running.add(tenant.name)
        try:
            yield
        finally:
            with self._lock:
                self._running.discard(tenant.name)


def export_router(xdb: XDBClient, max_per_tenant: int = 4, ttl_s: float = 86_400.0) -> APIRouter:
    """Plain `def` handlers: FastAPI runs them on its thread pool, off the event loop."""
    router = APIRouter(prefix="/v1/xdb/exports", tags=["xdb"], route_class=AHCRoute)
    bounds = TenantExports(max_per_tenant, ttl_s)
    views = TenantViews(xdb)

    @router.post("")
    def create(body: ExportBody, view: TenantXDB = Depends(views)) -> ExportManifest:
        since = body.since.isoformat() if body.since is not None else None
        with bounds.making(view.tenant, view.exports()):
            made = view.export(body.format, body.session_id, since)
        return ExportManifest.model_validate(_shown(made, ttl_s))

    @router.get("")
    def listing(view: TenantXDB = Depends(views)) -> ExportList:
        return ExportList(data=[ExportManifest.model_validate(_shown(m, ttl_s)) for m in view.exports()])

    @router.get("/{export_id}")
    def one(export_id: str, view: TenantXDB = Depends(views)) -> ExportManifest:
        return ExportManifest.model_validate(_shown(view.export_manifest(export_id), ttl_s))

    @router.delete("/{export_id}")
    def delete(export_id: str, view: TenantXDB = Depends(views)) -> ExportDeleted:
        if not view.delete_export(export_id):
            raise NotFound(f"export {export_id!r} not found")
        return ExportDeleted(id=export_id)

    @router.get("/{export_id}/files/{path:path}", response_class=FileResponse)
    def download(export_id: str, path: str, view: TenantXDB = Depends(views)) -> FileResponse:
        found = view.export_manifest(export_id)
        # Only a file the manifest lists: a path is never joined to the directory unchecked.
        listed = {f["path"] for table in found["tables"].values() for f in table["files"]} | {"manifest.json"}
        if path not in listed:
            raise NotFound(f"export {export_id!r} has no file {path!r}")
        return FileResponse(Path(found["path"]) / path, filename=Path(path).name)

    return router


def _expires_at(manifest: dict[str, Any], ttl_s: float) -> dt.datetime:
    made = dt.datetime.fromisoformat(manifest["created_at"].replace("Z", "+00:00"))
    return made + dt.timedelta(seconds=ttl_s)


def _shown(manifest: dict[str, Any], ttl_s: float) -> dict[str, Any]:
    """A tenant's manifest as it is shown: without the export's path on the server, with its expiry."""
    expires = _expires_at(manifest, ttl_s).isoformat().replace("+00:00", "Z")
    return {**{k: v for k, v in manifest.items() if k != "path"}, "expires_at": expires}
