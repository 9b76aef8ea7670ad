"""The discovery agent's tables over HTTP: `interaction_log` and `meta_knowledge` in the server's XDB.

The server owns its DuckDB file (one writing process per file), so an agent running against it logs
its turns and knowledge snapshots here instead of opening the file (agent/run_store.py is the
client). Routes, under `/v1/xdb`:

    POST   /interactions      {run_id, journal_entry?, tool_call_json?, tool_result_json?, token_count?} -> {turn_id}
    GET    /interactions      ?run_id=&pattern=&after_turn=&last=  -> {object: list, data: [rows]}
    POST   /meta_knowledge    {run_id, theorems_json?, negative_knowledge?, last_compacted_turn?} -> {version_id}
    GET    /meta_knowledge    ?run_id=&all=false  -> {object: list, data: [latest] or every version}
    DELETE /runs/{run_id}     -> {deleted: {interaction_log: n, meta_knowledge: n}}  (a fresh run's reset;
                              run_id percent-encoded, an escaped "/" included)
    GET    /runs              ?limit=100 (1..1000)  -> {object: list, data: [{run_id, turns, first_at, last_at,
                              knowledge_versions, theorems, has_report}]}  (the tenant's runs, latest activity first)
    PUT    /runs/{run_id}/report      {png_base64}  -> {run_id, version, bytes}  (the end-of-run report.png,
                              kept as an XDB document, a new version per upload; at most 8 MiB of PNG)
    GET    /runs/{run_id}/report.png  -> the latest report, image/png; 404 if none was uploaded
    POST   /run_progress      {run_id, rule, strategy, strategy_json?, status, turns, tokens, laws_tried,
                              laws_passed, laws_failed, theorems_stored, theorems_retracted, wall_s} -> {progress_id}
    POST   /run_attempts      {run_id, rule, turn, kind, subject, verdict, law_json?, detail?} -> {attempt_id}
    POST   /theorem_versions  {run_id, theorem_id, change, turn, theorem_json, reason?} -> {version}
    GET    /theorem_versions  ?run_id=&theorem_id=  -> {object: list, data: [every version, parent linked]}
    GET    /runs/history      ?rule=&strategy=&limit=  -> {runs, strategies, failed_laws, retracted_theorems}
                              (xdb/run_history.py: which strategies solved a rule, in how many turns; which
                              laws failed most)

Bodies and queries are typed: bad input is a 400 naming the parameter; an unknown run is an empty
list, never a 404 (except its report, which is a file that either exists or does not).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from core.errors import InvalidRequest, NotFound
from server.http.errors import AHCRoute
from server.tenancy.tenant_xdb import TenantViews, TenantXDB
from xdb import XDBClient
from xdb.run_history import AttemptKind, Progress, RunStatus, TheoremChange, Verdict
from xdb.runs import REPORT_MAX_BYTES
from xdb.schema import INT32_MAX, INT64_MAX

RUN_ID = Field(min_length=1, max_length=256)
RunIdPath = Annotated[str, Path(min_length=1, max_length=256)]
# The base64 text of the largest PNG accepted: longer text is refused before it is decoded.
REPORT_MAX_BASE64 = 4 * -(-REPORT_MAX_BYTES // 3)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InteractionBody(_Body):
    run_id: str = RUN_ID
    journal_entry: str | None = None
    tool_call_json: str | None = None
    tool_result_json: str | None = None
    token_count: int | None = Field(None, ge=0, le=INT32_MAX)  # an INTEGER column


class KnowledgeBody(_Body):
    run_id: str = RUN_ID
    theorems_json: str | None = None
    negative_knowledge: str | None = None
    last_compacted_turn: int | None = Field(None, ge=0, le=INT64_MAX)


class ProgressBody(_Body):
    run_id: str = RUN_ID
    rule: str = Field(min_length=1, max_length=256)
    strategy: str = Field(min_length=1, max_length=256)
    strategy_json: str | None = None
    status: RunStatus
    turns: int = Field(ge=0, le=INT32_MAX)
    tokens: int = Field(0, ge=0, le=INT64_MAX)
    laws_tried: int = Field(0, ge=0, le=INT32_MAX)
    laws_passed: int = Field(0, ge=0, le=INT32_MAX)
    laws_failed: int = Field(0, ge=0, le=INT32_MAX)
    theorems_stored: int = Field(0, ge=0, le=INT32_MAX)
    theorems_retracted: int = Field(0, ge=0, le=INT32_MAX)
    wall_s: float = Field(0.0, ge=0.0)


class AttemptBody(_Body):
    run_id: str = RUN_ID
    rule: str = Field(min_length=1, max_length=256)
    turn: int = Field(ge=0, le=INT32_MAX)
    kind: AttemptKind
    subject: str = Field(min_length=1, max_length=256)
    verdict: Verdict
    law_json: str | None = None
    detail: str | None = None


class TheoremVersionBody(_Body):
    run_id: str = RUN_ID
    theorem_id: str = Field(min_length=1, max_length=64)
    change: TheoremChange
    turn: int = Field(ge=0, le=INT32_MAX)
    theorem_json: str = Field(min_length=2)
    reason: str | None = Field(None, max_length=2000)


class ReportBody(_Body):
    png_base64: str


def decode_png(text: str) -> bytes:
    """`png_base64`'s bytes; the PNG itself is checked by XDB (signature, size), for every store alike."""
    if len(text) > REPORT_MAX_BASE64:
        raise InvalidRequest(f"png_base64: {len(text)} characters of base64 is over the {REPORT_MAX_BYTES}-byte "
                             "limit on the PNG", param="png_base64")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or a non-ASCII character
        raise InvalidRequest("png_base64: not valid base64", param="png_base64") from None


def agent_router(xdb: XDBClient) -> APIRouter:
    """The routes over one XDB. Plain `def` handlers run on FastAPI's thread pool, off the event loop.
    A run is the calling tenant's: its id goes in scoped and comes back as the tenant named it."""
    router = APIRouter(prefix="/v1/xdb", tags=["agent"], route_class=AHCRoute)
    views = TenantViews(xdb)

    @router.post("/interactions")
    def log_interaction(body: InteractionBody, view: TenantXDB = Depends(views)) -> Any:
        return {"turn_id": view.log_interaction(body.run_id, **body.model_dump(exclude={"run_id"}))}

    @router.get("/interactions")
    def interactions(run_id: Annotated[str, Query(min_length=1, max_length=256)],
                     pattern: str | None = None,
                     after_turn: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
                     last: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None,
                     view: TenantXDB = Depends(views)) -> Any:
        rows = view.interactions(run_id, pattern=pattern or None, after_turn=after_turn, last=last)
        return {"object": "list", "data": rows}

    @router.post("/meta_knowledge")
    def save_meta_knowledge(body: KnowledgeBody, view: TenantXDB = Depends(views)) -> Any:
        return {"version_id": view.save_meta_knowledge(body.run_id, **body.model_dump(exclude={"run_id"}))}

    @router.get("/meta_knowledge")
    def meta_knowledge(run_id: Annotated[str, Query(min_length=1, max_length=256)],
                       all: bool = False,  # noqa: A002 (the query parameter's name)
                       view: TenantXDB = Depends(views)) -> Any:
        return {"object": "list", "data": view.meta_knowledge(run_id, latest=not all)}

    # `:path` so a run id with an escaped `/` (%2F, decoded before routing) still reaches this route.
    @router.delete("/runs/{run_id:path}")
    def purge(run_id: str, view: TenantXDB = Depends(views)) -> Any:
        return {"run_id": run_id, "deleted": view.purge_run(run_id)}

    @router.post("/run_progress")
    def record_progress(body: ProgressBody, view: TenantXDB = Depends(views)) -> Any:
        fields = body.model_dump(exclude={"run_id"})
        return {"progress_id": view.record_progress(body.run_id, Progress(**fields))}

    @router.post("/run_attempts")
    def record_attempt(body: AttemptBody, view: TenantXDB = Depends(views)) -> Any:
        return {"attempt_id": view.record_attempt(body.run_id, **body.model_dump(exclude={"run_id"}))}

    @router.post("/theorem_versions")
    def record_theorem_version(body: TheoremVersionBody, view: TenantXDB = Depends(views)) -> Any:
        return {"version": view.record_theorem_version(body.run_id, **body.model_dump(exclude={"run_id"}))}

    @router.get("/theorem_versions")
    def theorem_lineage(run_id: Annotated[str, Query(min_length=1, max_length=256)],
                        theorem_id: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
                        view: TenantXDB = Depends(views)) -> Any:
        return {"object": "list", "data": view.theorem_lineage(run_id, theorem_id)}

    @router.get("/runs/history")
    def history(rule: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
                strategy: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100, view: TenantXDB = Depends(views)) -> Any:
        return view.run_history(rule, strategy, limit)

    @router.get("/runs")
    def runs(limit: Annotated[int, Query(ge=1, le=1000)] = 100, view: TenantXDB = Depends(views)) -> Any:
        return {"object": "list", "data": view.runs(limit)}

    @router.put("/runs/{run_id:path}/report")
    def save_report(run_id: RunIdPath, body: ReportBody, view: TenantXDB = Depends(views)) -> Any:
        png = decode_png(body.png_base64)
        doc = view.save_run_report(run_id, png)
        return {"run_id": run_id, "version": doc["version"], "bytes": len(png)}

    @router.get("/runs/{run_id:path}/report.png", response_class=Response)
    def report(run_id: RunIdPath, view: TenantXDB = Depends(views)) -> Response:
        png = view.run_report(run_id)
        if png is None:
            raise NotFound(f"run {run_id!r} has no report", param="run_id")
        # A later upload replaces the report under the same URL: the browser must ask again.
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-cache"})

    return router
