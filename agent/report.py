"""The end-of-run report in the run's directory: `report.md` (the summary, the theory, the turns)
with `report.png` (coverage and accuracy over turns, cache hit ratio per turn), and `summary.json`
(the run summary, the same JSON as `ahc discover --json`'s last line). agent/loop.py then saves
`report.png` to the run store too, so a UI on the server can show it (`/v1/xdb/runs/{run_id}/report.png`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.chart import chart
from agent.checkpoint import Checkpoint
from agent.knowledge import Knowledge
from agent.turn_metrics import TurnMetrics

COLORS = {"coverage": (46, 160, 67), "accuracy": (31, 111, 235), "cache hit": (245, 166, 35)}


def write_report(run_dir: Path, summary: dict[str, Any], metrics: list[TurnMetrics], knowledge: Knowledge,
                 ckpt: Checkpoint, reason: str) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(summary) + "\n")
    chart(run_dir / "report.png", [m.turn for m in metrics],
          lines={"coverage": ([m.coverage for m in metrics], COLORS["coverage"]),
                 "accuracy": ([m.accuracy for m in metrics], COLORS["accuracy"])},
          bars={"cache hit": ([m.hit_ratio for m in metrics], COLORS["cache hit"])})
    path = run_dir / "report.md"
    path.write_text(markdown(summary, metrics, knowledge, ckpt, reason))
    return path


def markdown(summary: dict[str, Any], metrics: list[TurnMetrics], knowledge: Knowledge, ckpt: Checkpoint,
             reason: str) -> str:
    prompt = sum(m.prompt_tokens or 0 for m in metrics)
    cached = sum(m.cached_tokens or 0 for m in metrics)
    hit = f"{cached / prompt:.1%} ({cached} of {prompt} prompt tokens)" if prompt else "n/a (no model requests)"
    wall = sum(m.wall_s for m in metrics)
    lines = [
        f"# Discovery run `{ckpt.run_id}`", "",
        f"Rule `{summary['rule']}`, policy `{summary['policy']}`: "
        f"**{'solved' if summary['solved'] else 'not solved'}** ({reason}).", "",
        "| figure | value |", "| --- | --- |",
        *(f"| {k} | {summary[k]} |" for k in ("accuracy", "experiments", "predictions_checked", "cells_observed",
                                              "turns", "compactions")),
        f"| cache hit ratio | {hit} |",
        f"| wall time of the turns | {wall:.1f} s |",
        f"| attempts (1 + resumes) | {ckpt.attempt} |",
        f"| store | {ckpt.store} |", "",
        "![coverage and accuracy over turns, cache hit ratio per turn](report.png)", "",
        "Coverage: share of the true table's (window, class) pairs the tools have shown. Accuracy: share of a "
        "fixed set of 512 random states the current theory steps exactly right. Cache hit: cached prompt "
        "tokens over prompt tokens, per request, from the server's usage report.", "",
        f"## Theory (period {summary['theory']['period']})", "",
        "```", *(summary["theory"]["table"] or ["(none)"]), "```", "",
    ]
    if knowledge.theorems:
        lines += ["## Theorems", ""]
        lines += [f"- {t.theorem_id} **{t.name}** ({t.status}, turn {t.turn}, laws {', '.join(t.law_ids)}): "
                  f"{t.description[:200]}" for t in knowledge.theorems]
        lines.append("")
    if knowledge.negative_knowledge:
        lines += ["## Negative knowledge (last compaction)", "", knowledge.negative_knowledge[:1500], ""]
    lines += ["## Turns", "",
              "| turn | tools | experiments | coverage | accuracy | cache hit | first changed block | s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m in metrics:
        hit_ratio = f"{m.hit_ratio:.0%}" if m.hit_ratio is not None else "-"
        lines.append(f"| {m.turn} | {', '.join(m.tools) or '(none)'} | {m.experiments} | {m.coverage:.1%} | "
                     f"{m.accuracy:.1%} | {hit_ratio} | {m.first_changed_block or '-'} | {m.wall_s:.2f} |")
    return "\n".join(lines) + "\n"
