"""`/v1/audit`: the audit log, read by an auditor's key and by no other (server/tenancy/auth.py).

The log holds every recorded row and every deletion or rewrite of XDB, chained by hash. An auditor
reads its records by session, event type and time, its anchored head, and has the chain verified;
ids are as stored (a tenant's carry its prefix), since the log spans every tenant.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from core.limits import ID_MAX_CHARS
from server.http.errors import AHCRoute
from server.routes.browse_routes import AuditVerifier
from xdb import XDBClient


def _utc(at: datetime | None) -> datetime | None:
    """The log's times are naive UTC: an aware time is converted, a naive one read as UTC. A time within
    a day of year 1 or 9999 whose offset carries it off the calendar (0001-01-01T00:00+01:00) is still a
    bound: before, or after, every record the log can hold."""
    if at is None or at.tzinfo is None:
        return at
    try:
        return at.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:
        return datetime.min if (at.utcoffset() or timedelta(0)) > timedelta(0) else datetime.max


def audit_router(xdb: XDBClient, verifier: AuditVerifier) -> APIRouter:
    """Plain `def` handlers: each runs on FastAPI's thread pool, off the event loop; `verifier`: the
    server's one, so a verification asked here and one asked from the browser do not both run."""
    router = APIRouter(prefix="/v1/audit", tags=["audit"], route_class=AHCRoute)

    @router.get("/records")
    def records(session_id: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                event_type: Annotated[str | None, Query(max_length=64)] = None,
                since: datetime | None = None, until: datetime | None = None,
                after: Annotated[int, Query(ge=-1)] = -1,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
        """Records in chain order after seq `after`; `since` inclusive, `until` exclusive (ISO 8601)."""
        rows = xdb.audit_records(session_id, event_type, _utc(since), _utc(until), after, limit + 1)
        return {"object": "list", "data": rows[:limit], "has_more": len(rows) > limit}

    @router.get("/head")
    def head() -> dict[str, Any]:
        seq, sha256 = xdb.audit_head()
        last = verifier.last
        return {"head_seq": seq, "head_sha256": sha256, "last_verification": asdict(last) if last else None}

    @router.post("/verify")
    def verify() -> dict[str, Any]:
        return asdict(verifier.verify())

    return router
