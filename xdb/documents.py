"""The document repository: reference documents, every update a new version with its SHA-256."""

from __future__ import annotations

import hashlib
import uuid
from enum import Enum
from typing import Any

import duckdb

from core.errors import InvalidRequest, NotFound, PayloadTooLarge
from xdb.interface import reads
from xdb.owner import build_prefix, owned
from xdb.rows import encoded
from xdb.sql import Row


class DocumentType(str, Enum):
    SYSTEM_INSTRUCTION = "system_instruction"
    TOOL_DOCUMENTATION = "tool_documentation"
    TRIBAL_POLICY = "tribal_policy"
    SPECIFICATION = "specification"
    REFERENCE = "reference"
    IDENTITY = "identity"  # a persona a client sends as its `context.identity` (a condensed one, server/identity/)


class DocumentTooLarge(PayloadTooLarge):
    """A document over the size limit (HTTP 413)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="content")


COLUMNS = ("id", "version", "doc_type", "name", "path", "content", "content_hash", "created_at", "updated_at",
           "source", "summary", "tags")


def _doc(row: Row, with_content: bool = True) -> dict[str, Any]:
    rec = dict(zip(COLUMNS, row))
    for key in ("created_at", "updated_at"):
        rec[key] = rec[key].isoformat() + "Z"
    rec["bytes"] = len(rec["content"].encode())
    if not with_content:
        del rec["content"]
    return rec


def _check(content: str, max_bytes: int) -> str:
    if not isinstance(content, str):
        raise InvalidRequest("document content must be a string")
    size = len(encoded(content, "content"))
    if size > max_bytes:
        raise DocumentTooLarge(f"document is {size} bytes, over the {max_bytes}-byte limit")
    return hashlib.sha256(content.encode()).hexdigest()


def add_document(cur: duckdb.DuckDBPyConnection, name: str, content: str, *, doc_type: str = "reference",
                 path: str | None = None, tags: list[str] | None = None, source: str | None = None,
                 summary: str | None = None, max_bytes: int, owner: str) -> dict[str, Any]:
    """A new document of `owner` (a tenant's, xdb/owner.py): its id is the owner's prefix
    (`build_prefix`) followed by a fresh one."""
    if not name or not name.strip():
        raise InvalidRequest("document name must not be empty")
    kind = DocumentType(doc_type).value
    for text, field in [(name, "name"), (path, "path"), (source, "source"), (summary, "summary"),
                        *((tag, "tags") for tag in tags or ())]:
        encoded(text, field)
    digest = _check(content, max_bytes)
    doc_id = f"{build_prefix(owner)}doc-{uuid.uuid4().hex[:12]}"
    cur.execute("INSERT INTO documents VALUES (?, 1, ?, ?, ?, ?, ?, now(), now(), ?, ?, ?)",
                [doc_id, kind, name, path, content, digest, source, summary, list(tags or [])])
    return get_document(cur, doc_id)


def update_document(cur: duckdb.DuckDBPyConnection, doc_id: str, content: str, *, summary: str | None = None,
                    tags: list[str] | None = None, name: str | None = None,
                    max_bytes: int) -> dict[str, Any]:
    """A new version with the new content; metadata not given is carried over."""
    for text, field in [(name, "name"), (summary, "summary"), *((tag, "tags") for tag in tags or ())]:
        encoded(text, field)
    digest = _check(content, max_bytes)
    current = get_document(cur, doc_id)
    cur.execute("INSERT INTO documents VALUES (?, ?, ?, ?, ?, ?, ?, ?::TIMESTAMP, now(), ?, ?, ?)",
                [doc_id, current["version"] + 1, current["doc_type"], name or current["name"], current["path"],
                 content, digest, current["created_at"].rstrip("Z"), current["source"],
                 summary if summary is not None else current["summary"],
                 list(tags) if tags is not None else current["tags"]])
    return get_document(cur, doc_id)


@reads
def get_document(cur: duckdb.DuckDBPyConnection, doc_id: str | None = None, *, path: str | None = None,
                 version: int | None = None) -> dict[str, Any]:
    if (doc_id is None) == (path is None):
        raise InvalidRequest("give exactly one of doc_id or path")
    key, value = ("id", doc_id) if doc_id is not None else ("path", path)
    row = cur.execute(f"SELECT {', '.join(COLUMNS)} FROM documents WHERE {key} = ? AND (? IS NULL OR version = ?) "
                      "ORDER BY version DESC LIMIT 1", [value, version, version]).fetchone()
    if row is None:
        raise NotFound(f"document {value!r}" + (f" version {version}" if version else "") + " not found")
    return _doc(row)


@reads
def find_document(cur: duckdb.DuckDBPyConnection, key: str | None = None, *, path: str | None = None,
                  version: int | None = None, sha256: str | None = None, owner: str,
                  with_content: bool = True) -> dict[str, Any]:
    """One tenant's document version: by id or name (`key`) or by `path`, at `version`, or the version
    whose content has `sha256`, else the latest. A name two documents share is an error naming their ids.
    `owner`: the tenant's (xdb/owner.py); no other tenant's document is ever found."""
    condition, params = owned("id", owner)
    where = [condition]
    prefix = build_prefix(owner)
    if key is not None:
        where.append("(id = ? OR name = ?)")
        params += [prefix + key, key]
    if path is not None:
        where.append("path = ?")
        params.append(path)
    if version is not None:
        where.append("version = ?")
        params.append(version)
    if sha256 is not None:
        where.append("content_hash = ?")
        params.append(sha256)
    rows = cur.execute(f"SELECT {', '.join(COLUMNS)} FROM documents WHERE {' AND '.join(where)} "
                       "ORDER BY version DESC, updated_at DESC", params).fetchall()
    wanted = " ".join(part for part in (
        f"{key!r}" if key is not None else None, f"at path {path!r}" if path is not None else None,
        f"version {version}" if version is not None else None,
        f"with sha256 {sha256}" if sha256 is not None else None) if part)
    if not rows:
        raise NotFound(f"document {wanted} not found")
    by_id = [r for r in rows if r[0] == prefix + (key or "")] if key is not None else []
    ids = {r[0] for r in rows}
    if not by_id and key is not None and len(ids) > 1:
        names = ", ".join(sorted(i.removeprefix(prefix) for i in ids))
        raise InvalidRequest(f"document name {key!r} is shared by {names}: name one by its id")
    return _doc((by_id or rows)[0], with_content)


@reads
def document_versions(cur: duckdb.DuckDBPyConnection, doc_id: str) -> list[dict[str, Any]]:
    rows = cur.execute(f"SELECT {', '.join(COLUMNS)} FROM documents WHERE id = ? ORDER BY version", [doc_id]).fetchall()
    if not rows:
        raise NotFound(f"document {doc_id!r} not found")
    return [_doc(r, with_content=False) for r in rows]


@reads
def list_documents(cur: duckdb.DuckDBPyConnection, doc_type: str | None = None,
                   query: str | None = None, *, owner: str, tag: str | None = None) -> list[dict[str, Any]]:
    """The latest version of each of `owner`'s documents (xdb/owner.py), without content;
    `query` searches name, path and text; `tag`: only those whose latest version carries it."""
    if doc_type is not None:
        doc_type = DocumentType(doc_type).value
    condition, params = owned("id", owner)
    rows = cur.execute(
        f"SELECT {', '.join(COLUMNS)} FROM documents "
        "QUALIFY row_number() OVER (PARTITION BY id ORDER BY version DESC) = 1 "
        f"AND {condition} AND (? IS NULL OR doc_type = ?) "
        "AND (? IS NULL OR name ILIKE '%' || ? || '%' OR path ILIKE '%' || ? || '%' OR content ILIKE '%' || ? || '%') "
        "AND (? IS NULL OR list_contains(tags, ?)) "
        "ORDER BY name, id", params + [doc_type, doc_type] + [query] * 4 + [tag] * 2).fetchall()
    return [_doc(r, with_content=False) for r in rows]
