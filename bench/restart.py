"""What a start of XDB costs as the audit log grows: a history of `records` audit records generated
through the audit log's own chain (one checkpoint and one anchored head per 50,000 records, as the
writer commits them), the experience file holding none of their rows (as after retention compressed
and deleted them: the audit keeps every record).

    open_s          XDB.open: the log's tail verified (from its last checkpoint), then recording can go
                    on; the whole chain is re-hashed in the background
    service_s       the XDB service process (what `ahc serve` runs, and what its crash restart does) from
                    spawn to its first answer
    full_verify_s   the whole chain and every anchor re-hashed: what each start cost before
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import numpy as np

from core.config import XDBConfig
from xdb import XDB, RemoteXDB
from xdb.audit.log import AuditLog
from xdb.concepts import ConceptIndex
from xdb.rows import TokenBatch, batch_to_arrow
from xdb.store import AUDIT_FILE, EXPERIENCE_FILE

COMMIT = 50_000  # records a commit (the writer's batch_rows)
CONCEPTS = [f"concept-{i}" for i in range(64)]


def synthetic_history(data_dir: Path, records: int, seed: int = 0) -> None:
    """`records` audit records chained, checkpointed and anchored as the writer does, in commits of
    COMMIT; the experience file's next id moved past them."""
    XDB.open(data_dir).close()  # the schema of both files, and the head file
    audit = AuditLog.open(data_dir / AUDIT_FILE)
    rng = np.random.default_rng(seed)
    concepts = ConceptIndex([])
    try:
        for first in range(0, records, COMMIT):
            n = min(COMMIT, records - first)
            batch = TokenBatch(f"s{(first // COMMIT) % 64}", np.arange(first, first + n), ["tok"] * n,
                               rng.integers(0, 32000, n), request_id=f"r{first // COMMIT}", concept_names=CONCEPTS,
                               concept_index=np.tile(np.arange(10, dtype=np.int32), (n, 1)),
                               concept_values=rng.random((n, 10), dtype=np.float32), created_at=time.time())
            table, added = batch_to_arrow(batch, first, concepts)
            audit.append(table, added)
    finally:
        audit.close()
    con = duckdb.connect(str(data_dir / EXPERIENCE_FILE))
    try:  # what retention leaves: the rows gone from the experience file, their ids used
        con.execute("INSERT OR REPLACE INTO xdb_meta VALUES ('last_timestep_id', ?)", [str(records - 1)])
    finally:
        con.close()


def restart_figures(data_dir: Path) -> dict[str, float]:
    began = time.perf_counter()
    xdb = XDB.open(data_dir)
    opened = time.perf_counter() - began
    xdb.close()
    began = time.perf_counter()
    remote = RemoteXDB(data_dir, XDBConfig())
    try:
        remote.audit_head()  # its first answer
        service = time.perf_counter() - began
    finally:
        remote.close()
    began = time.perf_counter()
    audit = AuditLog.open(data_dir / AUDIT_FILE, read_only=True)
    try:
        report = audit.verify()
    finally:
        audit.close()
    if not report.ok:
        raise RuntimeError(f"the synthetic history does not verify: {report.first_bad}")
    return {"open_s": opened, "service_s": service, "full_verify_s": time.perf_counter() - began,
            "records": float(report.records_checked)}

