"""`ahc xdb` subcommands (filled by the xdb issue)."""

import typer

app = typer.Typer(no_args_is_help=True, help="The xdb commands.")
