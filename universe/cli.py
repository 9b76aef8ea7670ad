"""`ahc universe` subcommands (filled by the universe issue)."""

import typer

app = typer.Typer(no_args_is_help=True, help="The universe commands.")
