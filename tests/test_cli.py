"""The `ahc` command line: exit 0 on success, 2 on bad usage, 1 with one stderr line on failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cli_runner
import pytest

AHC = str(Path(sys.executable).with_name("ahc"))


def ahc(*args: str) -> subprocess.CompletedProcess:
    """The real `ahc` process: its exit status and stderr line are what these tests are about."""
    return subprocess.run([AHC, *args], capture_output=True, text=True, timeout=120)


def ahc_here(*args: str) -> subprocess.CompletedProcess:
    """`ahc ARGS...` in this process (cli_runner): the same exit code and output without a cold start.
    The tests that use `ahc` above keep the real process's exit status and stderr covered."""
    return cli_runner.ahc(*args)


@pytest.mark.parametrize("command", [[], ["serve"], ["tiny-model"], ["bench"]])
def test_help_on_every_subcommand(command: list[str]) -> None:
    result = ahc_here(*command, "--help")
    assert result.returncode == 0
    assert "Usage" in result.stdout


@pytest.mark.process
def test_bad_usage_exits_2() -> None:
    assert ahc("no-such-command").returncode == 2
    assert ahc_here("tiny-model", "x", "--layers", "many").returncode == 2


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.process
def test_serve_without_a_model_exits_1_with_one_line(tmp_path: Path) -> None:
    assert "no model to serve" in one_error_line(ahc("serve"))


@pytest.mark.process
def test_missing_config_exits_1_with_one_line(tmp_path: Path) -> None:
    assert "no-such.yaml" in one_error_line(ahc("serve", "--config", str(tmp_path / "no-such.yaml")))


@pytest.mark.process
def test_invalid_config_exits_1_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("model: x\nengine:\n  max_model_len: -5\n  warp_drive: true\n")
    line = one_error_line(ahc("serve", "--config", str(config)))
    assert "max_model_len" in line or "warp_drive" in line


def test_bad_tiny_model_spec_exits_1(tmp_path: Path) -> None:
    assert "multiple of heads" in one_error_line(ahc_here("tiny-model", str(tmp_path / "m"), "--hidden", "100",
                                                           "--heads", "3"))


def test_unknown_bench_is_bad_usage() -> None:
    result = ahc_here("bench", "warp")
    assert result.returncode == 2 and "No such command 'warp'" in result.stderr


@pytest.mark.process
def test_a_bad_keys_file_exits_1_before_the_model_loads(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice a-key-without-a-colon\n")
    config = Path(__file__).parents[1] / "configs" / "cpu-tiny.yaml"
    line = one_error_line(ahc("serve", "--config", str(config), "--api-keys-file", str(keys),
                              "--data-dir", str(tmp_path / "xdb")))
    assert "line 1" in line and "tenant:key" in line
    assert not (tmp_path / "xdb").exists()  # nothing opened, nothing written


@pytest.mark.parametrize(("args", "problem"), [
    (["--replicas", "0"], "replicas must be 1 to 64"),
    (["--policy", "random"], "--policy must be consistent_hash or round_robin"),
    (["--port", "70000"], "port 70000 is not a usable port"),
])
@pytest.mark.process
def test_cluster_bad_options_exit_1_with_one_line(args: list[str], problem: str, tmp_path) -> None:
    # The real process: should the options pass by mistake, a cluster starts in it, not in this test worker.
    result = ahc("cluster", "--data-dir", str(tmp_path), *args)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and problem in result.stderr
    assert not (tmp_path / "catalog").exists(), "nothing started"
