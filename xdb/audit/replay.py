"""The audit log as the experience file's write-ahead log: what a start replays after a crash between the
two commits (`rows_after`, from `first_seq_after`), the activations kept for it in audit_replay until the
experience file holds them (xdb/audit/activations.py), and the check of the activations that file holds
against those the log committed (`check_activations`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa

from xdb.audit.activations import REPLAY_TABLE, check_experience, check_replayed
from xdb.audit.chain import EVENT_TYPE
from xdb.audit.seal import Payload
from xdb.audit.verify import AuditReport
from xdb.schema import TOP_K
from xdb.sql import one

# How long a checkpoint waits for the experience file to commit the batch the log just committed, so that
# audit_replay is empty when it is written (xdb/audit/checkpoints.py): its commit follows within milliseconds.
REPLAY_WAIT_S = 0.25


class ReplayMethods:
    """`AuditLog`'s replay side (a mixin)."""

    conn: duckdb.DuckDBPyConnection
    path: Path
    activations_apart: bool
    _held_through: int
    _audited_through: int
    _pruned_through: int

    _open_sealed: Callable[[pa.Table], list[Payload | bool]]  # xdb/audit/records.py's

    def experience_holds(self, timestep_id: int) -> None:
        """The experience file has committed every row up to `timestep_id`: their activations may leave
        audit_replay (at the next commit, in its transaction)."""
        self._held_through = max(self._held_through, timestep_id)

    def _empty_replay(self, wait_s: float = REPLAY_WAIT_S) -> None:
        """Before a checkpoint (under the commit lock): wait a little for the experience file to commit what
        the log has (its commit follows the log's), then drop the activations it holds from audit_replay."""
        deadline = time.monotonic() + wait_s
        while self._held_through < self._audited_through and time.monotonic() < deadline:
            time.sleep(0.002)
        self._prune_replay(self.conn)

    def _prune_replay(self, con: duckdb.DuckDBPyConnection) -> None:
        held = self._held_through
        if self.activations_apart and held > self._pruned_through:
            con.execute(f"DELETE FROM {REPLAY_TABLE} WHERE timestep_id <= {int(held)}")
            self._pruned_through = held

    def last_timestep_id(self) -> int:
        last = one(self.conn.execute("SELECT max(timestep_id) FROM audit_records"))[0]
        return -1 if last is None else int(last)

    def rows_after(self, timestep_id: int) -> pa.Table:
        """Audited rows the experience file has not committed yet (replayed after a crash). Their activations
        (version 7 on) are those audit_replay kept, checked against each record's leaf: a row the experience
        file had committed once (it was restored from an older copy) comes back without them."""
        if self.activations_apart:  # a record's own activations (before version 7), else those it waits with
            acts = ("coalesce(r.concept_ids, p.concept_ids) AS concept_ids, coalesce(r.concept_values, "
                    "p.concept_values) AS concept_values, "
                    "CASE WHEN p.timestep_id IS NOT NULL THEN r.activation_leaf END AS activation_leaf")
            source = f"audit_records r LEFT JOIN {REPLAY_TABLE} p USING (timestep_id)"
        else:
            acts, source = "concept_ids, concept_values, CAST(NULL AS INTEGER) AS activation_leaf", "audit_records r"
        cols = "timestep_id AS id, session_id, tick, event_type, role, content, token_id, request_id, " \
               f"{acts}, activation_source, created_at, metadata"
        table = self.conn.execute(f"SELECT {cols}, seq, key_id, sealed FROM {source} WHERE timestep_id > ? "
                                  "AND event_type != ? ORDER BY seq", [timestep_id, EVENT_TYPE]).to_arrow_table()
        bad = check_replayed(table, table.column("activation_leaf").to_pylist(), TOP_K)
        if bad is not None:
            raise ValueError(f"audit log {self.path}: the activations kept for replay of record "
                             f"seq={table.column('seq')[bad].as_py()} do not hash to its leaf (edited); nothing "
                             "was replayed")
        table = table.drop_columns(["activation_leaf"])
        opened = self._open_sealed(table)
        # A deleted session's rows (its key destroyed) are not replayed: the deletion came after them.
        keep = pa.array([payload is not False for payload in opened], pa.bool_())
        rows = table.drop_columns(["seq", "key_id", "sealed"])
        for i, name in ((0, "token_id"), (1, "content"), (2, "metadata")):
            clear = rows.column(name).to_pylist()
            values = [p[i] if isinstance(p, tuple) else v for p, v in zip(opened, clear)]
            rows = rows.set_column(rows.column_names.index(name), name, pa.array(values, rows.column(name).type))
        return rows.filter(keep)

    def check_activations(self, experience: duckdb.DuckDBPyConnection, report: AuditReport,
                          seq_from: int | None = None, seq_to: int | None = None) -> AuditReport:
        """`report` (a verified chain) with the activations the experience file (`experience`, a cursor
        of it) holds for the records in [seq_from, seq_to] checked against those the log committed."""
        if not report.ok or not self.activations_apart:
            return report
        with self.conn.cursor() as cur:
            lo, hi = one(cur.execute("SELECT min(seq), max(seq) FROM audit_records"))
            if lo is None:
                return report
            start = lo if seq_from is None else max(lo, seq_from)
            end = hi if seq_to is None else min(hi, seq_to)
            problem = check_experience(cur, experience, start, end, TOP_K)
        if problem is not None:
            return AuditReport(False, report.records_checked, problem, erased=report.erased, retired=report.retired)
        return report

    def first_seq_after(self, timestep_id: int) -> int | None:
        """The first record of a row past `timestep_id` (what a replay starts from); None: none."""
        found = one(self.conn.execute("SELECT min(seq) FROM audit_records WHERE timestep_id > ? AND event_type != ?",
                                      [timestep_id, EVENT_TYPE]))[0]
        return None if found is None else int(found)
