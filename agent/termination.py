"""When a run ends: the submitted theory reproduced 5,000 random states exactly and its table is
complete; or the turn budget is spent; or the policy has nothing left to try."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    done: bool
    solved: bool
    reason: str


def judge(turn: int, max_turns: int, submissions: list[dict[str, Any]], stuck: bool = False) -> Verdict:
    last = submissions[-1] if submissions else None
    if last and last.get("solved") and last.get("complete"):
        return Verdict(True, True, f"theory solved at turn {last['turn']}")
    if stuck:
        return Verdict(True, False, "the policy has no experiment left to try")
    if turn >= max_turns:
        return Verdict(True, False, f"turn budget of {max_turns} spent")
    return Verdict(False, False, "running")


def summary(rule: str, policy: str, verdict: Verdict, counters: dict[str, int], turns: int, compactions: int,
            submissions: list[dict[str, Any]], theory: list[str] | None) -> dict[str, Any]:
    """The run summary (`ahc discover --json`'s last line); its keys and their order are fixed, since
    scripts read it. `accuracy` is the last submit_theory's exact-match share of its 5,000 states (0.0
    if nothing was submitted); `theory` is the last submitted table, or the policy's current one if it
    never submitted."""
    last = submissions[-1] if submissions else None
    table = (last or {}).get("table") or theory or []
    return {"rule": rule, "policy": policy, "solved": bool(verdict.solved),
            "accuracy": float((last or {}).get("accuracy") or 0.0),
            "predictions_checked": counters["predictions_checked"], "experiments": counters["experiments"],
            "cells_observed": counters["cells_observed"], "turns": turns, "compactions": compactions,
            "theory": {"period": len(table), "table": list(table)}}
