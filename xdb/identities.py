"""Condensed Identities: the check of a condensation stored as a document, and an accepted one as a versioned
document of doc_type `identity` a client reads and sends as its `context.identity`.

One tenant's condensations of one Identity share a name: its check reports are the versions of the
document at `ahc/identity-checks/<name>`, its accepted personas the versions of `ahc/identity/<name>`.
Both are written in one transaction with an `identity_condensed` event chained in the audit log (the
hashes of both contents), so what a client was handed as its persona can be told from what the model said.
"""

from __future__ import annotations

from typing import Any

import duckdb

from core.errors import NotFound
from xdb.audit.log import AuditEvent
from xdb.documents import DocumentType, add_document, find_document, update_document
from xdb.interface import writes
from xdb.sql import transaction

IDENTITY_TAG = "condensed-identity"
CHECK_TAG = "identity-check"


def identity_path(name: str) -> str:
    return f"ahc/identity/{name}"


def check_path(name: str) -> str:
    return f"ahc/identity-checks/{name}"


@writes
def save_condensation(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, name: str, report: str,
                      condensed: str | None, *, summary: str, max_bytes: int, owner: str) -> dict[str, Any]:
    """Store a condensation's check (`report`, JSON) and, when accepted, the condensed persona (`condensed`):
    each a new version of the tenant's document at its path. Returns both documents without content
    (`identity` None when refused)."""
    with transaction(cur):
        check = _version(cur, check_path(name), f"{name} (identity check)", report, DocumentType.REFERENCE,
                         [CHECK_TAG], summary, max_bytes, owner)
        identity = None
        if condensed is not None:
            identity = _version(cur, identity_path(name), name, condensed, DocumentType.IDENTITY, [IDENTITY_TAG],
                                f"{summary}; check {check['id']}@{check['version']}", max_bytes, owner)
        if audit is not None:
            audit("identity_condensed", {
                "name": name, "accepted": identity is not None,
                "check": f"{check['id']}@{check['version']}", "check_sha256": check["content_hash"],
                "identity": None if identity is None else f"{identity['id']}@{identity['version']}",
                "identity_sha256": None if identity is None else identity["content_hash"]})
    return {"check": _short(check), "identity": None if identity is None else _short(identity)}


def _version(cur: duckdb.DuckDBPyConnection, path: str, name: str, content: str, kind: DocumentType,
             tags: list[str], summary: str, max_bytes: int, owner: str) -> dict[str, Any]:
    try:
        found = find_document(cur, path=path, owner=owner, with_content=False)
    except NotFound:
        return add_document(cur, name, content, doc_type=kind.value, path=path, tags=tags, summary=summary,
                            source="identity-condense", max_bytes=max_bytes, owner=owner)
    return update_document(cur, found["id"], content, summary=summary, max_bytes=max_bytes)


def _short(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "content"}

