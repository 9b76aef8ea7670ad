"""Typed reads of DuckDB results: some queries always yield exactly one row (an aggregate, a DELETE's
count), so their callers need not handle None."""

from __future__ import annotations

from typing import Any

import duckdb

Row = tuple[Any, ...]


def one(result: duckdb.DuckDBPyConnection) -> Row:
    """The first row of a query that always yields one."""
    row = result.fetchone()
    if row is None:  # only a broken query gets here: an aggregate always yields a row
        raise LookupError("the query yielded no row")
    return row


def one_int(result: duckdb.DuckDBPyConnection) -> int:
    """The first column of `one(result)`, which must be a non-NULL integer (a count, an id)."""
    return int(one(result)[0])
