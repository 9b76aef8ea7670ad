"""The audit log bounded by retention: the records up to the last checkpoint before which retention has
removed every row from the experience file leave the log. A chained `audit_retired` event names that
checkpoint (seq, chain head, checkpoint hash) first; then the records and checkpoints before it are deleted
in one transaction, the checkpoint itself kept as the anchor what remains verifies from
(xdb/audit/verify.py's `retirement`), and the head file keeps its lines from there on. A retirement a crash
cut short after its event is carried out at the next open (xdb/audit/log.py's `verify_for_open`)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from xdb.audit.chain import EVENT_TYPE, read_heads
from xdb.audit.hidden import HIDDEN_TABLE, has_hidden
from xdb.audit.verify import RETIRED_ACTION
from xdb.private import fsync_path
from xdb.sql import one

log = logging.getLogger("ahc.xdb.audit")


class RetirementMethods:
    """`AuditLog`'s retirement (a mixin): what it reads of the log."""

    conn: duckdb.DuckDBPyConnection
    path: Path
    head_path: Path
    committed_seq: int
    _commit_lock: threading.Lock
    _head_fd: int | None

    append_event: Callable[[str, dict[str, Any]], int]  # xdb/audit/log.py's

    def retire(self, live_from: int, older_than: datetime, reason: str, shipped_through: int | None = None
               ) -> dict[str, Any] | None:
        """Retire the records up to the last checkpoint before the first record retention must keep: a
        row at or past `live_from` (the experience file's first timestep left; or past its last),
        anything written at or after `older_than`, or past `shipped_through` (the last record a shared lake
        holds, when there is one: nothing leaves before it is shipped). None when nothing can go."""
        with self.conn.cursor() as cur:
            kept = one(cur.execute("SELECT min(seq) FROM audit_records WHERE (event_type != ? AND timestep_id >= ?) "
                                   "OR created_at >= ?", [EVENT_TYPE, live_from, older_than]))[0]
            bound = self.committed_seq if kept is None else int(kept)
            if shipped_through is not None:
                bound = min(bound, shipped_through + 1)
            found = one(cur.execute("SELECT max(seq_end) FROM audit_checkpoints WHERE seq_end < ?", [bound]))[0]
            first = one(cur.execute("SELECT min(seq) FROM audit_records"))[0]
        if found is None or first is None or int(found) < int(first):
            return None
        return self.retire_through(int(found), reason)

    def retire_through(self, through: int, reason: str) -> dict[str, Any]:
        """Retire the records up to `through` (a checkpoint's end): chain an `audit_retired` event naming
        that checkpoint, then delete them and the checkpoints before it (`_carry_out`)."""
        with self.conn.cursor() as cur:
            row = cur.execute("SELECT chain_head, checkpoint_hash FROM audit_checkpoints WHERE seq_end = ?",
                              [through]).fetchone()
            if row is None:
                raise ValueError(f"no audit checkpoint ends at seq {through}")
            count = one(cur.execute("SELECT count(*) FROM audit_records WHERE seq <= ?", [through]))[0]
        details = {"through_seq": through, "chain_head": bytes(row[0]).hex(), "checkpoint_hash": bytes(row[1]).hex(),
                   "records": int(count), "reason": reason}
        seq = self.append_event(RETIRED_ACTION, details)
        self._carry_out(through)
        log.info("audit log %s: retired %d records up to seq=%d (%s), by the event at seq=%d", self.path, count,
                 through, reason, seq)
        return {**details, "event_seq": seq}

    def _carry_out(self, through: int) -> None:
        """Delete the records up to `through` and the checkpoints before it, in one transaction; then keep
        the head file's lines from `through` on."""
        with self._commit_lock:
            con = self.conn
            con.execute("BEGIN")
            try:
                con.execute(f"DELETE FROM audit_records WHERE seq <= {int(through)}")
                if has_hidden(con):
                    con.execute(f"DELETE FROM {HIDDEN_TABLE} WHERE seq <= {int(through)}")
                con.execute(f"DELETE FROM audit_checkpoints WHERE seq_end < {int(through)}")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            self._trim_head_file(through)

    def _trim_head_file(self, through: int) -> None:
        """Rewrite the head file without its lines before `through` (written aside, fsynced, renamed)."""
        lines = read_heads(self.head_path) or []
        kept = "".join(f"{seq} {head.hex()}\n" for seq, head in lines if seq >= through)
        temp = self.head_path.with_name(self.head_path.name + ".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, kept.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if self._head_fd is not None:
            os.close(self._head_fd)
            self._head_fd = None
        os.replace(temp, self.head_path)
        fsync_path(self.head_path.parent)
