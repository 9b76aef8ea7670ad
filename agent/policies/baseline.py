"""The baseline experimenter: no model, just experiment design. It shows the information bound any
policy is compared to.

It tries periods 1, 2, 3, ... in order. A period is ruled out when the evidence shows one (class,
window) pair going to two symbols, or when its table fails verification. For the first period not
ruled out it either
  - designs a ring holding every (window, class) pair (agent/rings.py; modulus 6 first, covering
    periods 1, 2, 3 and 6 in one 384-cell ring) and asks run_prediction about it with a blank guess:
    the FAIL comes back with the true next state, i.e. one observation of every pair;
  - or, once the table is complete and consistent, verifies it with evaluate_laws (one law per
    class), stores it as a theorem and submits it.
So a rule of period 1, 2 or 3 takes two experiments: one ring, one verification. A table whose laws
an earlier run on the same rule saw FAIL (Knowledge.prior_refuted, agent/history.py) is ruled out
without verifying it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from math import lcm
from typing import Any

from agent.evidence import Evidence, TableView
from agent.journal import JournalEntry, ToolCall
from agent.knowledge import Knowledge
from agent.policies.base import Reply, TurnInput
from agent.rings import MAX_MODULUS, coverage_ring, design_modulus
from universe.harness import MAX_LAWS
from universe.symbols import SYMBOLS, window_string

FIRST_MODULUS = 6  # lcm(1, 2, 3): one ring answers periods 1-3


@dataclass
class BaselinePolicy:
    evidence: Evidence = field(default_factory=Evidence)
    first_modulus: int = FIRST_MODULUS
    name: str = "baseline"
    context_window: int | None = None
    prompt_size: str = "full"
    reply_tokens: int = 0
    covered: int = 1  # lcm of the moduli of the rings shown so far
    falsified: dict[int, str] = field(default_factory=dict)  # period -> why it was ruled out
    verified: dict[int, list[str]] = field(default_factory=dict)  # period -> law ids that passed
    stored: list[int] = field(default_factory=list)  # periods stored as theorems
    pending: dict[str, Any] = field(default_factory=dict)  # what the last turn's calls were for
    calls_made: int = 0

    def attach(self, evidence: Evidence) -> None:
        self.evidence = evidence

    def tools(self) -> list[dict[str, Any]]:
        return []

    # ---- deciding ------------------------------------------------------------------------------
    def decide(self, turn: TurnInput) -> Reply:
        period, view = self._candidate()
        if period is None:
            return Reply(note=f"No period up to {MAX_MODULUS} fits the evidence: {self._ruled_out()}.",
                         error="no candidate period left", stop=True)
        assert view is not None  # a period comes with its view
        if not view.complete:
            return self._design(period, view)
        table = view.table()
        if period not in self.verified:
            refuted = [law["name"] for law in table_laws(table) if turn.knowledge.refuted_before(law)]
            if refuted:  # an earlier run on this rule saw these very laws FAIL: no turn spent on them again
                self.falsified[period] = f"its laws ({', '.join(refuted)}) failed in an earlier run on this rule"
                return self.decide(turn)
            return self._verify(period, table)
        return self._conclude(period, table, turn.knowledge)

    def _candidate(self) -> tuple[int | None, TableView | None]:
        """The smallest period the evidence and the verifications have not ruled out."""
        for period in range(1, MAX_MODULUS + 1):
            if period in self.falsified:
                continue
            view = self.evidence.view(period)
            if view.consistent:
                return period, view
            if self.evidence.pairs:
                self.falsified[period] = f"{view.conflicts} (class, window) pairs seen going to two symbols"
        return None, None

    def _design(self, period: int, view: TableView) -> Reply:
        # The first ring covers several periods at once; later ones add the period still missing.
        covered = self.covered if self.evidence.pairs else lcm(self.covered, self.first_modulus)
        modulus = design_modulus(period, covered)
        ring = coverage_ring(modulus)
        self.covered = modulus
        self.pending = {"kind": "ring", "period": period, "modulus": modulus}
        note = (f"Hypothesis: period {period} (ruled out: {self._ruled_out() or 'none'}). The evidence covers "
                f"{view.coverage:.0%} of its (window, class) pairs. Experiment: a {len(ring)}-cell ring holding "
                f"every window at every phase mod {modulus}; a blank guess makes run_prediction show the truth.")
        return self._reply(note, [("run_prediction", {"state_t0": ring, "predicted_t1": "_" * len(ring)})])

    def _verify(self, period: int, table: list[str]) -> Reply:
        laws = table_laws(table)
        self.pending = {"kind": "verify", "period": period}
        note = (f"The evidence gives a complete, consistent table at period {period}. Conjecture: it is the "
                f"law. Refutation attempt: evaluate_laws on fresh random rings, one law per class.")
        calls = [("evaluate_laws", {"laws": laws[k:k + MAX_LAWS]}) for k in range(0, len(laws), MAX_LAWS)]
        return self._reply(note, calls)

    def _conclude(self, period: int, table: list[str], knowledge: Knowledge) -> Reply:
        calls: list[tuple[str, dict[str, Any]]] = []
        if period not in self.stored:
            calls.append(("store_theorem", {"name": f"transition table, period {period}",
                                            "law_ids": self.verified[period],
                                            "description": f"the next symbol of every (window, class) pair, "
                                                           f"{period} class(es): {json.dumps(table)}"}))
        calls.append(("submit_theory", {"table": table}))
        self.pending = {"kind": "submit", "period": period}
        note = f"Period {period} survived verification; storing it as a theorem and submitting the table."
        return self._reply(note, calls)

    def _reply(self, note: str, calls: list[tuple[str, dict[str, Any]]]) -> Reply:
        out = []
        for name, arguments in calls:
            self.calls_made += 1
            out.append(ToolCall(f"call-{self.calls_made}", name, json.dumps(arguments)))
        return Reply(note=note, calls=out)

    def _ruled_out(self) -> str:
        return ", ".join(f"{p} ({why})" for p, why in sorted(self.falsified.items()))

    # ---- learning from results -------------------------------------------------------------------
    def observe(self, entry: JournalEntry) -> None:
        period = self.pending.get("period")
        if period is None:  # nothing asked yet: every call decide() makes comes with a period
            return
        for call, result in zip(entry.calls, entry.results):
            if call.name == "evaluate_laws" and "error" in result:
                self.falsified[period] = f"its laws could not be judged: {result['error'][:120]}"
            elif call.name == "evaluate_laws":
                verdicts = result["results"]
                if all(v.get("status") == "PASS" for v in verdicts):
                    self.verified.setdefault(period, []).extend(v["law_id"] for v in verdicts if "law_id" in v)
                else:
                    failed = [v.get("name") for v in verdicts if v.get("status") != "PASS"]
                    self.falsified[period] = f"table failed evaluate_laws ({', '.join(map(str, failed))})"
                    self.verified.pop(period, None)
            elif call.name == "store_theorem" and "stored" in result:
                self.stored.append(period)
            elif call.name == "submit_theory" and "solved" in result and not result["solved"]:
                self.falsified[period] = f"submitted table scored {result.get('accuracy', 0):.3f}"
                self.verified.pop(period, None)

    def summarize(self, transcript: str, knowledge: Knowledge) -> str:
        """No model: the negative knowledge is the list of periods ruled out and why."""
        return f"Periods ruled out: {self._ruled_out()}." if self.falsified else "Nothing falsified yet."

    def theory(self) -> list[str] | None:
        """The best table so far: the candidate period's, unseen entries guessed blank."""
        period, view = self._candidate()
        return None if view is None or not self.evidence.pairs else view.table(unknown="_")

    def to_json(self) -> dict[str, Any]:
        return {"covered": self.covered, "falsified": {str(k): v for k, v in self.falsified.items()},
                "verified": {str(k): v for k, v in self.verified.items()}, "stored": self.stored,
                "pending": self.pending, "calls_made": self.calls_made}

    def load_json(self, data: dict[str, Any]) -> None:
        self.covered = data["covered"]
        self.falsified = {int(k): v for k, v in data["falsified"].items()}
        self.verified = {int(k): v for k, v in data["verified"].items()}
        self.stored, self.pending, self.calls_made = data["stored"], data["pending"], data["calls_made"]


def table_laws(table: list[str]) -> list[dict[str, Any]]:
    """One law per class: a cell of class c whose window is in W_s becomes s at t+1, for each s.
    The harness judges them on rings of many lengths, every (window, class) pair included."""
    period = len(table)
    laws = []
    for c, row in enumerate(table):
        rules = []
        for s in SYMBOLS:
            group = [j for j, out in enumerate(row) if out == s]
            if group:
                window_is = [{"op": "eq",
                              "args": [{"op": "neighbor_config"}, {"op": "window", "value": window_string(j)}]}
                             for j in group]
                rules.append({"op": "implies", "args": [_any(window_is), {"op": "eq", "args": [
                    {"op": "next", "expr": {"op": "cell"}}, {"op": "symbol", "value": s}]}]})
        in_class = {"op": "eq", "args": [{"op": "coordinate_class", "period": period}, c]}
        laws.append({"law": "holds", "name": f"class {c} of {period}",
                     "expr": {"op": "implies", "args": [in_class, {"op": "and", "args": rules}]}})
    return laws


def _any(terms: list[dict[str, Any]]) -> dict[str, Any]:
    """An `or` of any number of terms (the law language takes at most 16 per node)."""
    while len(terms) > 16:
        terms = [{"op": "or", "args": terms[k:k + 16]} if len(terms[k:k + 16]) > 1 else terms[k]
                 for k in range(0, len(terms), 16)]
    return {"op": "or", "args": terms}
