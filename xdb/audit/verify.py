"""Verifying the audit log: the concept chain, the checkpoint chain and every record's hash (its leaf and
its batch's head, or its own chained hash before schema version 6) recomputed from its fields
(xdb/audit/chain.py), then the head file against the log.

The chain alone cannot catch whoever rewrites the file wholesale: cut off its tail together with the
tail's checkpoints, or edit a record and recompute every hash after it. So every commit also anchors
the new head outside the file (`audit.head`), and verification checks every anchored line against the
checkpoint that ends at its seq and the last line against the log's end; `--expect-head SEQ:HASH`
checks a head noted elsewhere (a log line, a scraped gauge). From schema version 2 on, a non-empty
log without `audit.head` fails verification.

Records sealed under a session's key (xdb/audit/seal.py) verify without it. A key missing from
`audit.keys` is an erasure by policy when a chained `delete_session` event destroyed it after the last
record sealed under it; otherwise it is tampering (`check_erasures`).

A log is bounded by retention (`AuditLog.retire_through`): the records up to a checkpoint's end whose rows
retention removed from the experience file leave the log, after a chained `audit_retired` event names
that checkpoint (its seq, chain head and checkpoint hash). The checkpoint stays as the log's anchor: what
remains verifies from it (`retirement`), as from genesis, so a record deleted without a retirement is
still a record missing, and an anchor that differs from the chained retirement is tampering. Anchored
head lines before it are retired with it; verifying a range retired says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import duckdb

from xdb.audit.chain import (
    EVENT_TYPE,
    GENESIS,
    RECORD_COLUMNS,
    Rehash,
    checkpoint_hash,
    concept_hash,
    parse_head,
    read_heads,
)
from xdb.audit.hidden import check_hidden, has_hidden
from xdb.sql import Row, one


@dataclass
class AuditReport:
    ok: bool
    records_checked: int
    first_bad: str | None = None  # names the first bad record, e.g. "audit record seq=12 (...): ..."
    # Checkpoints (seq_end, chain_head) the log holds past audit.head's last line, when that is the
    # only fault: one of them is what a crash between the two writes of a commit leaves.
    unanchored: list[tuple[int, bytes]] = field(default_factory=list)
    # The sessions erased by policy: "session 'x': N records erased by the deletion at record seq=S".
    erased: list[str] = field(default_factory=list)
    # Records retired by policy before the anchor verification started from (None: none were).
    retired: str | None = None


RETIRED_ACTION = "audit_retired"


@dataclass(frozen=True)
class Retired:
    """A chained retirement (`audit_retired` event at record `seq`): the records up to `through` (a
    checkpoint's end, whose chain head and checkpoint hash it names) left the log by policy."""

    seq: int
    through: int
    head: bytes
    checkpoint: bytes
    records: int
    reason: str

    def note(self) -> str:
        return (f"records seq=0..{self.through} retired by policy ({self.reason}), by the retirement at record "
                f"seq={self.seq}; what remains verified from its anchor")


def retirements(cur: duckdb.DuckDBPyConnection) -> list[Retired]:
    """Every retirement chained (and not itself retired), in chain order."""
    rows = cur.execute("SELECT seq, content FROM audit_records WHERE event_type = ? AND key_id IS NULL "
                       f"AND content LIKE '%\"action\":\"{RETIRED_ACTION}\"%' ORDER BY seq", [EVENT_TYPE]).fetchall()
    found = []
    for seq, content in rows:
        event = json.loads(content)
        if event.get("action") == RETIRED_ACTION:
            found.append(Retired(int(seq), int(event["through_seq"]), bytes.fromhex(event["chain_head"]),
                                 bytes.fromhex(event["checkpoint_hash"]), int(event.get("records", 0)),
                                 str(event.get("reason", ""))))
    return found


def retirement(cur: duckdb.DuckDBPyConnection) -> Retired | None:
    """The anchor the log verifies from: the latest chained retirement carried out (no record up to its
    `through` is left); None: verification starts at genesis. One chained but cut short by a crash (its
    records still there) is not: the log verifies as it stands, and the next open carries it out."""
    first = one(cur.execute("SELECT min(seq) FROM audit_records"))[0]
    done = [r for r in retirements(cur) if first is not None and r.through < first]
    return done[-1] if done else None


def _describe(cur: duckdb.DuckDBPyConnection, seq: int) -> str:
    row = cur.execute("SELECT timestep_id, session_id, tick, event_type FROM audit_records WHERE seq = ? LIMIT 1",
                      [seq]).fetchone()
    if row is None:
        return f"audit record seq={seq}"
    if row[3] == EVENT_TYPE:
        return f"audit record seq={seq} (xdb event)"
    return f"audit record seq={seq} (timestep {row[0]}, session {row[1]!r}, tick {row[2]})"


def heads_as_of_now(path: Path) -> Callable[[], list[tuple[int, bytes]] | None]:
    """The head file as it is now, for `check_anchor` to read later (a bad file raises then)."""
    try:
        heads = read_heads(path)
    except ValueError as exc:
        error = exc

        def fail() -> list[tuple[int, bytes]] | None:
            raise error

        return fail
    return lambda: heads


def check_anchor(cur: duckdb.DuckDBPyConnection, head_path: Path, report: AuditReport,
                 heads_of: Callable[[], list[tuple[int, bytes]] | None] | None = None) -> AuditReport:
    """Every line of the head file must name a checkpoint's end with that checkpoint's head, and
    the last line the log's last checkpoint. A recomputed chain fails the first line anchored
    after the edit; a cut-off tail fails the last line. `heads_of`: the file as read when `cur`'s
    snapshot was taken (default: read it now)."""
    checkpoints = cur.execute("SELECT seq_end, chain_head FROM audit_checkpoints ORDER BY seq_end").fetchall()
    by_end = {int(end): bytes(head) for end, head in checkpoints}
    last_end = int(checkpoints[-1][0]) if checkpoints else -1

    def bad(message: str, unanchored: list[tuple[int, bytes]] | None = None) -> AuditReport:
        return AuditReport(False, report.records_checked, message, unanchored or [])

    try:
        heads = heads_of() if heads_of is not None else read_heads(head_path)
    except ValueError as exc:
        return bad(f"audit head mismatch: {exc}")
    anchor = retirement(cur)
    if heads is not None and anchor is not None:  # lines before the anchor were retired with their records
        heads = [(seq, head) for seq, head in heads if seq >= anchor.through]
    if heads is None:
        if checkpoints:
            return bad(f"audit head mismatch: {head_path} is missing but the log holds records up to "
                       f"seq={last_end} (deleted, or the log was copied without it)")
        return report
    prev = -1
    for seq, head in heads:
        if seq <= prev:
            return bad(f"audit head mismatch at seq={seq}: {head_path} goes back after seq {prev} (edited)")
        if seq > last_end:
            return bad(f"audit head mismatch at seq={seq}: {head_path} anchors seq {seq} but the log ends at "
                       f"seq {last_end} (its tail was deleted)")
        if by_end.get(seq) != head:
            return bad(f"audit head mismatch at seq={seq}: {head_path} anchors hash {head.hex()[:16]}…, the log "
                       "differs there (rewritten after it was anchored)")
        prev = seq
    if prev != last_end:
        unanchored = [(int(end), bytes(head)) for end, head in checkpoints if end > prev]
        return bad(f"audit head mismatch at seq={unanchored[0][0]}: the log goes on to seq {last_end} past "
                   f"{head_path}'s last anchor (seq {prev}): {len(unanchored)} checkpoint(s) never anchored "
                   "(appended, or a crash between a commit's two writes, which the next open repairs)", unanchored)
    return report


def check_expected_head(cur: duckdb.DuckDBPyConnection, expect: tuple[int, bytes], report: AuditReport) -> AuditReport:
    """A head noted earlier (a log line, a scraped gauge) must still be on the (verified) chain."""
    seq, head = expect
    row = cur.execute("SELECT record_hash FROM audit_records WHERE seq = ? LIMIT 1", [seq]).fetchone()
    anchor = retirement(cur) if row is None else None
    if anchor is not None and seq <= anchor.through:
        if seq == anchor.through and head != anchor.head:
            return AuditReport(False, report.records_checked,
                               f"audit head mismatch at seq={seq}: expected hash {head.hex()[:16]}…, the retirement "
                               f"at record seq={anchor.seq} anchored {anchor.head.hex()[:16]}…")
        return report  # retired by policy: what remains verified from the anchor
    if row is None:
        return AuditReport(False, report.records_checked,
                           f"audit head mismatch at seq={seq}: the expected head's record is not in the log (deleted)")
    if row[0] is None:
        return AuditReport(False, report.records_checked,
                           f"audit head mismatch at seq={seq}: no batch ends there, so no head was ever anchored at it")
    if bytes(row[0]) != head:
        return AuditReport(False, report.records_checked,
                           f"audit head mismatch at seq={seq}: expected hash {head.hex()[:16]}…, the log has "
                           f"{bytes(row[0]).hex()[:16]}… (rewritten)")
    return report


def _verify_concepts(cur: duckdb.DuckDBPyConnection) -> tuple[str | None, int, bytes]:
    prev = GENESIS
    rows = cur.execute("SELECT id, name, prev_hash, hash FROM audit_concepts ORDER BY id, hash").fetchall()
    for i, (cid, name, stored_prev, stored) in enumerate(rows):
        if cid != i:
            return f"audit concept id={cid}: expected id {i} (a concept was deleted or inserted)", i, prev
        h = concept_hash(prev, cid, name)
        if bytes(stored_prev) != prev or bytes(stored) != h:
            return f"audit concept id={cid} ({name!r}): hash mismatch (edited)", i, prev
        prev = h
    return None, len(rows), prev


CHECKPOINT_COLUMNS = "seq_start, seq_end, chain_head, concept_count, concepts_head, prev_hash, checkpoint_hash"


def _verify_checkpoints(cur: duckdb.DuckDBPyConnection, concept_count: int, concepts_head: bytes,
                        anchor: Retired | None = None) -> tuple[str | None, list[Row]]:
    rows = cur.execute(f"SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints ORDER BY seq_end, seq_start").fetchall()
    if anchor is None:
        return _check_checkpoints(rows, GENESIS, 0, concept_count, concepts_head), rows
    problem = _check_anchor_row(rows[0] if rows else None, anchor)
    return problem or _check_checkpoints(rows[1:], anchor.checkpoint, anchor.through + 1, concept_count,
                                         concepts_head), rows


def _check_anchor_row(row: Row | None, anchor: Retired) -> str | None:
    """The checkpoint the log starts from is the one the retirement chained."""
    if row is None or row[1] != anchor.through or bytes(row[2]) != anchor.head or bytes(row[6]) != anchor.checkpoint:
        return (f"audit anchor at seq={anchor.through}: the checkpoint the log starts from differs from the one the "
                f"retirement at record seq={anchor.seq} chained (edited, or records deleted outside a retirement)")
    return None


def _check_checkpoints(rows: list[Row], prev: bytes, expected_start: int, concept_count: int,
                       concepts_head: bytes) -> str | None:
    """Each checkpoint of `rows` starts where the one before ended and is hashed onto its hash (`prev`
    and `expected_start` for the first); the last names the concept chain's end. The problem, or None."""
    for start, end, head, ccount, chead, stored_prev, stored in rows:
        if start != expected_start or end < start:
            return f"audit checkpoint seq {start}..{end}: expected to start at seq {expected_start}"
        if bytes(stored_prev) != prev or checkpoint_hash(prev, start, end, bytes(head), ccount,
                                                         bytes(chead)) != bytes(stored):
            return f"audit checkpoint seq {start}..{end}: hash mismatch (edited)"
        prev, expected_start = bytes(stored), end + 1
    if rows and (rows[-1][3] != concept_count or bytes(rows[-1][4]) != concepts_head):
        return "audit concepts: the concept chain does not match the last checkpoint (edited or truncated)"
    return None


def verify_connection(cur: duckdb.DuckDBPyConnection, seq_from: int | None = None, seq_to: int | None = None,
                      chunk: int = 200_000) -> AuditReport:
    """Check the concept chain, the checkpoint chain and the records in [seq_from, seq_to] (all by
    default), recomputing every record's hash from its fields. Names the first bad record."""
    problem, concept_count, concepts_head = _verify_concepts(cur)
    if problem:
        return AuditReport(False, 0, problem)
    anchor = retirement(cur)
    problem, checkpoints = _verify_checkpoints(cur, concept_count, concepts_head, anchor)
    if problem:
        return AuditReport(False, 0, problem)
    last_seq = checkpoints[-1][1] if checkpoints else -1
    note = None if anchor is None else anchor.note()
    if anchor is not None and seq_to is not None and seq_to <= anchor.through:
        return AuditReport(True, 0, retired=note)
    # Start at the checkpoint just before seq_from, end at the one covering seq_to: a range reads
    # only its own segments.
    start, prev = (0, GENESIS) if anchor is None else (anchor.through + 1, anchor.head)
    end = last_seq
    for _s, e, head, *_ in checkpoints:
        if seq_from is not None and e < seq_from:
            start, prev = e + 1, bytes(head)
        if seq_to is not None and e >= seq_to:
            end = e
            break
    heads = {e: bytes(h) for s, e, h, *_ in checkpoints}
    report = _verify_records(cur, start, end, prev, heads, chunk)
    if not report.ok:
        return report
    problem = check_hidden(cur, start, end, set(destroyed_keys(chained_deletions(cur))))
    if problem is not None:
        return AuditReport(False, report.records_checked, problem)
    checked = report.records_checked
    beyond = one(cur.execute("SELECT min(seq) FROM audit_records WHERE seq > ?", [last_seq]))[0]
    if seq_to is None and beyond is not None:
        return AuditReport(False, checked, f"{_describe(cur, beyond)}: not covered by any checkpoint (inserted)")
    return AuditReport(True, checked, retired=note)


def _verify_records(cur: duckdb.DuckDBPyConnection, start: int, end: int, prev: bytes, heads: dict[int, bytes],
                    chunk: int) -> AuditReport:
    """Re-hash the records [start, end] onto `prev` (the head before `start`), each checkpoint's head
    (`heads`, by its last seq) among them."""
    rehash = Rehash(prev, heads)
    # A log of schema version 5 or before opened read-only (not migrated) has no leaf column.
    has_leaf = one(cur.execute("SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() "
                               "AND table_name = 'audit_records' AND column_name = 'leaf'"))[0]
    leaf = "leaf" if has_leaf else "CAST(NULL AS INTEGER) AS leaf"
    has_acts = one(cur.execute("SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() "
                               "AND table_name = 'audit_records' AND column_name = 'activation_root'"))[0]
    if has_acts:  # version 7 on: a batch's head ends with its activations' root
        leaf += ", activation_root"
    if has_hidden(cur):  # version 8 on: a record with hidden activations binds their digest
        leaf += ", hidden_digest"
    expected = start
    while expected <= end:
        hi = min(expected + chunk - 1, end)
        batch = cur.execute(f"SELECT {', '.join(RECORD_COLUMNS)}, prev_hash, record_hash, {leaf} FROM audit_records "
                            "WHERE seq BETWEEN ? AND ? ORDER BY seq, record_hash", [expected, hi]).to_arrow_table()
        for seq in batch.column("seq").to_pylist():
            if seq != expected:
                what = "appears twice (inserted)" if seq < expected else "missing (deleted)"
                bad = expected - 1 if seq < expected else expected
                return AuditReport(False, rehash.checked, f"{_describe(cur, bad)}: {what}")
            expected += 1
        problem = rehash.feed(batch)
        if problem is not None:
            return AuditReport(False, rehash.checked, f"{_describe(cur, problem[0])}: {problem[1]}")
        if expected <= hi:
            return AuditReport(False, rehash.checked, f"audit record seq={expected}: missing (deleted)")
    return AuditReport(True, rehash.checked)


def last_head(path: Path) -> tuple[int, bytes] | None:
    """The head file's last line, read from the file's end (it has a line for every commit ever made);
    None when there is no file or no line. A bad last line raises ValueError."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(size - 4096, 0))
            tail = f.read().decode("ascii", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    lines = [line for line in (tail[1:] if size > 4096 else tail) if line.strip()]
    if not lines:
        return None
    try:
        return parse_head(lines[-1])
    except ValueError as exc:
        raise ValueError(f"{path}: its last line: {exc}") from None


def verify_tail(cur: duckdb.DuckDBPyConnection, head_path: Path, seq_from: int, chunk: int = 200_000) -> AuditReport:
    """What a start builds on, in time flat in the log's size: the concept chain; the checkpoints from
    the one before `seq_from` on, each linked by hash to the one before; the records after that one
    re-hashed onto its head; and the head file's last line naming the last checkpoint. What lies before
    is left to a full verification (`verify_connection` and `check_anchor`), which a start runs in the
    background. A single checkpoint past the last anchored line is reported in `unanchored`, as
    `check_anchor` does."""
    problem, concept_count, concepts_head = _verify_concepts(cur)
    if problem:
        return AuditReport(False, 0, problem)
    anchor = retirement(cur)
    if anchor is not None:  # nothing before the anchor is left: start from it at the earliest
        seq_from = max(seq_from, anchor.through + 1)
    rows = cur.execute(f"""
        SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints
        WHERE seq_end >= (SELECT coalesce(max(seq_end), -1) FROM audit_checkpoints WHERE seq_end < ?)
        ORDER BY seq_end, seq_start""", [max(seq_from, 0)]).fetchall()
    prev, head, start = GENESIS, GENESIS, 0
    if rows and rows[0][1] < max(seq_from, 0):  # the checkpoint before: where verification starts from
        base = rows.pop(0)
        if anchor is not None and base[1] == anchor.through and _check_anchor_row(base, anchor):
            return AuditReport(False, 0, _check_anchor_row(base, anchor))
        prev, head, start = bytes(base[6]), bytes(base[2]), base[1] + 1
    elif anchor is not None:
        return AuditReport(False, 0, _check_anchor_row(None, anchor))
    problem = _check_checkpoints(rows, prev, start, concept_count, concepts_head)
    if problem:
        return AuditReport(False, 0, problem)
    end = rows[-1][1] if rows else start - 1
    report = _verify_records(cur, start, end, head, {r[1]: bytes(r[2]) for r in rows}, chunk)
    if not report.ok:
        return report
    beyond = one(cur.execute("SELECT min(seq) FROM audit_records WHERE seq > ?", [end]))[0]
    if beyond is not None:
        return AuditReport(False, report.records_checked,
                           f"{_describe(cur, beyond)}: not covered by any checkpoint (inserted)")
    return _check_last_anchor(cur, head_path, report)


def _check_last_anchor(cur: duckdb.DuckDBPyConnection, head_path: Path, report: AuditReport) -> AuditReport:
    """The head file's last line names the log's last checkpoint (or the one before it, when a crash
    came between a commit's two writes: then that checkpoint is `unanchored`)."""
    checkpoints = cur.execute("SELECT seq_end, chain_head FROM audit_checkpoints ORDER BY seq_end DESC LIMIT 2"
                              ).fetchall()

    def bad(message: str, unanchored: list[tuple[int, bytes]] | None = None) -> AuditReport:
        return AuditReport(False, report.records_checked, message, unanchored or [])

    try:
        anchored = last_head(head_path)
    except ValueError as exc:
        return bad(f"audit head mismatch: {exc}")
    ends = [(int(end), bytes(h)) for end, h in checkpoints]
    if anchored is None:
        if ends:
            return bad(f"audit head mismatch: {head_path} is missing or empty but the log holds records up to "
                       f"seq={ends[0][0]} (deleted, or the log was copied without it)")
        return report
    if ends and anchored == ends[0]:
        return report
    if len(ends) == 2 and anchored == ends[1]:
        return bad(f"audit head mismatch at seq={ends[0][0]}: the log goes on past {head_path}'s last anchor "
                   f"(seq {anchored[0]}): 1 checkpoint never anchored", [ends[0]])
    return bad(f"audit head mismatch at seq={anchored[0]}: {head_path}'s last anchor names no checkpoint at the "
               "log's end (its tail was deleted or rewritten)")


@dataclass(frozen=True)
class Deletion:
    """A chained `delete_session` event: its seq and time, the session, the keys it names and the last
    timestep sealed under them (None: the event predates the field, or named no key)."""

    seq: int
    at: datetime
    session_id: str
    keys: list[int]
    through_timestep: int | None


def chained_deletions(cur: duckdb.DuckDBPyConnection) -> list[Deletion]:
    """Every chained `delete_session` event that names keys, in chain order."""
    rows = cur.execute("SELECT seq, created_at, content FROM audit_records WHERE event_type = ? AND key_id IS NULL "
                       "AND content LIKE '%\"keys_destroyed\"%' ORDER BY seq", [EVENT_TYPE]).fetchall()
    found = []
    for seq, at, content in rows:
        event = json.loads(content)
        if event.get("action") == "delete_session":
            through = event.get("through_timestep")
            found.append(Deletion(int(seq), at, str(event.get("session_id")),
                                  [int(k) for k in event.get("keys_destroyed", [])],
                                  None if through is None else int(through)))
    return found


def destroyed_keys(deletions: list[Deletion]) -> dict[int, tuple[int, str]]:
    """Every key the chained deletions destroyed: key id → (the deletion's seq, its session)."""
    destroyed: dict[int, tuple[int, str]] = {}
    for deletion in deletions:
        for key_id in deletion.keys:
            destroyed.setdefault(key_id, (deletion.seq, deletion.session_id))
    return destroyed


def check_erasures(cur: duckdb.DuckDBPyConnection, owners: Callable[[list[int]], dict[int, str]] | None,
                   report: AuditReport, deletions_now: Callable[[], list[Deletion]] | None = None) -> AuditReport:
    """Every key records are sealed under is in audit.keys (`owners`: the sessions of those of the given
    key ids that exist; None when the file is missing) for that session, or was destroyed by a chained
    deletion of that session after the key's last record. The keys are read after the snapshot the
    records come from, so a key destroyed since is checked against `deletions_now` (the deletions
    chained by now) as well. The erasures are listed in the report; anything else is tampering."""
    sealed = cur.execute("SELECT key_id, any_value(session_id), count(DISTINCT session_id), min(seq), max(seq), "
                         "count(*) FROM audit_records WHERE key_id IS NOT NULL GROUP BY key_id ORDER BY min(seq)"
                         ).fetchall()
    known = owners([int(row[0]) for row in sealed]) if owners is not None and sealed else {}
    destroyed = destroyed_keys(chained_deletions(cur)) if sealed else {}
    if deletions_now is not None and any(row[0] not in known and row[0] not in destroyed for row in sealed):
        destroyed = {**destroyed_keys(deletions_now()), **destroyed}
    erased = []
    for key_id, session, sessions, first, last, count in sealed:
        where = f"audit records seq={first}..{last} (session {session!r}, {count} sealed under key {key_id})"
        if sessions != 1:
            return AuditReport(False, report.records_checked, f"{where}: one key seals several sessions (forged)")
        if key_id in known:
            if known[key_id] != session:
                return AuditReport(False, report.records_checked,
                                   f"{where}: audit.keys gives that key to session {known[key_id]!r} (edited)")
            continue
        deletion = destroyed.get(key_id)
        if deletion is None or deletion[1] != session or deletion[0] < last:
            missing = "audit.keys is missing" if owners is None else "its key is missing from audit.keys"
            return AuditReport(False, report.records_checked,
                               f"{where}: {missing} and no deletion of the session chained after them destroyed it "
                               "(content removed outside a deletion: tampering)")
        erased.append(f"session {session!r}: {count} records erased by policy, by the deletion at record "
                      f"seq={deletion[0]}")
    return AuditReport(report.ok, report.records_checked, report.first_bad, report.unanchored, erased, report.retired)
