"""The baseline experimenter and the loop around it, without a model: experiment design, the bundled
rules solved in at most two experiments, the report, and `ahc discover`'s command line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import invoke

from agent import compaction
from agent.evidence import Evidence
from agent.journal import Journal, JournalEntry
from agent.loop import DiscoveryRun, RunConfig, run_id_for
from agent.policies.base import Reply, TurnInput
from agent.policies.baseline import BaselinePolicy, table_laws
from agent.rings import coverage_ring, pair_counts
from agent.run_store import LocalRunStore
from universe import Harness, bundled_rules, load_rule
from universe.rule import random_rule

REPO = Path(__file__).resolve().parents[1]
SUMMARY_KEYS = ["rule", "policy", "solved", "accuracy", "predictions_checked", "experiments", "cells_observed",
                "turns", "compactions", "theory"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = LocalRunStore(tmp_path_factory.mktemp("runs") / "xdb")
    yield store
    store.close()


def run_baseline(rule, data_dir: Path, store, **config) -> tuple[dict, DiscoveryRun]:
    run = DiscoveryRun(RunConfig(data_dir, **config), rule, BaselinePolicy(), store)
    return run.run(), run


@pytest.mark.parametrize("modulus", [1, 2, 3, 6, 64])
def test_coverage_ring_holds_every_window_at_every_phase_once(modulus: int) -> None:
    ring = coverage_ring(modulus)
    assert len(ring) == 64 * modulus
    assert (pair_counts(ring, modulus) == 1).all()


def test_one_128_cell_ring_learns_a_period_2_table() -> None:
    rule = load_rule("mirror2")
    ring = coverage_ring(2)
    result = Harness(rule).run_prediction(ring, "_" * len(ring))
    evidence = Evidence()
    evidence.add_result("run_prediction", {"state_t0": ring, "predicted_t1": "_" * 128}, result)
    assert not evidence.view(1).consistent  # the two classes differ: period 1 is ruled out
    view = evidence.view(2)
    assert view.complete and view.consistent and view.table() == list(rule.table)


@pytest.mark.parametrize("name", bundled_rules())
def test_baseline_solves_every_bundled_rule_in_two_experiments(name: str, tmp_path: Path, store) -> None:
    rule = load_rule(name)
    summary, run = run_baseline(rule, tmp_path, store)
    assert list(summary) == SUMMARY_KEYS
    assert summary["solved"] and summary["accuracy"] == 1.0
    assert summary["experiments"] <= 2
    assert summary["theory"] == {"period": rule.period, "table": list(rule.table)}
    # Formalised on the way: the verified table is a stored theorem, snapshotted in meta_knowledge.
    latest = store.meta_knowledge(run.run_id)
    assert json.loads(latest["theorems_json"])[0]["name"] == f"transition table, period {rule.period}"
    assert (run.run_dir / "report.md").read_text().count("solved") >= 1
    assert (run.run_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_baseline_finds_a_period_it_was_not_designed_for(tmp_path: Path, store) -> None:
    rule = random_rule(5, np.random.default_rng(5))
    summary, _ = run_baseline(rule, tmp_path, store, max_turns=12)
    assert summary["solved"] and summary["theory"]["period"] == 5


def test_a_wrong_table_fails_its_verification_laws() -> None:
    rule = load_rule("turnstile3")
    table = list(rule.table)
    table[1] = table[2][:5] + ("K" if table[1][5] != "K" else "A") + table[2][6:]
    verdicts = Harness(rule).evaluate_laws(table_laws(table))["results"]
    assert [v["status"] for v in verdicts] == ["PASS", "FAIL", "PASS"]


def test_turn_budget_ends_an_unsolved_run(tmp_path: Path, store) -> None:
    summary, run = run_baseline(load_rule("turnstile3"), tmp_path, store, max_turns=1)
    assert summary["turns"] == 1 and not summary["solved"] and summary["accuracy"] == 0.0
    assert summary["theory"]["period"] == 3  # its best guess so far, though never submitted
    # Resuming with a bigger budget continues from turn 2 and solves it.
    summary, run = run_baseline(load_rule("turnstile3"), tmp_path, store, max_turns=6)
    assert summary["solved"] and summary["turns"] == 3 and run.ckpt.turn_attempts == [1, 2, 2]


def test_compaction_moves_the_journal_into_negative_knowledge(tmp_path: Path, store) -> None:
    rule = random_rule(4, np.random.default_rng(4))
    summary, run = run_baseline(rule, tmp_path, store, compaction_tokens=50, max_turns=12)
    assert summary["solved"] and summary["compactions"] >= 1
    latest = store.meta_knowledge(run.run_id)
    assert latest["last_compacted_turn"] >= 1 and "Periods ruled out: 1" in latest["negative_knowledge"]


class Recording(BaselinePolicy):
    """The baseline, keeping every turn's input and every journal entry it is shown."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[TurnInput] = []
        self.entries: list[JournalEntry] = []

    def decide(self, turn: TurnInput) -> Reply:
        self.inputs.append(turn)
        return super().decide(turn)

    def observe(self, entry: JournalEntry) -> None:
        self.entries.append(entry)
        super().observe(entry)


def test_a_compaction_keeps_the_newest_turns_evidence_verbatim(tmp_path: Path, store) -> None:
    """The turn before a compaction, its experiment's result (the counterexample) included, is replayed
    whole into the fresh session after it, while older turns are condensed."""
    rule = random_rule(4, np.random.default_rng(4))
    policy = Recording()
    run = DiscoveryRun(RunConfig(tmp_path, compaction_tokens=2000, max_turns=12), rule, policy, store)
    run.run()
    assert run.ckpt.compactions >= 1
    # The first turn of the session a compaction opened (its id counts compactions) replays the journal.
    after = next(t for t in policy.inputs if t.context["session_id"].endswith("-c1"))
    before = next(e for e in policy.entries if e.turn == after.turn - 1)
    assert before.results, "the turn before the compaction ran an experiment"
    replayed = [m["content"] for m in after.messages if m["role"] == "tool"]
    assert before.result_text(0, run.journal.max_result_chars) in replayed
    assert after.messages[0]["content"] != policy.inputs[0].query  # the first turn was condensed, not replayed


def test_the_turns_kept_are_bounded_by_count_and_tokens() -> None:
    journal = Journal([JournalEntry(n, "x" * 300) for n in range(1, 21)], 800)  # 123 tokens a turn
    assert compaction.kept(journal, 12) == 12
    assert compaction.kept(journal, 12, keep_tokens=370) == 3
    assert compaction.kept(journal, 0) == 0
    assert compaction.kept(journal, 12, keep_tokens=0) == 1  # the newest turn stays whatever its size...
    assert compaction.kept(journal, 12, keep_tokens=0, at_least=0) == 0  # ...but when the window overflows
    # Not due while only kept turns are left to condense.
    assert not compaction.due(Journal(journal.entries[:3], 800), 100, None, None, 0, keep=12, keep_tokens=370)
    assert compaction.due(Journal(journal.entries[:5], 800), 100, None, None, 0, keep=12, keep_tokens=370)


def discover(*args: str) -> subprocess.CompletedProcess:
    """`python -m agent.cli ARGS...` in this process (cli_runner): the same exit code and output, without
    the cold start's imports."""
    from agent.cli import app

    return invoke(app, *args, prog_name="python -m agent.cli")


def discover_process(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real `python -m agent.cli` process, where its exit status and stderr are the point."""
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def test_discover_json_ends_with_the_summary(tmp_path: Path) -> None:
    done = discover("--rule", "kinetic", "--policy", "baseline", "--data-dir", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(summary) == SUMMARY_KEYS and summary["solved"] and summary["experiments"] == 2
    assert (tmp_path / "kinetic-baseline-seed0" / "report.md").is_file()


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/escaped", ".hidden", "a/b", "", "two words"])
def test_a_rule_name_that_is_not_a_plain_name_names_no_run(name: str, tmp_path: Path, store) -> None:
    rule = dataclasses.replace(load_rule("kinetic"), name=name) if name else load_rule("kinetic")
    with pytest.raises(ValueError, match="cannot name a run"):
        run_id_for(name, "baseline", 0)
    if name:
        data_dir = tmp_path / "a" / "b"
        with pytest.raises(ValueError, match="cannot name a run"):
            run_baseline(rule, data_dir, store)
        assert list(tmp_path.rglob("*")) == []  # nothing written, inside the data dir or out of it


def test_a_rule_file_names_its_run_by_its_stem(tmp_path: Path) -> None:
    rules, data_dir = tmp_path / "rules", tmp_path / "deep" / "runs"
    rules.mkdir()
    evil = dict(load_rule("kinetic").to_dict(), name="../../escaped")
    (rules / "evil.json").write_text(json.dumps(evil))
    (rules / ".hidden.json").write_text(json.dumps(evil))
    done = discover("--rule", str(rules / "evil.json"), "--data-dir", str(data_dir), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["solved"]
    assert (data_dir / "evil-baseline-seed0" / "report.md").is_file()
    assert not (tmp_path / "escaped-baseline-seed0").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "rules"]
    hidden = discover("--rule", str(rules / ".hidden.json"), "--data-dir", str(data_dir))
    assert hidden.returncode == 1 and "cannot name a run" in hidden.stderr


@pytest.mark.parametrize("args, code, message", [
    (["--rule", "no-such-rule"], 1, "no rule file or bundled rule named 'no-such-rule'"),
    (["--policy", "llm", "--base-url", "http://127.0.0.1:9/v1"], 1, "no model server at http://127.0.0.1:9/v1"),
    (["--policy", "oracle"], 2, "oracle"),
    (["--max-turns", "0"], 2, "max-turns"),
])
@pytest.mark.process
def test_discover_usage_and_failures(args: list[str], code: int, message: str, tmp_path: Path) -> None:
    done = discover_process(*args, "--data-dir", str(tmp_path))
    assert done.returncode == code
    assert message in done.stderr
    if code == 1:
        assert len(done.stderr.strip().splitlines()) == 1
