"""Tier 2, the evolving theory: laws the agent has judged, theorems it has stored, and the
negative-knowledge summary of what was falsified, and what earlier runs on the same rule refuted.

Every law sent to evaluate_laws gets a stable id (the same law JSON, the same id), with its PASS and
FAIL counts, so a theorem can name laws by id and compaction can list laws that passed repeatedly but
are not theorems yet.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

THEOREM_STATUSES = ("established", "restricted", "retracted")
PASSES_FOR_CANDIDATE = 2


@dataclass
class LawRecord:
    law_id: str
    law: Any
    passes: int = 0
    fails: int = 0
    last_turn: int = 0


@dataclass
class Theorem:
    theorem_id: str
    name: str
    law_ids: list[str]
    description: str
    laws: list[Any]
    status: str = "established"
    turn: int = 0


@dataclass
class Knowledge:
    laws: dict[str, LawRecord] = field(default_factory=dict)
    theorems: list[Theorem] = field(default_factory=list)
    negative_knowledge: str = ""
    candidates_note: str = ""  # laws that passed repeatedly but are no theorem, as of the last compaction
    last_compacted_turn: int = 0
    # Read from earlier runs on the same rule as the run starts (agent/history.py): what they refuted and
    # retracted, as a note for Karma, and the refuted laws' canonical JSON, so a policy need not try them again.
    prior_note: str = ""
    prior_refuted: list[str] = field(default_factory=list)

    def refuted_before(self, law: Any) -> bool:
        """True if an earlier run on this rule saw `law` FAIL (a FAIL comes with a counterexample: it is false)."""
        return canonical(law) in self.prior_refuted

    def law_id(self, law: Any) -> str:
        """The id of this law, registering it on first sight."""
        key = canonical(law)
        for record in self.laws.values():
            if canonical(record.law) == key:
                return record.law_id
        law_id = f"L{len(self.laws) + 1}"
        self.laws[law_id] = LawRecord(law_id, law)
        return law_id

    def judge(self, law_id: str, status: str, turn: int) -> None:
        record = self.laws[law_id]
        record.passes += status == "PASS"
        record.fails += status == "FAIL"
        record.last_turn = turn

    def theorem(self, theorem_id: str) -> Theorem | None:
        return next((t for t in self.theorems if t.theorem_id == theorem_id), None)

    def candidates(self) -> list[LawRecord]:
        """Laws that passed repeatedly, never failed, and belong to no theorem yet."""
        in_theorems = {law_id for t in self.theorems if t.status != "retracted" for law_id in t.law_ids}
        return [r for r in self.laws.values()
                if r.passes >= PASSES_FOR_CANDIDATE and r.fails == 0 and r.law_id not in in_theorems]

    def describe_candidates(self) -> str:
        return "; ".join(f"{r.law_id} (passed {r.passes}x) {canonical(r.law)[:160]}" for r in self.candidates()[:8])

    def theorems_json(self) -> str:
        return json.dumps([asdict(t) for t in self.theorems], sort_keys=True)

    def to_json(self) -> dict[str, Any]:
        return {"laws": [asdict(r) for r in self.laws.values()], "theorems": [asdict(t) for t in self.theorems],
                "negative_knowledge": self.negative_knowledge, "candidates_note": self.candidates_note,
                "last_compacted_turn": self.last_compacted_turn, "prior_note": self.prior_note,
                "prior_refuted": self.prior_refuted}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Knowledge:
        return cls(laws={r["law_id"]: LawRecord(**r) for r in data.get("laws", [])},
                   theorems=[Theorem(**t) for t in data.get("theorems", [])],
                   negative_knowledge=data.get("negative_knowledge", ""),
                   candidates_note=data.get("candidates_note", ""),
                   last_compacted_turn=data.get("last_compacted_turn", 0),
                   prior_note=data.get("prior_note", ""), prior_refuted=data.get("prior_refuted", []))


def theorems_from_json(text: str | None) -> list[Theorem]:
    return [Theorem(**t) for t in json.loads(text)] if text else []


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
