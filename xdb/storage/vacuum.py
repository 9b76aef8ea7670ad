"""Vacuuming the experience file: rewriting it whole, so that deleted rows leave the disk's files.

DuckDB reuses the blocks a deletion frees but never clears them, and a deleted row stays in its row
group's blocks until the group is rewritten: a deleted session's text can be read from the file long
after the deletion. A vacuum first seals the hot timesteps and rewrites the segments holding erased
rows (xdb/storage/segments.py), then copies the live rows into a new file (COPY FROM DATABASE: every table,
view, sequence and index) and renames it over the old one, as SQLite's VACUUM does; the old file's
blocks then belong to no file. It needs the file to itself (a stopped server, or the XDB service between
its calls, xdb/service/service.py) and room for a second copy, and costs time in proportion to the file's size:
the small tables and the timesteps not yet sealed, not the history in the segments. The audit log needs
none: a session's content there is sealed under a key its deletion destroys (xdb/audit/seal.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from xdb.audit.log import copy_database
from xdb.private import fsync_path, private_files
from xdb.schema import EXPERIENCE_FILE, open_experience
from xdb.storage import segments
from xdb.storage.fidelity import hot_cutoff
from xdb.storage.retention import VACUUMED_AT


def vacuum_experience(data_dir: Path) -> dict[str, Any]:
    """Rewrite DATA_DIR/experience.duckdb whole; its bytes before and after. DatabaseInUse while a
    server holds it; ValueError for a file that is not XDB's."""
    path = Path(data_dir) / EXPERIENCE_FILE
    if not path.is_file():
        raise ValueError(f"{data_dir} holds no {EXPERIENCE_FILE}")
    before = path.stat().st_size
    fresh = path.with_name(path.name + ".vacuum")
    fresh.unlink(missing_ok=True)  # a vacuum cut short earlier
    conn = open_experience(path)
    replaced: list[Path] = []
    try:
        segments.open_segments(conn)
        segments.seal(conn)
        replaced = [old for due in segments.due(conn, erase_only=True) if (old := segments.rewrite(conn, due))]
        conn.execute("INSERT OR REPLACE INTO xdb_meta VALUES (?, ?)", [VACUUMED_AT, hot_cutoff(0.0).isoformat()])
        conn.execute("CHECKPOINT")  # the write-ahead log's rows are in the file, and go with it
        copy_database(conn, fresh)
    except BaseException:
        fresh.unlink(missing_ok=True)
        raise
    finally:
        conn.close()
    private_files(fresh)
    fsync_path(fresh)
    os.replace(fresh, path)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)
    fsync_path(path.parent)
    for old in replaced:  # nothing reads them: the file is this call's alone
        old.unlink(missing_ok=True)
    return {"path": str(path), "bytes_before": before, "bytes_after": path.stat().st_size}
