"""`/v1/context/karma`: the review step (server/karma/karma_review.py). A tenant proposes an outcome for
Karma and lists its proposals; a reviewer decides one (a person with an auditor's key or as the server's
operator, or the served model for anyone who may see it); an accepted one is retracted the same way; and
`GET /v1/context/karma` says what a session's prompts carry from it."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.errors import InvalidRequest, PermissionDenied
from core.limits import ID_MAX_CHARS, KARMA_TEXT_MAX_CHARS
from server.http.errors import AHCRoute
from server.karma.karma_review import KarmaReview
from server.tenancy.request_context import Caller
from server.tenancy.tenant_xdb import TenantViews, TenantXDB
from xdb import XDBClient
from xdb.karma_reviews import STATUSES
from xdb.schema import INT64_MAX

RATIONALE_MAX_CHARS = 4_000
ProposalId = Annotated[int, Field(ge=1, le=INT64_MAX)]
Tick = Annotated[int, Field(ge=0, le=INT64_MAX)]


class ProposalBody(BaseModel):
    """An outcome to verify: its text, the Karma it joins once accepted (its session's, or every session's
    of the tenant), and the evidence it cites: a session and tick range, or a reply's or event's id."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=KARMA_TEXT_MAX_CHARS)
    scope: Literal["session", "tenant"] = "session"
    session_id: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)
    source_session_id: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)
    tick_range: tuple[Tick, Tick] | None = None
    event_id: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)

    @model_validator(mode="after")
    def _consistent(self) -> ProposalBody:
        if self.scope == "session" and self.session_id is None:
            raise ValueError("session_id: a proposal of scope 'session' names the session whose Karma it joins")
        if self.scope == "tenant" and self.session_id is not None:
            raise ValueError("session_id: a proposal of scope 'tenant' joins every session's Karma; name none")
        if self.tick_range is not None and self.tick_range[0] > self.tick_range[1]:
            raise ValueError("tick_range: its start comes after its end")
        if self.source_session_id is None and (self.tick_range is not None or self.event_id is None):
            raise ValueError("source_session_id: cite the evidence, a session (with a tick_range) or an event_id")
        return self


class ReviewBody(BaseModel):
    """A person's verdict and rationale, or `{"reviewer": "model"}` for the served model's."""

    model_config = ConfigDict(extra="forbid")
    reviewer: Literal["person", "model"] = "person"
    verdict: Literal["accepted", "rejected"] | None = None
    rationale: str | None = Field(None, min_length=1, max_length=RATIONALE_MAX_CHARS)

    @model_validator(mode="after")
    def _complete(self) -> ReviewBody:
        if self.reviewer == "person" and (self.verdict is None or self.rationale is None):
            raise ValueError("verdict: a person's review gives a verdict and a rationale")
        if self.reviewer == "model" and (self.verdict is not None or self.rationale is not None):
            raise ValueError("verdict: the model gives the verdict and the rationale itself")
        return self


class RetractBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rationale: str = Field(min_length=1, max_length=RATIONALE_MAX_CHARS)


def karma_router(xdb: XDBClient, review: KarmaReview) -> APIRouter:
    router = APIRouter(prefix="/v1/context/karma", route_class=AHCRoute, tags=["context"])
    views = TenantViews(xdb)

    @router.post("/proposals")
    async def propose(body: ProposalBody, caller: Caller, view: TenantXDB = Depends(views)) -> Any:
        if caller.auditor:
            raise PermissionDenied("an auditor reviews proposals for Karma and proposes none")
        return await asyncio.to_thread(view.propose_karma, body.scope, body.session_id, body.text,
                                       body.source_session_id, body.tick_range, body.event_id)

    @router.get("/proposals")
    async def proposals(caller: Caller, status: Annotated[Literal[STATUSES] | None, Query()] = None,  # type: ignore[valid-type]
                        limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
        """Oldest first: a tenant's own; a reviewer's (an auditor, the operator), every tenant's, ids as stored."""
        return {"object": "list", "data": await asyncio.to_thread(review.proposals, caller, status, limit)}

    @router.post("/proposals/{proposal_id}/review")
    async def review_proposal(proposal_id: ProposalId, body: ReviewBody, caller: Caller) -> Any:
        return await review.review(caller, proposal_id, body.reviewer, body.verdict, body.rationale)

    @router.post("/proposals/{proposal_id}/retract")
    async def retract(proposal_id: ProposalId, body: RetractBody, caller: Caller) -> Any:
        return await review.retract(caller, proposal_id, body.rationale)

    @router.get("")
    async def promoted(caller: Caller, view: TenantXDB = Depends(views),
                       session_id: Annotated[str | None, Query(min_length=1, max_length=ID_MAX_CHARS)] = None) -> Any:
        """The accepted outcomes a session's prompts carry (the tenant's, then the session's), in order."""
        if caller.auditor:
            raise InvalidRequest("an auditor holds no sessions: their Karma is read with the tenant's key")
        return {"object": "list", "data": await asyncio.to_thread(view.promoted_karma, session_id)}

    return router
