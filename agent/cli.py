"""`ahc discover`: run the discovery agent and report how it did (the run summary).

Exit 0 when the run ends (solved or not: the summary says which), 2 on bad usage, 1 with one stderr
line when it cannot run (unknown rule, server unreachable, corrupt checkpoint). With `--json` the last
stdout line is the run summary. Mounted by ahc/cli/app.py as `app.command("discover")(discover)`; also
runnable alone as `python -m agent.cli`.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from agent.policies.base import Policy
    from agent.run_store import RunStore


class PolicyName(str, Enum):
    baseline = "baseline"
    llm = "llm"


class ToolChoice(str, Enum):
    auto = "auto"
    required = "required"


def discover(
    rule: Annotated[str, typer.Option(
        help="Bundled rule name (e.g. kinetic) or a rule file's path (the run is named by the file).")] = "kinetic",
    policy: Annotated[PolicyName, typer.Option(
        help="baseline (algorithmic) or llm (the model through the server).")] = PolicyName.baseline,
    base_url: Annotated[str, typer.Option(help="The server's OpenAI base URL (llm policy).")] = "http://127.0.0.1:8000/v1",
    api_key: Annotated[str | None, typer.Option(help="Bearer key for the server.", envvar="AHC_API_KEY")] = None,
    model: Annotated[str | None, typer.Option(help="Served model name (default: the server's first).")] = None,
    data_dir: Annotated[Path, typer.Option(
        help="Where runs keep their checkpoint, report and local XDB.")] = Path(".cache/runs"),
    max_turns: Annotated[int, typer.Option(min=1, help="Turn budget.")] = 50,
    json_output: Annotated[bool, typer.Option("--json", help="End with the run summary as one JSON line.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume/--fresh", help="Continue the run in --data-dir from its last completed turn, or start over.")] = True,
    compaction_tokens: Annotated[int | None, typer.Option(
        min=1, help="Tier-3 tokens before a compaction (default: a third of the window, at most 50k).")] = None,
    keep_turns: Annotated[int, typer.Option(
        min=0, help="The newest turns a compaction keeps verbatim, within a quarter of its threshold.")] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the harness's random states (and of the run id).")] = 0,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="Reply tokens per turn (llm).")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature (llm).")] = 0.7,
    tool_choice: Annotated[ToolChoice, typer.Option(
        help="auto, or required to force a tool call each turn (llm).")] = ToolChoice.auto,
) -> None:
    """Reverse-engineer a hidden universe: experiments through the harness tools until the submitted
    theory is exact or the turn budget is spent."""
    from agent.loop import DiscoveryRun, RunConfig, rule_label_for, run_id_for
    from agent.progress import Progress
    from universe.rule import load_rule

    try:
        hidden = load_rule(rule)
        label = rule_label_for(rule, hidden)
        run_id_for(label, policy.value, seed)  # a name that cannot name a run fails before anything starts
        chosen, store = _policy_and_store(policy, base_url, api_key, model, data_dir, max_tokens, temperature,
                                          tool_choice.value, seed, label)
        try:
            config = RunConfig(data_dir=data_dir, max_turns=max_turns, compaction_tokens=compaction_tokens,
                               keep_turns=keep_turns, seed=seed, fresh=not resume, rule_label=label)
            run = DiscoveryRun(config, hidden, chosen, store, Progress())
            summary = run.run()
        finally:
            store.close()
    except _expected_errors() as exc:
        _fail(str(exc) or type(exc).__name__)
    if json_output:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        verdict = "solved" if summary["solved"] else "not solved"
        typer.echo(f"{summary['rule']} / {summary['policy']}: {verdict}, accuracy {summary['accuracy']:.4f}, "
                   f"{summary['experiments']} experiments, {summary['turns']} turns, "
                   f"{summary['compactions']} compactions; report: {run.run_dir / 'report.md'}")


def _policy_and_store(policy: PolicyName, base_url: str, api_key: str | None, model: str | None, data_dir: Path,
                      max_tokens: int | None, temperature: float, tool_choice: str, seed: int,
                      rule: str) -> tuple[Policy, RunStore]:
    """The policy, and where its history goes: the server's XDB when it has the agent routes, else a
    local XDB under --data-dir (DuckDB allows one writing process per file)."""
    from agent.loop import run_id_for
    from agent.run_store import LocalRunStore, store_for

    if policy is PolicyName.baseline:
        from agent.policies.baseline import BaselinePolicy

        return BaselinePolicy(), LocalRunStore(data_dir / "xdb")
    from agent.policies.llm import LLMConfig, LLMPolicy  # openai is slow to import: only when needed

    chosen = LLMPolicy(LLMConfig(base_url=base_url, api_key=api_key, model=model, max_tokens=max_tokens,
                                 temperature=temperature, tool_choice=tool_choice, seed=seed))
    chosen.connect()
    root = base_url.rstrip("/").removesuffix("/v1")
    return chosen, store_for(root, api_key, data_dir, run_id_for(rule, chosen.name, seed))


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Failures that end the command with one line (bad rule, server or store trouble, a DuckDB
    file held by another process); anything else is a bug and keeps its traceback."""
    import duckdb
    import httpx
    import openai

    return (ValueError, OSError, RuntimeError, duckdb.Error, httpx.HTTPError, openai.APIError)


def _fail(message: str) -> None:
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(1)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(discover)

if __name__ == "__main__":
    app()
