"""`ahc universe simulate|bench` and `ahc bench universe`: output and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cli_runner
import pytest
from bench_smoke import run_bench

AHC = str(Path(sys.executable).with_name("ahc"))


def ahc(*args: str) -> subprocess.CompletedProcess:
    """`ahc ARGS...` in this process (cli_runner): the same exit code and output, without a cold start's
    numpy/numba imports each time."""
    return cli_runner.ahc(*args)


def ahc_process(*args: str) -> subprocess.CompletedProcess:
    """The real `ahc` process, where its exit status and stderr are the point."""
    return subprocess.run([AHC, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", [["universe"], ["universe", "simulate"], ["universe", "bench"]])
def test_help(command: list[str]) -> None:
    result = ahc(*command, "--help")
    assert result.returncode == 0 and "Usage" in result.stdout


def test_simulate_prints_the_trajectory() -> None:
    result = ahc("universe", "simulate", "--rule", "kinetic", "--state", "A__B", "--steps", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["A__B", "_AB_", "_BA_", "B__A"]
    numpy = ahc("universe", "simulate", "--rule", "mirror2", "--state", "A_B_K__A", "--steps", "5",
                "--backend", "numpy")
    numba = ahc("universe", "simulate", "--rule", "mirror2", "--state", "A_B_K__A", "--steps", "5",
                "--backend", "numba")
    assert numpy.returncode == numba.returncode == 0 and numpy.stdout == numba.stdout
    assert len(numpy.stdout.splitlines()) == 6


@pytest.mark.parametrize("args, words", [
    (["--state", "A_X"], "'X' at cell 2"),
    (["--state", "A_B", "--steps", "-1"], "steps must be >= 0"),
    (["--state", "A_B", "--rule", "no-such"], "no-such"),
    (["--state", ""], "empty grid"),
])
@pytest.mark.process
def test_simulate_failures_exit_1_with_one_line(args: list[str], words: str) -> None:
    result = ahc_process("universe", "simulate", *args)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]


def test_simulate_bad_usage_exits_2() -> None:
    assert ahc("universe", "simulate").returncode == 2  # --state is required
    assert ahc("universe", "simulate", "--state", "A", "--backend", "gpu").returncode == 2


def test_bench_reports_both_backends_and_their_ratio() -> None:
    # Speed itself is shown by `make bench`, not asserted here (timed tests flake on noisy machines).
    from bench.universe import UniverseLoad, run

    report = run(UniverseLoad(grids=16, length=256, steps=8, rounds=1), ["numba"])
    figures = report.figures
    assert report.bench == "universe" and figures["numpy_cells_per_s"] > 0 and figures["numba_cells_per_s"] > 0
    assert report.ratios["numba_over_numpy"] == pytest.approx(
        figures["numba_cells_per_s"] / figures["numpy_cells_per_s"])


def test_universe_bench_prints_json() -> None:
    result = ahc("universe", "bench", "--backend", "numpy")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["bench"] == "universe" and report["figures"]["numpy_cells_per_s"] > 0
    assert "numba_cells_per_s" not in report["figures"]


@pytest.mark.process
def test_ahc_bench_universe_json_has_every_backend() -> None:
    report = run_bench("universe")
    figures = report["figures"]
    assert "triton_cells_per_s" in figures or "triton_interpret_cells_per_s" in figures
    assert report["ratios"]["numba_over_numpy"] == pytest.approx(
        figures["numba_cells_per_s"] / figures["numpy_cells_per_s"])
