"""`ahc xdb` subcommands: recall (JSON lines) and verify-audit. Exit 0 on success, 1 with one stderr
line naming what was wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="The xdb commands.")

DataDir = Annotated[Path, typer.Option("--data-dir", help="XDB directory (holds experience.duckdb).")]


def _fail(message: str) -> None:
    typer.echo("error: " + " ".join(message.split()), err=True)
    raise typer.Exit(1)


@app.command("recall")
def recall_command(
    data_dir: DataDir,
    session_id: Annotated[str | None, typer.Option(help="Only this session.")] = None,
    event_types: Annotated[str | None, typer.Option(help="Comma-separated event types.")] = None,
    tags: Annotated[str | None, typer.Option(help="Comma-separated tag names or ids (any of them).")] = None,
    text: Annotated[str | None, typer.Option(help="Content contains this text (case-insensitive).")] = None,
    tick_from: Annotated[int | None, typer.Option(help="Smallest tick.")] = None,
    tick_to: Annotated[int | None, typer.Option(help="Largest tick.")] = None,
    concept: Annotated[str | None, typer.Option(help="Rows where this concept is among the top-k.")] = None,
    min_activation: Annotated[float | None, typer.Option(help="With --concept: its value at least this.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 100,
) -> None:
    """Print matching timesteps as JSON lines, oldest first."""
    from xdb import XDB

    filters = {k: v for k, v in dict(session_id=session_id, event_types=event_types, tags=tags, text=text,
                                     tick_from=tick_from, tick_to=tick_to, concept=concept,
                                     min_activation=min_activation, limit=limit).items() if v is not None}
    try:
        xdb = XDB.open(data_dir, read_only=True)
    except ValueError as exc:
        _fail(str(exc))
    try:
        rows = xdb.recall(filters)
    except ValueError as exc:
        _fail(str(exc))
    finally:
        xdb.close()
    for row in rows:
        typer.echo(json.dumps(row, ensure_ascii=False, sort_keys=True))


@app.command("verify-audit")
def verify_audit_command(
    data_dir: DataDir,
    seq_from: Annotated[int | None, typer.Option(help="Verify from this record (via the nearest checkpoint).")] = None,
    seq_to: Annotated[int | None, typer.Option(help="Verify up to this record.")] = None,
) -> None:
    """Check the audit log's hash chain; exit 1 naming the first bad record."""
    from xdb.audit import verify_audit

    try:
        report = verify_audit(data_dir, seq_from, seq_to)
    except ValueError as exc:
        _fail(str(exc))
    if not report.ok:
        _fail(report.first_bad or "audit log is not intact")
    typer.echo(f"audit log intact: {report.records_checked} records verified")
