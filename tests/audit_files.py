"""Reading a data dir's audit log file directly, as a test that checks its layout does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from xdb.store import AUDIT_FILE


def sql(data: Path, statement: str) -> list[tuple[Any, ...]]:
    """`statement`'s rows from the audit log file under the data dir `data` (opened and closed)."""
    con = duckdb.connect(str(data / AUDIT_FILE))
    try:
        return con.execute(statement).fetchall()
    finally:
        con.close()
