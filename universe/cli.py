"""`ahc universe` subcommands: simulate a rule. (`ahc universe bench`, which measures the simulators, is
mounted on this app by ahc/cli/app.py: the measuring lives in bench/, which universe must not import.)"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="The universe commands.")


class Backend(str, Enum):
    auto = "auto"
    numpy = "numpy"
    numba = "numba"
    triton = "triton"


def _fail(exc: Exception) -> None:
    message = " ".join(str(exc).split()) or type(exc).__name__
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@app.command()
def simulate(
    state: Annotated[str, typer.Option(help="The initial state, e.g. 'A__B' (symbols _ABK, a ring).")],
    rule: Annotated[str, typer.Option(help="A bundled rule name or a rule file (JSON).")] = "kinetic",
    steps: Annotated[int, typer.Option(help="How many steps to advance.")] = 1,
    backend: Annotated[Backend, typer.Option(help="Simulator backend.")] = Backend.auto,
) -> None:
    """Print the trajectory, one state a line (the first line is the input)."""
    from universe import decode, load_rule
    from universe import simulate as run

    try:
        trajectory = run(state, load_rule(rule), steps, backend.value)
    except (ValueError, OSError) as exc:
        _fail(exc)
    for row in trajectory[:, 0]:
        typer.echo(decode(row))
