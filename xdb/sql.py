"""Typed reads of DuckDB results: a row is a plain tuple, and some queries always yield exactly one
(an aggregate, an INSERT ... RETURNING), so their callers need not handle None."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb

Row = tuple[Any, ...]


def string_literal(text: str) -> str:
    """`text` as a SQL string literal (a NUL, which ends a quoted string in DuckDB's parser, as chr(0)).
    A literal where a statement runs on every batch: one with parameters is prepared anew each call."""
    quoted = ["'" + part.replace("'", "''") + "'" for part in text.split("\x00")]
    return " || chr(0) || ".join(quoted)


def one(result: duckdb.DuckDBPyConnection) -> Row:
    """The first row of a query that always yields one."""
    row = result.fetchone()
    if row is None:  # only a broken query gets here: an aggregate or RETURNING always yields a row
        raise LookupError("the query yielded no row")
    return row


def one_int(result: duckdb.DuckDBPyConnection) -> int:
    """The first column of `one(result)`, which must be a non-NULL integer (an id, a count)."""
    return int(one(result)[0])


@contextmanager
def cursor(conn: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of its own on `conn` (any thread may read through one), closed after use."""
    cur = conn.cursor()
    try:
        yield cur
    finally:
        cur.close()


@contextmanager
def transaction(cur: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """BEGIN … COMMIT on a cursor, rolled back if anything in it (the COMMIT included) fails."""
    cur.execute("BEGIN")
    try:
        yield
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise


def digest(*texts: str | None) -> str:
    """SHA-256 over texts, each length-prefixed (None as -1): what an audit event says of content it does not
    carry."""
    sha = hashlib.sha256()
    for text in texts:
        raw = b"" if text is None else text.encode()
        sha.update((-1 if text is None else len(raw)).to_bytes(8, "little", signed=True) + raw)
    return sha.hexdigest()
