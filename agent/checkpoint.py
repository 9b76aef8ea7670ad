"""The run's own state after each completed turn, so a killed run resumes from the last completed
turn (`ahc discover` again with the same --data-dir).

Written atomically (temporary file, fsync, rename): a kill leaves either the old or the new
checkpoint, never half of one. The store's rows carry (turn, attempt); a row is part of the run only
if its turn is completed here by that same attempt, so the rows of a turn cut off by a kill are
ignored when the resumed run redoes that turn.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FILE = "checkpoint.json"
VERSION = 1


@dataclass
class Checkpoint:
    run_id: str
    rule: str
    policy: str
    seed: int
    status: str = "running"  # running | solved | stopped
    reason: str = ""
    turn: int = 0
    attempt: int = 1
    turn_attempts: list[int] = field(default_factory=list)  # the attempt that completed each turn
    compactions: int = 0
    last_error: str | None = None  # the last reply's problem, told to the policy in the next turn
    harness: dict[str, Any] = field(default_factory=dict)  # counters and the RNG's state
    evidence: list[list[str]] = field(default_factory=list)
    journal: list[dict[str, Any]] = field(default_factory=list)
    knowledge: dict[str, Any] = field(default_factory=dict)
    submissions: list[dict[str, Any]] = field(default_factory=list)
    policy_state: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    store: str = "local"
    # Fresh per run from scratch, so server session ids never meet the State of an earlier run's.
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    version: int = VERSION

    def valid_row(self, row: dict[str, Any]) -> bool:
        try:
            call = json.loads(row.get("tool_call_json") or "{}")
            turn, attempt = int(call["turn"]), int(call["attempt"])
        except (ValueError, KeyError, TypeError):
            return False
        return 1 <= turn <= len(self.turn_attempts) and self.turn_attempts[turn - 1] == attempt

    def save(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f".{FILE}.tmp"
        with tmp.open("w") as out:
            json.dump(asdict(self), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, run_dir / FILE)

    @classmethod
    def load(cls, run_dir: Path) -> Checkpoint | None:
        path = run_dir / FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"checkpoint {path} is corrupt ({exc}); rerun with --fresh") from None
        if data.get("version") != VERSION:
            raise ValueError(f"checkpoint {path} has version {data.get('version')}; rerun with --fresh")
        return cls(**data)
