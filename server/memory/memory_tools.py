"""Running one memory tool call (orchestrator/memory_tools.py) for the client that got it back from the
model: its arguments checked against the tool's schema, then the verb run on the session's rows through
the caller's tenant view. A bad argument is the model's mistake, not the client's: it comes back as the
tool's result (`{"error": ...}`), which the client hands the model, as `query_archive` does."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import jsonschema

from core.errors import InvalidRequest, NotFound
from orchestrator.memory_tools import MEMORY_TOOLS, RECALL_MAX_LIMIT
from orchestrator.session import SessionStore
from server.tenancy.tenant_xdb import TenantTarget, TenantXDB
from xdb.recall.recall import RecallFilters

# What a recalled moment tells the model: enough to cite it by tick, not the row's bookkeeping.
RECALLED = ("tick", "event_type", "role", "content", "tags")


@dataclass(frozen=True)
class MemoryCall:
    session_id: str
    name: str
    arguments: dict[str, Any] | str


def parse_arguments(call: MemoryCall) -> dict[str, Any]:
    """The call's arguments as the tool's schema allows them; InvalidRequest (the model's mistake) if not."""
    raw = call.arguments
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"arguments are not valid JSON: {exc.msg}", param="arguments") from None
    schema = MEMORY_TOOLS[call.name]["function"]["parameters"]
    try:
        jsonschema.validate(raw, schema)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path)
        raise InvalidRequest(f"{call.name}: {where + ': ' if where else ''}{exc.message}", param="arguments") from None
    assert isinstance(raw, dict)
    return raw


async def run(call: MemoryCall, view: TenantXDB, sessions: SessionStore) -> dict[str, Any]:
    """The tool's result for the model: what the verb returned, or `{"error": {"type", "message"}}`."""
    try:
        arguments = parse_arguments(call)
        if call.name == "request_compaction":
            return await request_compaction(view, sessions, call.session_id)
        return await asyncio.to_thread(_run_xdb, call, arguments, view)
    except (InvalidRequest, NotFound) as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}


def _run_xdb(call: MemoryCall, args: dict[str, Any], view: TenantXDB) -> dict[str, Any]:
    session = call.session_id
    span = _span(args)
    if call.name == "recall":
        tags = [args["tag"]] if "tag" in args else None
        filters = RecallFilters(session_id=session, text=args.get("text"), tags=tags,
                                tick_from=args.get("tick_from"), tick_to=args.get("tick_to"),
                                limit=min(int(args.get("limit", 5)), RECALL_MAX_LIMIT))
        page = view.recall_page(filters)
        return {"moments": [{k: row.get(k) for k in RECALLED} for row in page["data"]], "has_more": page["has_more"]}
    if call.name == "tag":
        row = view.tag(args["tag"], TenantTarget(session_id=session, tick_range=span), note=args.get("note"))
        return {"tagged": args["tag"], "ticks": list(span), "tag_id": row.get("tag_id", row.get("id"))}
    if call.name == "comment":
        row = view.comment(args["content"], TenantTarget(session_id=session, tick=args["tick"]))
        return {"commented": args["tick"], "comment_id": row.get("id")}
    if call.name == "pin":
        row = view.pin(session, span[0], span[1], args.get("reason"))
        return {"pinned": list(span), "window_id": row.get("id")}
    raise InvalidRequest(f"unknown memory tool {call.name!r}", param="name")


def _span(args: dict[str, Any]) -> tuple[int, int]:
    start = args.get("tick_from", args.get("tick", 0))
    end = args.get("tick_to", start)
    if end < start:
        raise InvalidRequest(f"tick_to ({end}) is before tick_from ({start})", param="tick_to")
    return start, end


async def request_compaction(view: TenantXDB, store: SessionStore, session_id: str) -> dict[str, Any]:
    """The session's next turn compacts its State first, as an automatic compaction does (its summary call
    continues that turn's cached prompt, which only a turn brings)."""
    stored = view.stored_id(session_id)
    async with store.lock(stored):
        session = await store.aget(stored)
        if not session.messages:
            raise NotFound(f"session {session_id!r} has no State messages to compact")
        session.compaction_requested = True
        receipt = store.save(session)
        if isinstance(receipt, Future):
            await asyncio.wrap_future(receipt)
    return {"compaction_requested": True, "session_id": session_id, "turns": len(session.messages)}
