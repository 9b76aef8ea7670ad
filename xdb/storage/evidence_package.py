"""A submission's evidence package: DATA_DIR/exports/<submission id>/, written in the transaction that
submits the evidence, so the evidence and its package exist together or neither does.

    evidence.json       the manifest: bud, submission id, windows, row counts, the audit chain head once
                        the submission's own audit event is chained, created time, the files
    rows.parquet        the windows' timesteps (every column, activations included)
    applications.parquet  the bud's tag applications (what it tags, and how)
    training.json       the bud's examples against replies it does not tag (xdb/bud_export.py), the file
                        `ahc lens train --examples` reads

The package is built in a hidden temporary directory beside it and renamed into place before the
transaction commits; anything failing (the disk, the training file's checks, the COMMIT) rolls the
submission back and removes what was written, so a failed submission leaves neither locked windows nor
files, and may simply be made again. Resolving the submission keeps the package. The manifest is not
named manifest.json: the exports' listing and expiry (`XDB.exports`) take only those, and evidence
outlives an export's TTL.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from core.errors import Conflict, InvalidRequest
from xdb.audit.log import AuditEvent
from xdb.bud_export import bud_training_file
from xdb.private import fsync_path, private_dir, private_tree
from xdb.sql import string_literal, transaction
from xdb.storage.fidelity import lock_evidence, ready_bud

EXPORTS_DIR = "exports"
MANIFEST = "evidence.json"
TRAINING_FILE = "training.json"
PACKAGE_FILES = ("rows.parquet", "applications.parquet", TRAINING_FILE)
# A submission id names a directory: letters, digits, '.', '_' and '-', not starting with a dot.
SUBMISSION_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")

WINDOW_ROWS = """SELECT t.* FROM timesteps t JOIN time_windows w ON w.session_id = t.session_id
    AND t.tick BETWEEN w.start_tick AND w.end_tick WHERE list_contains(w.submission_ids, {sid})
    QUALIFY row_number() OVER (PARTITION BY t.id) = 1 ORDER BY t.id"""


def package_dir(data_dir: Path, submission_id: str) -> Path:
    if not SUBMISSION_ID.fullmatch(submission_id):
        raise InvalidRequest(f"submission_id {submission_id!r}: letters, digits, '.', '_' and '-' only, not "
                             "starting with '.' (it names the evidence package's directory)", param="submission_id")
    return data_dir / EXPORTS_DIR / submission_id


def submit_with_package(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None,
                        audit_head: Callable[[], tuple[int, str]], data_dir: Path, bud: str | int,
                        submission_id: str, min_examples: int) -> dict[str, Any]:
    """Lock the bud's evidence (fidelity.lock_evidence) and write its package, in one transaction.
    Returns {"data": windows, "package": path, "manifest": manifest}."""
    final = package_dir(data_dir, submission_id)
    if final.exists():
        raise Conflict(f"an evidence package for submission {submission_id!r} exists already at {final}",
                       param="submission_id")
    private_dir(final.parent)
    tmp = final.parent / f".{submission_id}.tmp-{os.urandom(4).hex()}"
    placed = False
    try:
        with transaction(cur):
            tag = ready_bud(cur, bud)
            # Before the lock, while the bud is READY: a bud that cannot be learnt is not submitted.
            training = bud_training_file(cur, tag["id"], min_examples)
            windows = lock_evidence(cur, audit, tag["id"], submission_id)
            manifest = _write(cur, tmp, tag, submission_id, windows, training, audit_head())
            os.rename(tmp, final)
            placed = True
            fsync_path(final.parent)
    except BaseException:
        shutil.rmtree(final if placed else tmp, ignore_errors=True)
        raise
    return {"data": windows, "package": str(final), "manifest": manifest}


def _write(cur: duckdb.DuckDBPyConnection, out: Path, tag: dict[str, Any], submission_id: str,
           windows: list[dict[str, Any]], training: dict[str, Any], head: tuple[int, str]) -> dict[str, Any]:
    out.mkdir()
    sid = string_literal(submission_id)
    cur.execute(f"COPY ({WINDOW_ROWS.format(sid=sid)}) TO {string_literal(str(out / 'rows.parquet'))} "
                "(FORMAT parquet)")
    cur.execute(f"COPY (SELECT * FROM tag_applications WHERE tag_id = {int(tag['id'])} ORDER BY id) "
                f"TO {string_literal(str(out / 'applications.parquet'))} (FORMAT parquet)")
    (out / TRAINING_FILE).write_text(json.dumps(training, ensure_ascii=False, indent=1))
    rows = cur.execute(f"SELECT count(*) FROM ({WINDOW_ROWS.format(sid=sid)})").fetchone()
    applications = cur.execute("SELECT count(*) FROM tag_applications WHERE tag_id = ?", [tag["id"]]).fetchone()
    seq, digest = head
    manifest = {
        "submission_id": submission_id,
        "bud": {"id": tag["id"], "name": tag["name"]},
        "windows": [{k: w[k] for k in ("id", "session_id", "start_tick", "end_tick", "token_count")}
                    for w in windows],
        "rows": {"timesteps": rows[0] if rows else 0, "tag_applications": applications[0] if applications else 0,
                 "training_examples": {c["id"]: len(c["examples"]) + len(c["heldout"])
                                       for c in training["concepts"]}},
        "audit_head": {"seq": seq, "hash": digest},
        "created_at": dt.datetime.now(dt.UTC).isoformat(),
        "files": list(PACKAGE_FILES),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
    private_tree(out)
    for name in (*PACKAGE_FILES, MANIFEST):
        fsync_path(out / name)
    return manifest
