"""XDB as one tenant sees it: the one place where the ids a tenant names are scoped and unscoped.

A tenant's ids (sessions, runs, documents) are stored as its prefix followed by the id it named, and
handed back without it; listings are filtered by its owner string (server/tenancy/tenants.py, xdb/owner.py).
Routes take a `TenantXDB` (from the `TenantViews` dependency) instead of the XDB and the tenant, so no
route scopes an id, unscopes a row or passes an owner by hand: a route that forgot one would read
past its tenant without a sound. The view has no method that reaches past its tenant; what spans
every tenant (the operator's compaction of released rows, evidence on the shared buds, the audit's
head, concepts and buds, which are the server's shared vocabulary) stays on the XDB itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ahc.core.errors import InvalidRequest, NotFound
from server.tenancy.request_context import Caller
from server.tenancy.tenants import Tenant
from xdb import XDBClient
from xdb.documents import DocumentType, document_versions, find_document, get_document, list_documents
from xdb.recall.browse import session_context, session_turns, sessions_overview
from xdb.recall.recall import RecallFilters
from xdb.responses import (
    StoredResponse,
    delete_response,
    response_conversation,
    response_items,
    save_response,
    stored_response,
)
from xdb.rows import utf8
from xdb.runs import (
    list_interactions,
    list_runs,
    log_interaction,
    meta_knowledge,
    purge_run,
    run_report,
    save_meta_knowledge,
)
from xdb.session_state import list_sessions, state_versions
from xdb.storage.compression import cold_records
from xdb.storage.fidelity import list_windows, unpin
from xdb.tags import list_comments


@dataclass(frozen=True)
class TenantTarget:
    """What a tag or comment is put on, as the tenant names it."""

    timestep_id: int | None = None
    session_id: str | None = None
    tick: int | None = None
    event_id: str | None = None
    tick_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class TenantXDB:
    xdb: XDBClient
    tenant: Tenant

    @property
    def owner(self) -> str:
        """Whose rows a service working for this tenant may read (the condenser's renditions)."""
        return self.tenant.owner

    # -- ids in and out ---------------------------------------------------------------------------
    def stored_id(self, local_id: str) -> str:
        """The id as XDB stores it (what in-memory state keyed like XDB, a session's lock, is keyed by)."""
        return self.tenant.scope(local_id)

    def shown_id(self, stored_id: str) -> str:
        """A stored id of the tenant's as the tenant named it."""
        return self.tenant.unscope(stored_id)

    def _opt(self, local_id: str | None) -> str | None:
        return self.tenant.scope_opt(local_id)

    def _rows(self, rows: Iterable[dict[str, Any]], key: str = "session_id") -> list[dict[str, Any]]:
        return self.tenant.unscope_rows(rows, key)

    def _row(self, row: dict[str, Any], key: str = "session_id") -> dict[str, Any]:
        """One row with its id handed back as the tenant named it (`Tenant.unscope` refuses an id the
        tenant does not own: every lookup here is scoped, so that would be a bug, a 500)."""
        return self._rows([row], key)[0]

    def _owned(self, rows: Iterable[dict[str, Any]], key: str = "session_id") -> list[dict[str, Any]]:
        return self._rows(r for r in rows if self.tenant.owns(r[key]))

    def _where(self, target: TenantTarget) -> dict[str, Any]:
        """A target as XDB names it: the session is the tenant's, and so must be a row named by id."""
        return dict(timestep_id=target.timestep_id, session_id=self._opt(target.session_id), tick=target.tick,
                    event_id=target.event_id, tick_range=target.tick_range, owner=self.tenant.owner)

    # -- stored responses (the Responses API) ---------------------------------------------------------
    # A response id is global (the server made it); the response is the tenant's when its session is.
    def stored_response(self, response_id: str) -> StoredResponse | None:
        if utf8(response_id) is not response_id:  # a lone surrogate: XDB holds no such id, and DuckDB refuses it
            return None
        found = self.xdb.read(stored_response, response_id)
        return found if found is not None and self.tenant.owns(found.session_id) else None

    def response_conversation(self, response: StoredResponse) -> list[dict[str, Any]]:
        """The conversation up to a response this view found (`stored_response`): not read again."""
        if not self.tenant.owns(response.session_id):
            raise NotFound(f"response {response.id!r} not found")
        return list(self.xdb.read(response_conversation, response.id))

    def response_items(self, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The output items of the tenant's stored responses with these ids, by id (the newest of an id)."""
        found: dict[str, dict[str, Any]] = {}
        item_ids = [i for i in item_ids if utf8(i) is i]  # as in stored_response
        for session_id, item in self.xdb.read(response_items, item_ids):
            if self.tenant.owns(session_id):
                found.setdefault(item["id"], item)
        return found

    def save_response(self, response_id: str, session_id: str, previous_id: str | None, kept: bool,
                      conversation: list[dict[str, Any]], response: dict[str, Any],
                      state_sha: str | None = None) -> None:
        """`session_id` as stored (the turn's, scoped already)."""
        if not self.tenant.owns(session_id):
            raise ValueError(f"tenant {self.tenant.name!r} does not own {session_id!r}")
        self.xdb.write(save_response, response_id, session_id, previous_id, kept, conversation, response, state_sha)

    def delete_response(self, response_id: str) -> bool:
        return self.stored_response(response_id) is not None and bool(self.xdb.write(delete_response, response_id))

    # -- recall, tags, comments, windows --------------------------------------------------------------
    def recall_page(self, filters: RecallFilters) -> dict[str, Any]:
        scoped = filters.model_copy(update={"session_id": self._opt(filters.session_id)})
        page = self.xdb.recall_page(scoped, owner=self.tenant.owner)
        return {**page, "data": self._rows(page["data"])}

    def lake_recall(self, filters: RecallFilters) -> list[dict[str, Any]]:
        scoped = filters.model_copy(update={"session_id": self._opt(filters.session_id)})
        return self._rows(self.xdb.lake_recall(scoped, owner=self.tenant.owner))

    def timestep(self, timestep_id: int) -> dict[str, Any]:
        return self._row(self.xdb.timestep(timestep_id, owner=self.tenant.owner))

    def tag(self, tag: str | int, target: TenantTarget, **fields: Any) -> dict[str, Any]:
        return self._row(self.xdb.tag(tag, **self._where(target), **fields))

    def comment(self, content: str, target: TenantTarget) -> dict[str, Any]:
        return self._row(self.xdb.comment(content, **self._where(target)))

    def comments(self, session_id: str | None) -> list[dict[str, Any]]:
        return self._owned(self.xdb.read(list_comments, self._opt(session_id)))

    def surprising(self, session_id: str, limit: int) -> list[dict[str, Any]]:
        return self._rows(self.xdb.surprising(self.stored_id(session_id), limit))

    def related_concepts(self, concept: str, limit: int, session_id: str | None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.xdb.related_concepts(concept, limit, self._opt(session_id),
                                                               owner=self.tenant.owner)
        return rows

    def top_tokens(self, concept: str, limit: int) -> list[dict[str, Any]]:
        return self._rows(self.xdb.top_tokens(concept, self.tenant.owner, limit))

    def windows(self, session_id: str | None) -> list[dict[str, Any]]:
        """The tenant's pinned (WARM) and SUBMITTED windows."""
        return self._owned(self.xdb.read(list_windows, self._opt(session_id)))

    def pin(self, session_id: str, tick_from: int, tick_to: int, reason: str | None) -> dict[str, Any]:
        return self._row(self.xdb.pin(self.stored_id(session_id), tick_from, tick_to, reason))

    def unpin(self, window_id: int) -> dict[str, Any]:
        if not any(w["id"] == window_id and self.tenant.owns(w["session_id"]) for w in self.xdb.read(list_windows)):
            raise NotFound(f"window {window_id} not found")
        return self._row(self.xdb.write(unpin, window_id))

    def cold_records(self, session_id: str | None, limit: int) -> list[dict[str, Any]]:
        if self.tenant.owner and session_id is None:
            raise InvalidRequest("session_id is required (records are listed per session)", param="session_id")
        rows = self.xdb.read(cold_records, self._opt(session_id), limit)
        return self._rows(rows) if self.tenant.owner else list(rows)

    def compact(self, session_id: str | None, summarize: Callable[[str], str] | None,
                **fields: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.xdb.compact(session_id=self._opt(session_id), summarize=summarize, **fields)
        if result.get("compaction") is not None:
            result["compaction"] = self._row(result["compaction"])
        return result

    # -- documents ----------------------------------------------------------------------------------
    def documents(self, doc_type: DocumentType | None, q: str | None) -> list[dict[str, Any]]:
        return self._rows(self.xdb.read(list_documents, doc_type, q, owner=self.tenant.owner), "id")

    def find_document(self, path: str) -> dict[str, Any]:
        """The tenant's latest document at `path`; NotFound if it has none."""
        return self._row(self.xdb.read(find_document, path=path, owner=self.tenant.owner), "id")

    def document(self, doc_id: str, version: int | None = None) -> dict[str, Any]:
        return self._row(self.xdb.read(get_document, self.stored_id(doc_id), version=version), "id")

    def document_versions(self, doc_id: str) -> list[dict[str, Any]]:
        return self._rows(self.xdb.read(document_versions, self.stored_id(doc_id)), "id")

    def add_document(self, **fields: Any) -> dict[str, Any]:
        return self._row(self.xdb.add_document(**fields, owner=self.tenant.owner), "id")

    def update_document(self, doc_id: str, **fields: Any) -> dict[str, Any]:
        return self._row(self.xdb.update_document(self.stored_id(doc_id), **fields), "id")

    # -- the discovery agent's runs --------------------------------------------------------------------
    def log_interaction(self, run_id: str, **fields: Any) -> int:
        return int(self.xdb.write(log_interaction, self.stored_id(run_id), **fields))

    def interactions(self, run_id: str, **filters: Any) -> list[dict[str, Any]]:
        return self._rows(self.xdb.read(list_interactions, self.stored_id(run_id), **filters), "run_id")

    def save_meta_knowledge(self, run_id: str, **fields: Any) -> int:
        return int(self.xdb.write(save_meta_knowledge, self.stored_id(run_id), **fields))

    def meta_knowledge(self, run_id: str, latest: bool) -> list[dict[str, Any]]:
        return self._rows(self.xdb.read(meta_knowledge, self.stored_id(run_id), latest=latest), "run_id")

    def purge_run(self, run_id: str) -> dict[str, int]:
        deleted: dict[str, int] = self.xdb.write(purge_run, self.stored_id(run_id))
        return deleted

    def runs(self, limit: int) -> list[dict[str, Any]]:
        return self._rows(self.xdb.read(list_runs, self.tenant.owner, limit), "run_id")

    def save_run_report(self, run_id: str, png: bytes) -> dict[str, Any]:
        doc: dict[str, Any] = self.xdb.save_run_report(self.stored_id(run_id), png, self.tenant.owner)
        return doc

    def run_report(self, run_id: str) -> bytes | None:
        png: bytes | None = self.xdb.read(run_report, self.stored_id(run_id), self.tenant.owner)
        return png

    # -- sessions --------------------------------------------------------------------------------------
    def sessions(self, limit: int, after: str | None) -> list[dict[str, Any]]:
        return self._rows(self.xdb.read(list_sessions, self.tenant.owner, limit, self._opt(after)))

    def sessions_overview(self, limit: int, q: str | None) -> list[dict[str, Any]]:
        return self._rows(self.xdb.read(sessions_overview, self.tenant.owner, limit, q))

    def session_turns(self, session_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.xdb.read(session_turns, self.stored_id(session_id))
        return {**found, "session_id": session_id}

    def session_context(self, session_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.xdb.read(session_context, self.stored_id(session_id))
        return {**found, "session_id": session_id}

    def session_versions(self, session_id: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.xdb.read(state_versions, self.stored_id(session_id))
        return rows

    def rollback_session(self, session_id: str, version: int) -> dict[str, Any]:
        result: dict[str, Any] = self.xdb.rollback_session(self.stored_id(session_id), version)
        return {**result, "session_id": session_id}

    def delete_session(self, session_id: str) -> dict[str, int]:
        deleted: dict[str, int] = self.xdb.delete_session(self.stored_id(session_id))
        return deleted

    # -- exports ---------------------------------------------------------------------------------------
    def exports(self) -> list[dict[str, Any]]:
        """The tenant's exports, newest first, each manifest's session filter as the tenant named it."""
        return [self._manifest(m) for m in self.xdb.exports(self.tenant.owner)]

    def export_manifest(self, export_id: str) -> dict[str, Any]:
        for found in self.exports():
            if found["id"] == export_id:
                return found
        raise NotFound(f"export {export_id!r} not found")

    def export(self, fmt: Literal["parquet", "jsonl"], session_id: str | None, since: str | None) -> dict[str, Any]:
        made = self.xdb.export(None, fmt, session_id=self._opt(session_id), since=since, owner=self.tenant.owner)
        return self.export_manifest(made["id"])

    def _manifest(self, manifest: dict[str, Any]) -> dict[str, Any]:
        filters = dict(manifest["filters"])
        if filters.get("session_id") is not None:
            filters["session_id"] = self.shown_id(filters["session_id"])
        return {**{k: v for k, v in manifest.items() if k != "prefix"}, "filters": filters}

    def delete_export(self, export_id: str) -> bool:
        return bool(self.xdb.delete_export(export_id, self.tenant.owner))


class TenantViews:
    """FastAPI dependency over one XDB: the calling tenant's view of it (`view: TenantXDB =
    Depends(views)`). Async, so the tenant is read on the request's own task."""

    def __init__(self, xdb: XDBClient) -> None:
        self.xdb = xdb

    async def __call__(self, tenant: Caller) -> TenantXDB:
        return TenantXDB(self.xdb, tenant)
