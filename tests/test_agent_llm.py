"""The llm policy end to end through the real server on the tiny random model. Its text is noise, so
these check plumbing: tool calls reach the tools (or come back as errors), the journal and the
interaction_log are written, a compaction happens at a small threshold, the server reports cached
prompt tokens, and a killed `ahc discover` resumes from its last completed turn."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.checkpoint import Checkpoint
from agent.loop import DiscoveryRun, RunConfig, run_id_for
from agent.policies.llm import LLMConfig, LLMPolicy
from agent.run_store import store_for
from universe import load_rule

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]
TURNS = 6


def test_llm_policy_runs_turns_end_to_end(server, tmp_path: Path, no_whitespace_bias: dict) -> None:
    config = LLMConfig(base_url=f"{server.base_url}/v1", api_key=server.api_key, tool_choice="required",
                       logit_bias=no_whitespace_bias, seed=7)
    policy = LLMPolicy(config)
    policy.connect()
    assert policy.prompt_size == "minimal" and policy.context_window == 2048
    run_id = run_id_for("kinetic", "llm", 0)
    store = store_for(server.base_url, server.api_key, tmp_path, run_id)
    assert store.kind == "http"  # the server's agent routes: its XDB holds the run's rows
    try:
        run = DiscoveryRun(RunConfig(tmp_path, max_turns=TURNS, compaction_tokens=150), load_rule("kinetic"),
                           policy, store)
        summary = run.run()
        assert summary["turns"] == TURNS and summary["policy"] == "llm" and not summary["solved"]
        assert summary["compactions"] >= 1

        # Every turn is in interaction_log: a tool's result, or the error the reply earned.
        rows = [r for r in store.interactions(run.run_id) if run.ckpt.valid_row(r)]
        turns = [json.loads(r["tool_call_json"])["turn"] for r in rows]
        assert sorted(set(turns)) == list(range(1, TURNS + 1))
        results = [json.loads(r["tool_result_json"]) for r in rows]
        assert all(isinstance(result, dict) and result for result in results)
        assert any("error" in result for result in results)  # noise makes mistakes; the run went on
        assert all(r["token_count"] > 0 for r in rows)

        # The compaction's snapshot: negative knowledge and the last condensed turn, in meta_knowledge.
        latest = store.meta_knowledge(run.run_id)
        assert latest["last_compacted_turn"] >= 1 and latest["negative_knowledge"]
        assert run.knowledge.last_compacted_turn == latest["last_compacted_turn"]

        # The prefix cache: identity and tool schemas are the same every turn.
        assert all(m.prompt_tokens for m in run.metrics)
        assert all(m.cached_tokens > 0 for m in run.metrics[1:])
        ratio = sum(m.cached_tokens for m in run.metrics) / sum(m.prompt_tokens for m in run.metrics)
        assert ratio > 0.3
        report = (run.run_dir / "report.md").read_text()
        assert "cache hit ratio" in report and (run.run_dir / "report.png").is_file()
        journal = Checkpoint.load(run.run_dir).journal
        assert journal and journal[-1]["turn"] == TURNS  # the most recent turn stays raw in tier 3
    finally:
        store.close()


def discover(server, data_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agent.cli", "--policy", "llm", "--rule", "kinetic",
            "--base-url", f"{server.base_url}/v1", "--api-key", server.api_key, "--data-dir", str(data_dir),
            "--tool-choice", "required", "--max-tokens", "48", "--json", *extra]


def test_a_killed_run_resumes_from_its_last_completed_turn(server, tmp_path: Path) -> None:
    run_dir = tmp_path / run_id_for("kinetic", "llm", 0)
    first = subprocess.Popen(discover(server, tmp_path, "--max-turns", "30"), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ckpt = _try_load(run_dir)
            if ckpt is not None and ckpt.turn >= 2:
                break
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)  # mid-run: likely inside turn 3's request or tools
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    killed_at = Checkpoint.load(run_dir).turn
    assert 2 <= killed_at < 30

    done = subprocess.run(discover(server, tmp_path, "--max-turns", str(killed_at + 2)), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["turns"] == killed_at + 2
    ckpt = Checkpoint.load(run_dir)
    assert ckpt.attempt == 2 and ckpt.turn_attempts == [1] * killed_at + [2, 2]
    # The resumed turns were logged, and the run's valid rows name each turn once or more, none twice
    # from different attempts.
    assert ckpt.store == "http"
    with server.http() as http:
        rows = http.get("/v1/xdb/interactions", params={"run_id": ckpt.run_id}).json()["data"]
    valid = [json.loads(r["tool_call_json"]) for r in rows if ckpt.valid_row(r)]
    assert sorted({c["turn"] for c in valid}) == list(range(1, killed_at + 3))
    assert all(c["attempt"] == ckpt.turn_attempts[c["turn"] - 1] for c in valid)


def _try_load(run_dir: Path) -> Checkpoint | None:
    try:
        return Checkpoint.load(run_dir)
    except ValueError:
        return None
