"""The read side the experience browser (`/ui/`) draws from, as ordinary API routes under `/v1/xdb`:

    GET  /sessions                    ?q=&limit=  the caller's sessions, most recently active first
    GET  /sessions/{session_id}/turns the session turn by turn: cache report, usage, why the cache broke,
                                      inputs, tool calls and results, governor actions, compactions
    GET  /concepts/{concept}/top_tokens ?limit=  the caller's tokens that activated the concept most
    GET  /audit                       the audit chain's head and the last verification's result
    POST /audit/verify                verify the chain now, from where the last intact verification
                                      ended (the whole of it at first and hourly; the result is kept
                                      for GET /audit); one at a time, not again within a cooldown (429)

The audit's records themselves stay out of reach: only the head (already on /metrics) and a verdict.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from core.errors import RateLimited
from core.limits import ID_MAX_CHARS
from server.http.errors import AHCRoute
from server.tenancy.tenant_xdb import TenantViews, TenantXDB
from xdb import XDBClient


@dataclass
class Verification:
    ok: bool
    records_checked: int
    first_bad: str | None
    finished_at: str
    seconds: float
    from_seq: int  # the first record re-hashed: 0 for the whole chain, else where the last one ended
    erased: list[str] = field(default_factory=list)  # the sessions deleted by policy, each at its deletion record


class AuditVerifier:
    """Runs one verification at a time and remembers the last verdict for the audit page.

    Re-hashing the whole chain takes about 4 µs a record (minutes at 100M records), so a verification
    goes on from where the last intact one ended: the concept and checkpoint chains whole, the records
    from the checkpoint before that point, and the anchor. The whole chain is re-hashed by the first
    verification, after a broken one, once `full_every_s` has passed since the last whole one, and at
    every start of the server, in the background (and by `ahc xdb verify-audit`). Any tenant may ask for one; a request
    while one runs, or within `cooldown_s` (at least ten times the last one's duration) after it, is a
    429 with the seconds to wait."""

    def __init__(self, xdb: XDBClient, cooldown_s: float = 10.0, full_every_s: float = 3600.0) -> None:
        self._xdb = xdb
        self._lock = threading.Lock()
        self.cooldown_s, self.full_every_s = cooldown_s, full_every_s
        self._ready_at = 0.0  # monotonic time the next verification may start
        self._verified_through = -1  # the last seq an intact verification covered (-1: none yet)
        self._full_at = -math.inf  # monotonic time of the last whole-chain verification
        self.last: Verification | None = None

    def verify(self) -> Verification:
        if not self._lock.acquire(blocking=False):
            raise RateLimited("an audit verification is already running; its result will be on GET /v1/xdb/audit",
                              retry_after_s=max(1, round(self.cooldown_s)), code="verification_running")
        try:
            wait = self._ready_at - time.monotonic()
            if wait > 0:
                raise RateLimited(f"the audit chain was verified moments ago (GET /v1/xdb/audit has the result); "
                                  f"verify again in {wait:.0f} s", retry_after_s=max(1, round(wait)),
                                  code="verification_cooldown")
            started = time.monotonic()
            full = self._verified_through < 0 or started - self._full_at >= self.full_every_s
            from_seq = 0 if full else self._verified_through + 1
            head_seq, _ = self._xdb.audit_head()  # the snapshot the check reads holds at least this much
            report = self._xdb.verify_audit(None if full else from_seq)
            seconds = time.monotonic() - started
            if report.ok:
                self._verified_through = max(self._verified_through, head_seq)
                self._full_at = started if full else self._full_at
            else:
                self._verified_through = -1  # the next one re-hashes everything
            self.last = Verification(ok=report.ok, records_checked=report.records_checked,
                                     first_bad=report.first_bad,
                                     finished_at=dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
                                     seconds=round(seconds, 3), from_seq=from_seq, erased=report.erased)
            self._ready_at = time.monotonic() + max(self.cooldown_s, 10 * seconds)
            return self.last
        finally:
            self._lock.release()


def browse_router(xdb: XDBClient, verifier: AuditVerifier | None = None) -> APIRouter:
    """Plain `def` handlers: each runs on FastAPI's thread pool, off the event loop. `verifier`: the
    server's one (the auditor's routes share it), else one of its own."""
    router = APIRouter(prefix="/v1/xdb", tags=["browse"], route_class=AHCRoute)
    verifier = verifier or AuditVerifier(xdb)
    views = TenantViews(xdb)

    @router.get("/sessions")
    def sessions(q: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 200, view: TenantXDB = Depends(views)) -> Any:
        """Turns, prompt/cached/generated tokens, hit ratio, last activity, last mode, pinned/submitted."""
        return {"object": "list", "data": view.sessions_overview(limit, q or None)}

    # `:path` so an id with an escaped "/" (decoded before routing) still reaches the route.
    @router.get("/sessions/{session_id:path}/turns")
    def session_turns(session_id: str, view: TenantXDB = Depends(views)) -> Any:
        return view.session_turns(session_id)

    @router.get("/concepts/{concept}/top_tokens")
    def top_tokens(concept: str, limit: Annotated[int, Query(ge=1, le=1000)] = 50,
                   view: TenantXDB = Depends(views)) -> Any:
        return {"object": "list", "concept": concept, "data": view.top_tokens(concept, limit)}

    @router.get("/audit")
    def audit() -> Any:
        seq, head = xdb.audit_head()
        last = verifier.last
        return {"head_seq": seq, "head_sha256": head, "last_verification": asdict(last) if last else None}

    @router.post("/audit/verify")
    def verify_audit() -> Any:
        return asdict(verifier.verify())

    return router
