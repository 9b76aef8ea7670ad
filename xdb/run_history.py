"""The discovery agent's history across runs: what each run tried, what worked, and how its theorems
changed.

Three append-only tables, keyed by run id like the run's turns (xdb/runs.py), so a fresh run's purge
takes them too:
- `run_progress`: the run's figures after every turn (status, turns, tokens, laws tried / passed /
  failed, theorems stored / retracted, time) under its rule and strategy; the latest row is the run's
  outcome, so a run killed mid-way still shows how far it got;
- `run_attempts`: every law judged (evaluate_laws) and every theory submitted, with the verdict; a law
  is named across runs by `law_key`, the hash of its canonical JSON (law ids are per run);
- `theorem_versions`: every version of every theorem, each linked to its parent version, with the
  turn and the reason of the change.

Lineage is a table of its own rather than derived from meta_knowledge's snapshots: a snapshot holds the
whole theory as it stood, without which theorem changed, why, or from which version, and snapshots of
two edits in one turn cannot be told apart from one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

import duckdb

from core.errors import InvalidRequest
from xdb.audit.log import AuditEvent
from xdb.interface import reads, writes
from xdb.owner import owned
from xdb.rows import encoded
from xdb.sql import Row, digest, one_int, transaction

HISTORY_TABLES = ("run_progress", "run_attempts", "theorem_versions")
RunStatus = Literal["running", "solved", "stopped"]
AttemptKind = Literal["law", "submission"]
Verdict = Literal["PASS", "FAIL"]
TheoremChange = Literal["stored", "edited", "restricted", "retracted", "reinstated", "renamed"]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
ATTEMPT_KINDS: tuple[str, ...] = get_args(AttemptKind)
VERDICTS: tuple[str, ...] = get_args(Verdict)
THEOREM_CHANGES: tuple[str, ...] = get_args(TheoremChange)
PROGRESS_COLUMNS = ("progress_id", "run_id", "rule", "strategy", "strategy_json", "status", "turns", "tokens",
                    "laws_tried", "laws_passed", "laws_failed", "theorems_stored", "theorems_retracted", "wall_s",
                    "created_at")
ATTEMPT_COLUMNS = ("attempt_id", "run_id", "rule", "turn", "kind", "subject", "law_key", "law_json", "verdict",
                   "detail", "created_at")
LINEAGE_COLUMNS = ("version_id", "run_id", "theorem_id", "version", "parent_version", "change", "turn", "reason",
                   "theorem_json", "created_at")
COUNTS = ("turns", "tokens", "laws_tried", "laws_passed", "laws_failed", "theorems_stored", "theorems_retracted")


@dataclass(frozen=True)
class Progress:
    """A run's figures after one turn."""

    rule: str
    strategy: str  # the policy and what sets it apart, e.g. "baseline" or "llm:model-name"
    status: str
    turns: int = 0
    tokens: int = 0
    laws_tried: int = 0
    laws_passed: int = 0
    laws_failed: int = 0
    theorems_stored: int = 0
    theorems_retracted: int = 0
    wall_s: float = 0.0
    strategy_json: str | None = None  # the strategy's settings and design choices (periods tried, ring sizes)

    def check(self) -> None:
        """ValueError naming the first field that is wrong."""
        if self.status not in RUN_STATUSES:
            raise InvalidRequest(f"status must be one of {', '.join(RUN_STATUSES)}, got {self.status!r}")
        for name in ("rule", "strategy"):
            if not getattr(self, name):
                raise InvalidRequest(f"{name} must not be empty")
        for name in COUNTS:
            if getattr(self, name) < 0:
                raise InvalidRequest(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.wall_s < 0:
            raise InvalidRequest(f"wall_s must be >= 0, got {self.wall_s}")
        _json_text(self.strategy_json, "strategy_json")


def _json_text(text: str | None, name: str) -> None:
    if text is None:
        return
    encoded(text, name)
    try:
        json.loads(text)
    except ValueError:
        raise InvalidRequest(f"{name} is not JSON") from None


def _rows(rows: list[Row], cols: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        rec = dict(zip(cols, r))
        rec["created_at"] = rec["created_at"].isoformat() + "Z"
        out.append(rec)
    return out


@writes
def record_progress(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, run_id: str,
                    progress: Progress) -> int:
    progress.check()
    encoded(run_id, "run_id")
    with transaction(cur):
        progress_id = one_int(cur.execute(
            f"INSERT INTO run_progress ({', '.join(PROGRESS_COLUMNS[1:])}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now()) RETURNING progress_id",
            [run_id, progress.rule, progress.strategy, progress.strategy_json, progress.status,
             *(getattr(progress, c) for c in COUNTS), progress.wall_s]))
        if audit is not None:  # an outcome is evidence of what a strategy achieves: chained like the turns
            audit("agent_progress", {"run_id": run_id, "progress_id": progress_id, "status": progress.status,
                                     "turns": progress.turns})
    return progress_id


@writes
def record_attempt(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, run_id: str, *, rule: str,
                   turn: int, kind: str, subject: str, verdict: str, law_json: str | None = None,
                   detail: str | None = None) -> int:
    """One law judged or one theory submitted. A law's `law_key` is its canonical JSON's hash, so the
    same law tried by two runs (under different per-run ids) is counted as one. A resumed run redoes the
    turn it was killed in: the same attempt with the same verdict in the same turn is the row already
    there (its id is returned), not a second one."""
    if kind not in ATTEMPT_KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(ATTEMPT_KINDS)}, got {kind!r}")
    if verdict not in VERDICTS:
        raise InvalidRequest(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    if turn < 0:
        raise InvalidRequest(f"turn must be >= 0, got {turn}")
    if kind == "law" and law_json is None:
        raise InvalidRequest("a law attempt needs its law_json")
    for text, name in ((run_id, "run_id"), (rule, "rule"), (subject, "subject"), (detail, "detail")):
        encoded(text, name)
    _json_text(law_json, "law_json")
    key = law_key(law_json) if law_json is not None else None
    with transaction(cur):
        again = cur.execute(
            "SELECT attempt_id FROM run_attempts WHERE run_id = ? AND turn = ? AND kind = ? AND subject = ? AND "
            "law_key IS NOT DISTINCT FROM ? AND verdict = ? ORDER BY attempt_id LIMIT 1",
            [run_id, turn, kind, subject, key, verdict]).fetchone()
        if again is not None:
            return int(again[0])
        attempt_id = one_int(cur.execute(
            "INSERT INTO run_attempts (run_id, rule, turn, kind, subject, law_key, law_json, verdict, detail, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now()) RETURNING attempt_id",
            [run_id, rule, turn, kind, subject, key, law_json and canonical_text(law_json), verdict, detail]))
        if audit is not None:
            audit("agent_attempt", {"run_id": run_id, "attempt_id": attempt_id, "verdict": verdict,
                                    "sha256": digest(law_json, detail)})
    return attempt_id


def canonical_text(law_json: str) -> str:
    return json.dumps(json.loads(law_json), sort_keys=True, separators=(",", ":"))


def law_key(law_json: str) -> str:
    return digest(canonical_text(law_json))[:16]


@writes
def record_theorem_version(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, run_id: str, *,
                           theorem_id: str, change: str, turn: int, theorem_json: str,
                           reason: str | None = None) -> int:
    """A theorem's next version, its parent the theorem's latest (none for a first `stored`); returns
    the new version's number (1 for a newly stored theorem)."""
    if change not in THEOREM_CHANGES:
        raise InvalidRequest(f"change must be one of {', '.join(THEOREM_CHANGES)}, got {change!r}")
    if turn < 0:
        raise InvalidRequest(f"turn must be >= 0, got {turn}")
    for text, name in ((run_id, "run_id"), (theorem_id, "theorem_id"), (reason, "reason")):
        encoded(text, name)
    _json_text(theorem_json, "theorem_json")
    with transaction(cur):
        row = cur.execute("SELECT max(version) FROM theorem_versions WHERE run_id = ? AND theorem_id = ?",
                          [run_id, theorem_id]).fetchone()
        parent = None if row is None or row[0] is None else int(row[0])
        # A theorem stored again (a resumed run redoing the turn a kill cut off) follows its last version.
        if parent is None and change != "stored":
            raise InvalidRequest(f"theorem {theorem_id} of run {run_id} has no stored version for a "
                                 f"'{change}' one to follow", param="theorem_id")
        version = (parent or 0) + 1
        version_id = one_int(cur.execute(
            "INSERT INTO theorem_versions (run_id, theorem_id, version, parent_version, change, turn, reason, "
            "theorem_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, now()) RETURNING version_id",
            [run_id, theorem_id, version, parent, change, turn, reason, theorem_json]))
        if audit is not None:
            audit("agent_theorem", {"run_id": run_id, "version_id": version_id, "theorem_id": theorem_id,
                                    "version": version, "sha256": digest(theorem_json, reason)})
    return version


@reads
def theorem_lineage(cur: duckdb.DuckDBPyConnection, run_id: str, theorem_id: str | None = None) -> list[dict[str, Any]]:
    """Every version of the run's theorems (or of one), oldest first per theorem."""
    rows = cur.execute(
        f"SELECT {', '.join(LINEAGE_COLUMNS)} FROM theorem_versions WHERE run_id = ? "
        "AND (? IS NULL OR theorem_id = ?) ORDER BY theorem_id, version", [run_id, theorem_id, theorem_id]).fetchall()
    return _rows(rows, LINEAGE_COLUMNS)


@reads
def run_outcomes(cur: duckdb.DuckDBPyConnection, owner: str, rule: str | None = None,
                 strategy: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The owner's runs (of one rule, one strategy), each as its latest progress row, most recent first."""
    condition, params = owned("run_id", owner)
    rows = cur.execute(
        f"SELECT {', '.join(PROGRESS_COLUMNS)} FROM run_progress WHERE {condition} "
        "AND (? IS NULL OR rule = ?) AND (? IS NULL OR strategy = ?) "
        "QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY progress_id DESC) = 1 "
        "ORDER BY progress_id DESC LIMIT ?", [*params, rule, rule, strategy, strategy, limit]).fetchall()
    return _rows(rows, PROGRESS_COLUMNS)


@reads
def failed_laws(cur: duckdb.DuckDBPyConnection, owner: str, rule: str | None = None,
                limit: int = 20) -> list[dict[str, Any]]:
    """The laws the owner's runs (of one rule) refuted, most often refuted first: the law, how many
    FAILs and in how many runs, the last counterexample's text."""
    condition, params = owned("run_id", owner)
    rows = cur.execute(
        f"SELECT law_key, any_value(law_json), count(*), count(DISTINCT run_id), max(turn), "
        "arg_max(detail, attempt_id), arg_max(subject, attempt_id) FROM run_attempts "
        f"WHERE {condition} AND kind = 'law' AND verdict = 'FAIL' AND (? IS NULL OR rule = ?) "
        "GROUP BY law_key ORDER BY count(*) DESC, law_key LIMIT ?", [*params, rule, rule, limit]).fetchall()
    return [{"law_key": key, "law": json.loads(law), "fails": int(fails), "runs": int(runs), "last_turn": turn,
             "detail": detail, "subject": subject} for key, law, fails, runs, turn, detail, subject in rows]


@reads
def retracted_theorems(cur: duckdb.DuckDBPyConnection, owner: str, rule: str,
                       limit: int = 20) -> list[dict[str, Any]]:
    """The theorems retracted in the owner's runs of `rule`, with the reason."""
    condition, params = owned("v.run_id", owner)
    rows = cur.execute(
        f"SELECT {', '.join('v.' + c for c in LINEAGE_COLUMNS)} FROM theorem_versions v "
        f"WHERE {condition} AND v.change = 'retracted' "
        "AND v.run_id IN (SELECT run_id FROM run_progress WHERE rule = ?) ORDER BY v.version_id DESC LIMIT ?",
        [*params, rule, limit]).fetchall()
    return _rows(rows, LINEAGE_COLUMNS)


def strategy_summary(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per strategy: runs, how many solved, and the fewest and mean turns of those that did; best first."""
    by: dict[str, list[dict[str, Any]]] = {}
    for row in outcomes:
        by.setdefault(row["strategy"], []).append(row)
    summary = []
    for strategy, rows in by.items():
        solved = [r["turns"] for r in rows if r["status"] == "solved"]
        summary.append({"strategy": strategy, "runs": len(rows), "solved": len(solved),
                        "min_turns": min(solved) if solved else None,
                        "mean_turns": round(sum(solved) / len(solved), 2) if solved else None})
    return sorted(summary, key=lambda s: (-s["solved"], s["mean_turns"] or 0.0, s["strategy"]))


@reads
def run_history(cur: duckdb.DuckDBPyConnection, owner: str, rule: str | None = None, strategy: str | None = None,
                limit: int = 100) -> dict[str, Any]:
    """What the owner's runs (of one rule, one strategy) learned: each run's outcome, per strategy how
    many solved and in how many turns, the laws refuted most often, and (for one rule) the theorems
    retracted and why."""
    outcomes = run_outcomes(cur, owner, rule, strategy, limit)
    return {"rule": rule, "strategy": strategy, "runs": outcomes, "strategies": strategy_summary(outcomes),
            "failed_laws": failed_laws(cur, owner, rule),
            "retracted_theorems": retracted_theorems(cur, owner, rule) if rule else []}
