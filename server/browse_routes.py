"""The read side the experience browser (`/ui/`) draws from, as ordinary API routes under `/v1/xdb`:

    GET  /sessions                    ?q=&limit=  the caller's sessions, most recently active first
    GET  /sessions/{session_id}/turns the session turn by turn: cache report, usage, why the cache broke,
                                      inputs, tool calls and results, governor actions, compactions
    GET  /concepts/{concept}/top_tokens ?limit=  the caller's tokens that activated the concept most
    GET  /audit                       the audit chain's head and the last verification's result
    POST /audit/verify                verify the whole chain now (the result is kept for GET /audit)

The audit's records themselves stay out of reach: only the head (already on /metrics) and a verdict.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ahc.limits import ID_MAX_CHARS
from server.errors import AHCRoute
from server.request_context import Caller
from xdb import XDBClient


@dataclass
class Verification:
    ok: bool
    records_checked: int
    first_bad: str | None
    finished_at: str
    seconds: float


class AuditVerifier:
    """Runs one verification at a time and remembers the last verdict for the audit page."""

    def __init__(self, xdb: XDBClient) -> None:
        self._xdb = xdb
        self._lock = threading.Lock()
        self.last: Verification | None = None

    def verify(self) -> Verification:
        with self._lock:
            started = time.monotonic()
            report = self._xdb.verify_audit()
            self.last = Verification(ok=report.ok, records_checked=report.records_checked,
                                     first_bad=report.first_bad,
                                     finished_at=dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
                                     seconds=round(time.monotonic() - started, 3))
            return self.last


def browse_router(xdb: XDBClient) -> APIRouter:
    """Plain `def` handlers: each runs on FastAPI's thread pool, off the event loop."""
    router = APIRouter(prefix="/v1/xdb", tags=["browse"], route_class=AHCRoute)
    verifier = AuditVerifier(xdb)

    @router.get("/sessions")
    def sessions(tenant: Caller, q: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> Any:
        """Turns, prompt/cached/generated tokens, hit ratio, last activity, last mode, pinned/submitted."""
        rows = xdb.sessions_overview(tenant.prefix, limit, q or None)
        return {"object": "list", "data": tenant.unscope_rows(rows, "session_id")}

    # `:path` so an id with an escaped "/" (decoded before routing) still reaches the route.
    @router.get("/sessions/{session_id:path}/turns")
    def session_turns(session_id: str, tenant: Caller) -> Any:
        found = xdb.session_turns(tenant.scope(session_id))
        return {**found, "session_id": session_id}

    @router.get("/concepts/{concept}/top_tokens")
    def top_tokens(concept: str, tenant: Caller, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> Any:
        rows = xdb.top_tokens(concept, tenant.prefix, limit)
        return {"object": "list", "concept": concept, "data": tenant.unscope_rows(rows, "session_id")}

    @router.get("/audit")
    def audit() -> Any:
        seq, head = xdb.audit_head()
        last = verifier.last
        return {"head_seq": seq, "head_sha256": head, "last_verification": asdict(last) if last else None}

    @router.post("/audit/verify")
    def verify_audit() -> Any:
        return asdict(verifier.verify())

    return router
