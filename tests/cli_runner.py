"""Run a typer command line in this process, answered as a finished subprocess would be.

A subprocess `ahc ...` pays torch/transformers/duckdb's imports again each time (seconds); the test worker
has them already. The exit code, stdout and stderr are the same ones the real process would give: typer's
`Exit(code)` is the exit status, and stderr is kept apart from stdout (click >= 8.2). tests/test_cli.py
keeps true subprocess runs, where the real process's exit is the point."""

from __future__ import annotations

import subprocess

import typer
from typer.testing import CliRunner


def invoke(app: typer.Typer, *args: str, prog_name: str = "ahc") -> subprocess.CompletedProcess[str]:
    """`app` run with `args`; an exception the command did not turn into an exit fails the test, as the
    real process's traceback would."""
    result = CliRunner().invoke(app, list(args), prog_name=prog_name, catch_exceptions=False)
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def ahc(*args: str) -> subprocess.CompletedProcess[str]:
    """`ahc ARGS...` in this process."""
    from ahc.cli.app import app

    return invoke(app, *args)
