"""`/v1/context/sessions`: the sessions the server keeps, where each stands in its window, a
compaction on request, their stored State versions, rollback and deletion.

Each turn of a session saves its State as a new version (the last 16 are kept). A rollback stores an
earlier version again as the newest, so the session's next turn continues from it; the history is
never rewritten. Both rollback and deletion wait for the session's running turn to end and for its
last save to land (they go through the same ordered worker as the saves), and are audit events.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from core.limits import ID_MAX_CHARS
from orchestrator.retrieval import ScopedIndexes
from orchestrator.session import SessionStore
from server.http.errors import AHCRoute
from server.memory.memory_tools import request_compaction
from server.tenancy.tenant_xdb import TenantViews, TenantXDB
from xdb import XDBClient


class SessionInfo(BaseModel):
    session_id: str
    last_tick: int | None  # the last recorded tick (None: nothing recorded)
    latest_version: int | None  # the newest stored State version (None: no State saved)
    versions: int
    updated_at: str | None
    turns: int  # its turn records: one a completed request
    prompt_tokens: int  # summed over its turns, as the engine counted them
    cached_tokens: int
    completion_tokens: int
    last_turn_at: str | None


class SessionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SessionInfo]
    has_more: bool


class StateVersion(BaseModel):
    version: int
    sha256: str
    created_at: str
    bytes: int
    intact: bool  # its bytes still match its SHA-256


class VersionList(BaseModel):
    object: Literal["list"] = "list"
    session_id: str
    data: list[StateVersion]


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1, strict=True)


class RollbackResult(BaseModel):
    session_id: str
    version: int  # the new newest version, a copy of `restored_from`
    restored_from: int


class SessionContext(BaseModel):
    """Where a session stands, as of its last turn: what a coding agent's `/context` shows."""

    object: Literal["context.session"] = "context.session"
    session_id: str
    window: int  # the model's context window (max_model_len)
    mode: str | None  # cag | rag | passthrough (None: no turn recorded)
    blocks: dict[str, int]  # tokens per prompt block, in the prompt's order
    prompt_tokens: int | None
    cached_tokens: int | None
    cached_share: float | None  # of the last prompt, read from the prefix cache
    window_share: float | None  # of the window the last prompt filled
    turns: int
    compactions: int
    last_turn_at: str | None


class CompactionRequested(BaseModel):
    object: Literal["context.compaction"] = "context.compaction"
    session_id: str
    status: Literal["pending"] = "pending"  # the session's next turn compacts first
    turns: int  # the messages the State holds verbatim now


class SessionDeleted(BaseModel):
    id: str
    object: Literal["session.deleted"] = "session.deleted"
    deleted: bool
    rows: dict[str, int]  # rows deleted per table


def session_router(xdb: XDBClient, store: SessionStore, background: ThreadPoolExecutor,
                   rag_indexes: ScopedIndexes, window: int) -> APIRouter:
    """`window`: the model's context window, which a session's prompt is measured against."""
    router = APIRouter(prefix="/v1/context/sessions", tags=["context"], route_class=AHCRoute)
    views = TenantViews(xdb)

    async def ordered(fn: Any, *args: Any) -> Any:
        """On the worker the State saves use, so a save submitted earlier lands first."""
        return await asyncio.wrap_future(background.submit(fn, *args))

    @router.get("")
    async def listing(limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                      after: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
                      view: TenantXDB = Depends(views)) -> SessionList:
        rows = await asyncio.to_thread(view.sessions, limit + 1, after)
        return SessionList(data=[SessionInfo(**row) for row in rows[:limit]], has_more=len(rows) > limit)

    @router.get("/{session_id}")
    async def context(session_id: str, view: TenantXDB = Depends(views)) -> SessionContext:
        found = await asyncio.to_thread(view.session_context, session_id)
        prompt = found["prompt_tokens"]
        return SessionContext(**found, window=window, window_share=prompt / window if prompt is not None else None)

    @router.get("/{session_id}/versions")
    async def versions(session_id: str, view: TenantXDB = Depends(views)) -> VersionList:
        rows = await asyncio.to_thread(view.session_versions, session_id)
        return VersionList(session_id=session_id, data=[StateVersion(**row) for row in rows])

    @router.post("/{session_id}/rollback")
    async def rollback(session_id: str, body: RollbackBody, view: TenantXDB = Depends(views)) -> RollbackResult:
        stored = view.stored_id(session_id)
        async with store.lock(stored):
            result = await ordered(view.rollback_session, session_id, body.version)
            store.forget(stored)  # the next turn loads the restored State
        return RollbackResult(**result)

    @router.post("/{session_id}/compact", status_code=202)
    async def compact(session_id: str, view: TenantXDB = Depends(views)) -> CompactionRequested:
        """The session's next turn compacts its State first, as an automatic compaction does (its
        summary call continues that turn's cached prompt, which only a turn brings)."""
        requested = await request_compaction(view, store, session_id)
        return CompactionRequested(session_id=session_id, turns=requested["turns"])

    @router.delete("/{session_id}")
    async def delete(session_id: str, view: TenantXDB = Depends(views)) -> SessionDeleted:
        stored = view.stored_id(session_id)
        async with store.lock(stored):
            rows = await ordered(view.delete_session, session_id)
            store.forget(stored)
        await ordered(rag_indexes.drop, stored)
        return SessionDeleted(id=session_id, deleted=True, rows=rows)

    return router
