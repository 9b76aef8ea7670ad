"""XDB as one tenant sees it: the one place where the ids a tenant names are scoped and unscoped.

A tenant's ids (sessions, runs, documents) are stored as its prefix followed by the id it named, and
handed back without it; listings are filtered by its owner string (server/tenancy/tenants.py, xdb/owner.py).
Routes take a `TenantXDB` (from the `TenantViews` dependency) instead of the XDB and the tenant, so no
route scopes an id, unscopes a row or passes an owner by hand: a route that forgot one would read
past its tenant without a sound. The view has no method that reaches past its tenant; what spans
every tenant (the operator's compaction of released rows, evidence on the shared buds, the audit's
head, concepts and buds, which are the server's shared vocabulary) stays on the XDB itself.

A call that only scopes is declared, not written (`ScopedCall`, server/tenancy/scoped_call.py): its
target and how its rows come back; the ids it takes are scoped by their parameters' names and the
owner is filled in wherever the target takes one. Every read and write of XDB's that takes a tenant's id or
owner (a parameter named in TENANT_PARAMETERS) is a call of the view, declared or WRITTEN_OUT, or is
one of SERVER_ONLY's; tests/test_tenant_view.py holds every such function of XDB to these lists, so a
new one cannot be left out unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from core.errors import InvalidRequest, NotFound
from server.tenancy.request_context import Caller
from server.tenancy.scoped_call import SCOPES, ScopedCall, named_as_asked, owned, page, row, rows
from server.tenancy.tenants import Tenant
from xdb import XDBClient, karma_reviews, session_state
from xdb import documents as xdb_documents
from xdb import identities as xdb_identities
from xdb import run_history as xdb_history
from xdb import runs as xdb_runs
from xdb.recall import browse
from xdb.responses import (
    StoredResponse,
    delete_response,
    response_conversation,
    response_items,
    save_response,
    stored_response,
)
from xdb.rows import utf8
from xdb.storage.compression import cold_records
from xdb.storage.fidelity import list_windows, unpin
from xdb.tags import list_comments

# A parameter of XDB's by one of these names is the tenant's: one of its ids, scoped in by name
# (SCOPES), its owner string, or an id the server made whose row is the tenant's by its session or owner.
TENANT_PARAMETERS = frozenset(SCOPES) | {"owner", "response_id", "item_ids", "export_id"}
# The view's calls that do more than scope, by target: a response found only when its session is the
# tenant's, a tag's or comment's target, a listing refused without its session, an export's manifest.
WRITTEN_OUT = frozenset({
    "xdb.responses.stored_response", "xdb.responses.response_conversation", "xdb.responses.response_items",
    "xdb.responses.save_response", "xdb.responses.delete_response", "xdb.storage.compression.cold_records",
    "XDB.tag", "XDB.comment", "XDB.compact", "XDB.export", "XDB.exports",
})
# What takes a tenant's id but is no route's to call: the server's own calls, on ids it scoped as the
# request came in, and the auditor's, which spans every tenant.
SERVER_ONLY = {
    "XDB.save_session_state": "the orchestrator's session store, keyed by the stored session id",
    "XDB.load_session_state": "the orchestrator's session store, keyed by the stored session id",
    "XDB.load_session_state_verified": "the orchestrator's session store, keyed by the stored session id",
    "XDB.committed_tick": "the tick book's, by the stored session id",
    "XDB.recall": "in-process callers' (the agent, benchmarks) on their own file; routes recall a page at a time",
    "XDB.audit_records": "the auditor's role (/v1/audit/records): the log of every tenant, no tenant's rows",
    "xdb.responses.response_input": "read by no route: the Responses API reads whole conversations",
}


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

    # -- the calls that are only scoping: each declared once, its ids scoped by name ---------------------
    recall_page = ScopedCall("recall_page", out=page)
    lake_recall = ScopedCall("lake_recall", out=rows())
    timestep = ScopedCall("timestep", out=row())
    comments = ScopedCall(list_comments, out=owned())
    surprising = ScopedCall("surprising", out=rows())
    related_concepts = ScopedCall("related_concepts")
    top_tokens = ScopedCall("top_tokens", out=rows())
    windows = ScopedCall(list_windows, out=owned())  # pinned (WARM) and SUBMITTED
    pin = ScopedCall("pin", out=row())

    documents = ScopedCall(xdb_documents.list_documents, out=rows("id"))
    find_document = ScopedCall(xdb_documents.find_document, out=row("id"))  # the latest at `path`, else NotFound
    document = ScopedCall(xdb_documents.get_document, out=row("id"))
    document_versions = ScopedCall(xdb_documents.document_versions, out=rows("id"))
    add_document = ScopedCall("add_document", out=row("id"))
    update_document = ScopedCall("update_document", out=row("id"))
    save_condensation = ScopedCall(xdb_identities.save_condensation, out=lambda tenant, found, named: {
        key: None if doc is None else tenant.unscope_rows([doc], "id")[0] for key, doc in found.items()})

    log_interaction = ScopedCall(xdb_runs.log_interaction)
    interactions = ScopedCall(xdb_runs.list_interactions, out=rows("run_id"))
    save_meta_knowledge = ScopedCall(xdb_runs.save_meta_knowledge)
    meta_knowledge = ScopedCall(xdb_runs.meta_knowledge, out=rows("run_id"))
    purge_run = ScopedCall(xdb_runs.purge_run)
    runs = ScopedCall(xdb_runs.list_runs, out=rows("run_id"))
    save_run_report = ScopedCall("save_run_report")
    run_report = ScopedCall(xdb_runs.run_report)
    record_progress = ScopedCall(xdb_history.record_progress)
    record_attempt = ScopedCall(xdb_history.record_attempt)
    record_theorem_version = ScopedCall(xdb_history.record_theorem_version)
    theorem_lineage = ScopedCall(xdb_history.theorem_lineage, out=rows("run_id"))
    run_outcomes = ScopedCall(xdb_history.run_outcomes, out=rows("run_id"))
    failed_laws = ScopedCall(xdb_history.failed_laws)  # laws and counts: no run id in them
    retracted_theorems = ScopedCall(xdb_history.retracted_theorems, out=rows("run_id"))
    run_history = ScopedCall(xdb_history.run_history, out=lambda tenant, found, named: {
        **found, "runs": tenant.unscope_rows(found["runs"], "run_id"),
        "retracted_theorems": tenant.unscope_rows(found["retracted_theorems"], "run_id")})

    sessions = ScopedCall(session_state.list_sessions, out=rows())
    sessions_overview = ScopedCall(browse.sessions_overview, out=rows())
    session_turns = ScopedCall(browse.session_turns, out=named_as_asked())
    session_context = ScopedCall(browse.session_context, out=named_as_asked())
    session_versions = ScopedCall(session_state.state_versions)
    rollback_session = ScopedCall("rollback_session", out=named_as_asked())
    delete_session = ScopedCall("delete_session")
    delete_export = ScopedCall("delete_export")

    # -- calls with more to them than scoping --------------------------------------------------------
    def tag(self, tag: str | int, target: TenantTarget, **fields: Any) -> dict[str, Any]:
        return self._row(self.xdb.tag(tag, **self._where(target), **fields))

    def comment(self, content: str, target: TenantTarget) -> dict[str, Any]:
        return self._row(self.xdb.comment(content, **self._where(target)))

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

    # -- the review step's proposals for Karma (xdb/karma_reviews.py) -----------------------------------
    # A proposal id is global (the server made it); the proposal is the tenant's when its `tenant` is.
    def propose_karma(self, scope: karma_reviews.Scope, session_id: str | None, text: str,
                      source_session: str | None, tick_range: tuple[int, int] | None, event_id: str | None,
                      ) -> dict[str, Any]:
        made = self.xdb.write(karma_reviews.add_proposal, self.tenant.name, scope, self._opt(session_id), text,
                              self._opt(source_session), tick_range, event_id, self.tenant.name)
        return self.shown_proposal(made)

    def karma_proposal(self, proposal_id: int) -> dict[str, Any]:
        """The tenant's proposal, as stored; NotFound for another tenant's."""
        found = self.xdb.read(karma_reviews.karma_proposal, proposal_id)
        if found is None or found["tenant"] != self.tenant.name:
            raise NotFound(f"karma proposal {proposal_id} not found")
        return found

    def karma_proposals(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        return [self.shown_proposal(p) for p in self.xdb.read(karma_reviews.karma_proposals, self.tenant.name,
                                                              status, limit)]

    def promoted_karma(self, session_id: str | None) -> list[dict[str, Any]]:
        found = self.xdb.read(karma_reviews.promoted_karma, self.tenant.name, self._opt(session_id))
        return [self.shown_proposal(p) for p in found]

    def shown_proposal(self, proposal: dict[str, Any]) -> dict[str, Any]:
        """A proposal of the tenant's with its session ids as the tenant named them."""
        shown = dict(proposal)
        if shown["session_id"] is not None:
            shown["session_id"] = self.shown_id(shown["session_id"])
        if shown["source"]["session_id"] is not None:
            shown["source"] = {**shown["source"], "session_id": self.shown_id(shown["source"]["session_id"])}
        return shown

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


class TenantViews:
    """FastAPI dependency over one XDB: the calling tenant's view of it (`view: TenantXDB =
    Depends(views)`). Async, so the tenant is read on the request's own task."""

    def __init__(self, xdb: XDBClient) -> None:
        self.xdb = xdb

    async def __call__(self, tenant: Caller) -> TenantXDB:
        return TenantXDB(self.xdb, tenant)
