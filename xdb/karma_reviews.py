"""The review step's rows: outcomes proposed for Karma, and the verdicts and retractions on them.

A proposal names its text, where it came from (a session's tick range, or a reply's or event's id) and who
proposed it; it is `pending` until a reviewer accepts or rejects it, and an accepted one is `retracted` when
taken back. Every insert is chained in the audit log (by hash: the text stays here), so who verified what,
and when, is evidence. Ids are as stored: `tenant` is the tenant's name, `stored_session`
a session id with it (server/tenancy/tenant_xdb.py scopes them).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import duckdb

from core.errors import Conflict, NotFound
from xdb.audit.log import AuditEvent
from xdb.interface import reads, writes
from xdb.rows import encoded
from xdb.sql import digest, transaction

Scope = Literal["session", "tenant"]
Verdict = Literal["accepted", "rejected"]
ReviewerKind = Literal["person", "model"]
STATUSES = ("pending", "accepted", "rejected", "retracted")

PROPOSAL_COLUMNS = ("id", "tenant", "scope", "session_id", "text", "source_session_id", "tick_start", "tick_end",
                    "event_id", "proposed_by", "status", "created_at", "updated_at")
REVIEW_COLUMNS = ("id", "proposal_id", "action", "reviewer", "reviewer_kind", "rationale", "created_at")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def _iso(value: Any) -> Any:
    return value.isoformat() + "Z" if isinstance(value, dt.datetime) else value


@writes
def add_proposal(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, tenant: str, scope: Scope,
                 stored_session: str | None, text: str, source_session: str | None,
                 tick_range: tuple[int, int] | None, event_id: str | None, proposed_by: str) -> dict[str, Any]:
    for value, name in ((text, "text"), (proposed_by, "proposed_by"), (event_id, "event_id")):
        encoded(value, name)
    now = _now()
    start, end = tick_range if tick_range is not None else (None, None)
    with transaction(cur):
        row = cur.execute(
            "INSERT INTO karma_proposals (tenant, scope, session_id, text, source_session_id, tick_start, "
            "tick_end, event_id, proposed_by, status, created_at, updated_at) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?) RETURNING {', '.join(PROPOSAL_COLUMNS)}",
            [tenant, scope, stored_session, text, source_session, start, end, event_id, proposed_by, now, now],
        ).fetchone()
        assert row is not None
        if audit is not None:
            audit("karma_proposed", {"proposal_id": row[0], "session_id": stored_session, "scope": scope,
                                     "source_session_id": source_session, "tick_range": list(tick_range or ()),
                                     "event_id": event_id, "proposed_by": proposed_by, "sha256": digest(text)})
    return _proposal(row, [])


@writes
def review_proposal(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, proposal_id: int,
                    action: Literal["accepted", "rejected", "retracted"], reviewer: str, reviewer_kind: ReviewerKind,
                    rationale: str) -> dict[str, Any]:
    """A verdict on a pending proposal, or the retraction of an accepted one: Conflict otherwise."""
    encoded(rationale, "rationale")
    encoded(reviewer, "reviewer")
    wanted = "accepted" if action == "retracted" else "pending"
    now = _now()
    with transaction(cur):
        found = cur.execute("SELECT status, session_id FROM karma_proposals WHERE id = ?", [proposal_id]).fetchone()
        if found is None:
            raise NotFound(f"karma proposal {proposal_id} not found")
        if found[0] != wanted:
            verb = "retracted" if action == "retracted" else "reviewed"
            article = "an" if wanted == "accepted" else "a"
            raise Conflict(f"karma proposal {proposal_id} is {found[0]}: only {article} {wanted} one is {verb}")
        cur.execute("UPDATE karma_proposals SET status = ?, updated_at = ? WHERE id = ?", [action, now, proposal_id])
        review = cur.execute(
            "INSERT INTO karma_reviews (proposal_id, session_id, action, reviewer, reviewer_kind, rationale, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            [proposal_id, found[1], action, reviewer, reviewer_kind, rationale, now]).fetchone()
        assert review is not None
        if audit is not None:
            audit("karma_reviewed", {"proposal_id": proposal_id, "session_id": found[1], "review_id": review[0],
                                     "verdict": action, "reviewer": reviewer, "reviewer_kind": reviewer_kind,
                                     "rationale_sha256": digest(rationale)})
    proposal = karma_proposal(cur, proposal_id)
    assert proposal is not None
    return proposal


@reads
def karma_proposal(cur: duckdb.DuckDBPyConnection, proposal_id: int) -> dict[str, Any] | None:
    row = cur.execute(f"SELECT {', '.join(PROPOSAL_COLUMNS)} FROM karma_proposals WHERE id = ?",
                      [proposal_id]).fetchone()
    return None if row is None else _proposal(row, _reviews(cur, [proposal_id]).get(proposal_id, []))


@reads
def karma_proposals(cur: duckdb.DuckDBPyConnection, tenant: str | None, status: str | None = None,
                    limit: int = 100) -> list[dict[str, Any]]:
    """Proposals, oldest first, of one tenant (None: every tenant's, the auditor's view)."""
    found = cur.execute(
        f"SELECT {', '.join(PROPOSAL_COLUMNS)} FROM karma_proposals WHERE (? IS NULL OR tenant = ?) "
        "AND (? IS NULL OR status = ?) ORDER BY id LIMIT ?", [tenant, tenant, status, status, limit]).fetchall()
    reviews = _reviews(cur, [row[0] for row in found])
    return [_proposal(row, reviews.get(row[0], [])) for row in found]


@reads
def promoted_karma(cur: duckdb.DuckDBPyConnection, tenant: str, stored_session: str | None) -> list[dict[str, Any]]:
    """The accepted proposals a session's prompt carries: the tenant's, then the session's, each in order of
    acceptance (a stable order: a later acceptance only appends)."""
    found = cur.execute(
        f"SELECT {', '.join('p.' + c for c in PROPOSAL_COLUMNS)} FROM karma_proposals p JOIN karma_reviews r "
        "ON r.proposal_id = p.id AND r.action = 'accepted' WHERE p.tenant = ? AND p.status = 'accepted' "
        "AND (p.scope = 'tenant' OR (p.scope = 'session' AND p.session_id = ?)) "
        "ORDER BY p.scope = 'session', r.id", [tenant, stored_session]).fetchall()
    return [_proposal(row, []) for row in found]


def _reviews(cur: duckdb.DuckDBPyConnection, ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    if not ids:
        return {}
    found = cur.execute(f"SELECT {', '.join(REVIEW_COLUMNS)} FROM karma_reviews WHERE proposal_id IN "
                        "(SELECT unnest(?)) ORDER BY id", [ids]).fetchall()
    out: dict[int, list[dict[str, Any]]] = {}
    for row in found:
        review = {k: _iso(v) for k, v in zip(REVIEW_COLUMNS, row, strict=True)}
        out.setdefault(int(row[1]), []).append(review)
    return out


def _proposal(row: tuple[Any, ...], reviews: list[dict[str, Any]]) -> dict[str, Any]:
    rec = {k: _iso(v) for k, v in zip(PROPOSAL_COLUMNS, row, strict=True)}
    return {"id": rec["id"], "tenant": rec["tenant"], "scope": rec["scope"], "session_id": rec["session_id"],
            "text": rec["text"],
            "source": {"session_id": rec["source_session_id"],
                       "tick_range": None if rec["tick_start"] is None else [rec["tick_start"], rec["tick_end"]],
                       "event_id": rec["event_id"]},
            "proposed_by": rec["proposed_by"], "status": rec["status"], "created_at": rec["created_at"],
            "updated_at": rec["updated_at"], "reviews": reviews}
