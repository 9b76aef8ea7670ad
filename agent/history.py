"""The run's side of the history across runs (xdb/run_history.py): what the run writes as it goes (its
progress after every turn, under its strategy) and what it reads as it starts (what earlier runs on the
same rule refuted and retracted, into Karma as negative knowledge).

A strategy is the policy and its settings: `baseline`, or `llm:MODEL`; its JSON holds the settings and
the experiment-design choices the run made (for the baseline, the periods ruled out and the ring
moduli), so two runs of one strategy can still be told apart by how they went about it.
"""

from __future__ import annotations

import json
from typing import Any

from agent.knowledge import Knowledge, canonical
from agent.policies.base import Policy
from agent.run_store import RunStore
from agent.turn_metrics import TurnMetrics
from xdb.run_history import Progress

PRIOR_LAWS = 8  # refuted laws named in the Karma note; every one is kept for the policy to skip


def strategy_of(policy: Policy) -> tuple[str, str]:
    """The strategy's label and its JSON (settings and design choices so far)."""
    config = getattr(policy, "config", None)
    model = getattr(config, "model", None) or getattr(policy, "model", None)
    settings: dict[str, Any] = {"policy": policy.name, "prompt_size": policy.prompt_size,
                                "context_window": policy.context_window}
    for key in ("model", "tool_choice", "temperature", "max_tokens"):
        if config is not None and hasattr(config, key):
            settings[key] = getattr(config, key)
    state = policy.to_json()
    design: dict[str, Any] = {k: state[k] for k in ("covered", "falsified", "verified") if k in state}
    if hasattr(policy, "first_modulus"):
        design["first_modulus"] = policy.first_modulus
    label = f"{policy.name}:{model}" if model else policy.name
    return label, json.dumps({"settings": settings, "design": design}, sort_keys=True, default=str)


def progress_of(rule: str, policy: Policy, status: str, turns: int, knowledge: Knowledge,
                metrics: list[TurnMetrics]) -> Progress:
    label, settings = strategy_of(policy)
    laws = knowledge.laws.values()
    return Progress(rule=rule, strategy=label, strategy_json=settings, status=status, turns=turns,
                    tokens=sum(m.prompt_tokens or 0 for m in metrics), laws_tried=len(knowledge.laws),
                    laws_passed=sum(1 for r in laws if r.passes and not r.fails),
                    laws_failed=sum(1 for r in laws if r.fails),
                    theorems_stored=len(knowledge.theorems),
                    theorems_retracted=sum(1 for t in knowledge.theorems if t.status == "retracted"),
                    wall_s=round(sum(m.wall_s for m in metrics), 3))


def read_prior(store: RunStore, rule: str, knowledge: Knowledge) -> None:
    """Earlier runs' refuted laws and retracted theorems on `rule` into `knowledge`'s prior note."""
    history = store.history(rule=rule)
    failed = history["failed_laws"]
    knowledge.prior_refuted = sorted({canonical(f["law"]) for f in failed})
    parts = []
    for f in failed[:PRIOR_LAWS]:
        name = f["law"].get("name") if isinstance(f["law"], dict) else None
        parts.append(f"{name or canonical(f['law'])[:120]} (FAIL x{f['fails']} in {f['runs']} run(s))")
    for t in history["retracted_theorems"]:
        theorem = json.loads(t["theorem_json"])
        parts.append(f"theorem '{theorem.get('name', t['theorem_id'])}' retracted: {t['reason'] or 'no reason given'}")
    knowledge.prior_note = "; ".join(parts)
