"""`ahc xdb` subcommands: recall (JSON lines), verify-audit, audit-records, backup, export and import, sessions
and their State versions, rollback, delete-session, bud-export (a ready bud's lens training file). Exit 0 on success,
1 with one stderr line naming what was wrong, 2 on bad usage."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from xdb.owner import EVERY
from xdb.session_state import list_sessions, state_versions
from xdb.tags import BUD_MIN_EXAMPLES

if TYPE_CHECKING:
    from xdb import XDB
    from xdb.audit.verify import AuditReport

app = typer.Typer(no_args_is_help=True, help="The xdb commands.")

DataDir = Annotated[Path, typer.Option("--data-dir", help="XDB directory (holds experience.duckdb).")]


def _fail(message: str, code: int = 1) -> None:
    typer.echo("error: " + " ".join(message.split()), err=True)
    raise typer.Exit(code)


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
    max_activation: Annotated[float | None, typer.Option(help="With --concept: its value at most this.")] = None,
    time_from: Annotated[str | None, typer.Option(help="Rows created from this ISO time (UTC if no offset).")
                         ] = None,
    time_to: Annotated[str | None, typer.Option(help="Rows created up to this ISO time.")] = None,
    after_id: Annotated[int | None, typer.Option(help="Rows after this id (the last one printed).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 100,
) -> None:
    """Print matching timesteps as JSON lines, oldest first."""
    from xdb import XDB

    filters = {k: v for k, v in dict(session_id=session_id, event_types=event_types, tags=tags, text=text,
                                     tick_from=tick_from, tick_to=tick_to, concept=concept,
                                     min_activation=min_activation, max_activation=max_activation,
                                     time_from=time_from, time_to=time_to, after_id=after_id,
                                     limit=limit).items() if v is not None}
    try:
        xdb = XDB.open(data_dir, read_only=True)
    except ValueError as exc:
        _fail(str(exc))
    try:
        rows = xdb.recall(filters, owner=EVERY)
    except ValueError as exc:
        _fail(str(exc))
    finally:
        xdb.close()
    for row in rows:
        typer.echo(json.dumps(row, ensure_ascii=False, sort_keys=True))


@app.command("verify-audit")
def verify_audit_command(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="XDB directory (holds experience.duckdb).")
                        ] = None,
    seq_from: Annotated[int | None, typer.Option(help="Verify from this record (via the nearest checkpoint).")] = None,
    seq_to: Annotated[int | None, typer.Option(help="Verify up to this record.")] = None,
    expect_head: Annotated[str | None, typer.Option(
        help="SEQ:HASH noted earlier (the log line or gauge): that record must still be on the chain "
             "with that hash.")] = None,
    lake_catalog: Annotated[str | None, typer.Option(
        "--lake-catalog", help="Also (or instead) verify every replica's chain in this DuckLake: its PostgreSQL "
                               "catalog, a libpq string such as 'dbname=ahc host=127.0.0.1 port=5433 user=ahc'.")
                            ] = None,
    lake_data_path: Annotated[Path | None, typer.Option(
        "--lake-data-path", help="With --lake-catalog: the lake's data path (default: the one its catalog names).")
                              ] = None,
    replica: Annotated[list[str] | None, typer.Option(
        "--replica", help="With --lake-catalog: NAME=DATA_DIR, a replica's own data directory; its lake chain "
                          "must match the head its audit log anchored there (repeatable).")] = None,
) -> None:
    """Check the audit log's hash chain and its anchor (audit/audit.head), and/or every replica's chain
    in a shared lake; exit 1 naming the first bad record or the head mismatch, 2 on bad usage."""
    from xdb.audit.chain import parse_head
    from xdb.audit.log import verify_audit

    if data_dir is None and lake_catalog is None:
        _fail("give --data-dir, --lake-catalog or both", 2)
    if (lake_data_path is not None or replica) and lake_catalog is None:
        _fail("--lake-data-path and --replica need --lake-catalog", 2)
    anchors = _replica_anchors(replica or [])
    if data_dir is not None and not data_dir.is_dir():
        _fail(f"--data-dir {data_dir} is not a directory", 2)
    if seq_from is not None and seq_to is not None and seq_from > seq_to:
        _fail("--seq-from must not be after --seq-to", 2)
    expected = None
    if expect_head is not None:
        try:
            expected = parse_head(expect_head)
        except ValueError as exc:
            _fail(f"--expect-head: {exc}", 2)
    if data_dir is not None:
        try:
            report = verify_audit(data_dir, seq_from, seq_to, expect_head=expected)
        except ValueError as exc:
            _fail(str(exc))
        if not report.ok:
            _fail(report.first_bad or "audit log is not intact")
        checked = _check_activations(data_dir, report, seq_from, seq_to)
        typer.echo(f"audit log intact: {report.records_checked} records verified")
        typer.echo(checked)
        for line in report.erased:
            typer.echo(f"deleted by policy: {line}")
    if lake_catalog is not None:
        _verify_lake(lake_catalog, lake_data_path, anchors)


@app.command("audit-records")
def audit_records_command(
    data_dir: DataDir,
    session_id: Annotated[str | None, typer.Option(help="Only this session (as stored: a tenant's with its prefix).")
                          ] = None,
    event_type: Annotated[str | None, typer.Option(help="Only this event type.")] = None,
    after_seq: Annotated[int, typer.Option(help="Records after this seq (the last one printed).")] = -1,
    limit: Annotated[int, typer.Option(help="At most this many records.")] = 100,
) -> None:
    """Print the audit log's records as JSON lines in chain order, their sealed content opened and a lens
    pack's hidden concepts (`hidden_activations`) shown: what an auditor reads (the server stopped)."""
    from xdb import store
    from xdb.audit.log import AuditLog

    try:
        audit = AuditLog.open(data_dir / store.AUDIT_FILE, read_only=True)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    try:
        rows = audit.records(session_id, event_type, None, None, after_seq, limit)
    finally:
        audit.close()
    for row in rows:
        typer.echo(json.dumps(row, ensure_ascii=False, sort_keys=True))


def _check_activations(data_dir: Path, report: AuditReport, seq_from: int | None, seq_to: int | None) -> str:
    """The experience file's activations against those the log committed (exit 1 naming the first changed
    row), or why they were not checked: a running server holds the file."""
    import duckdb

    from xdb import store
    from xdb.audit.log import AuditLog

    try:
        xdb = store.XDB.open(data_dir, read_only=True)
    except duckdb.IOException as exc:
        return f"activations not checked against the experience file (in use: {str(exc).splitlines()[0]})"
    try:
        audit = AuditLog.open(data_dir / store.AUDIT_FILE, read_only=True)
        try:
            with xdb.cursor() as cur:
                report = audit.check_activations(cur, report, seq_from, seq_to)
        finally:
            audit.close()
    finally:
        xdb.close()
    if not report.ok:
        _fail(report.first_bad or "the experience file's activations differ from the audit log's")
    return "activations in the experience file match the audit log"


def _replica_anchors(specs: list[str]) -> dict[str, list[tuple[int, bytes]]]:
    """`NAME=DATA_DIR` each: the heads that replica's audit log anchored (exit 2 on a bad one)."""
    from xdb.audit.chain import HEAD_FILE, read_heads

    anchors = {}
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not sep or not name or not directory:
            _fail(f"--replica {spec!r}: expected NAME=DATA_DIR", 2)
        try:
            heads = read_heads(Path(directory) / "audit" / HEAD_FILE)
        except ValueError as exc:
            _fail(f"--replica {name}: {exc}")
        if heads is None:
            _fail(f"--replica {name}: {directory} holds no audit/{HEAD_FILE}", 2)
        else:
            anchors[name] = heads
    return anchors


def _verify_lake(catalog: str, data_path: Path | None, anchors: dict[str, list[tuple[int, bytes]]]) -> None:
    import duckdb

    from xdb.lake.reads import check_lake_anchor, verify_lake_audit
    from xdb.lake.schema import attach_lake, redacted

    conn = duckdb.connect()
    try:
        try:
            attach_lake(conn, catalog, data_path, read_only=True)
            reports = verify_lake_audit(conn.cursor(), "lake")
            anchored = {name: check_lake_anchor(conn.cursor(), "lake", name, heads) for name, heads in anchors.items()}
        except (ValueError, duckdb.Error) as exc:
            _fail(redacted(str(exc)))
    finally:
        conn.close()
    bad = [report.first_bad or f"replica {name!r}: not intact" for name, report in reports.items() if not report.ok]
    bad += [report.first_bad or f"replica {name!r}: not anchored" for name, report in anchored.items()
            if not report.ok and reports.get(name, report).ok]
    for name, report in reports.items():
        if report.ok:
            how = "anchored to its own audit head" if name in anchored else \
                "unanchored: give --replica NAME=DATA_DIR to check it against the replica's own audit head"
            typer.echo(f"lake audit chain of replica {name!r} intact: {report.records_checked} records verified "
                       f"({how})")
    if bad:
        _fail("; ".join(bad))
    if not reports:
        typer.echo("lake holds no audit records")


@app.command("backup")
def backup_command(
    data_dir: DataDir,
    out: Annotated[Path, typer.Option("--out", help="A new (or empty) directory for the copy.")],
) -> None:
    """Copy a stopped server's XDB into OUT, consistently (a running server is backed up with
    `kill -USR1 PID` or scripts/backup.sh instead: it holds the files)."""
    from xdb import XDB

    if not data_dir.is_dir():
        _fail(f"--data-dir {data_dir} is not a directory", 2)
    try:
        with XDB.open(data_dir) as xdb:
            result = xdb.backup(out)
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(result))


@app.command("export")
def export_command(
    data_dir: DataDir,
    out: Annotated[Path, typer.Option("--out", help="A new (or empty) directory for the export.")],
    session: Annotated[str | None, typer.Option("--session", help="Only this session's rows.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only rows from this ISO time on (UTC if no offset).")
                     ] = None,
    fmt: Annotated[str, typer.Option("--format", help="parquet (partitioned by session) or jsonl.")] = "parquet",
) -> None:
    """Export a stopped server's XDB: each table's rows as Parquet (or JSON lines) partitioned by session,
    with manifest.json (row counts, SHA-256 per file, audit head). A running server exports with
    `POST /v1/xdb/exports` instead (it holds the files)."""
    from xdb import XDB

    if not data_dir.is_dir():
        _fail(f"--data-dir {data_dir} is not a directory", 2)
    if fmt not in ("parquet", "jsonl"):
        _fail(f"--format must be parquet or jsonl, not {fmt!r}", 2)
    try:
        with XDB.open(data_dir) as xdb:
            manifest = xdb.export(out, "parquet" if fmt == "parquet" else "jsonl", session_id=session, since=since,
                                  owner=EVERY)
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(json.dumps({key: manifest[key] for key in ("id", "path", "format", "rows", "audit_head")}))


@app.command("import")
def import_command(
    data_dir: DataDir,
    src: Annotated[Path, typer.Option("--from", help="An export directory (with manifest.json).")],
) -> None:
    """Load an export into a new (or empty) XDB, checking every file's SHA-256 first."""
    from xdb import XDB

    if not (src / "manifest.json").is_file():
        _fail(f"--from {src} is not an XDB export (no manifest.json)", 2)
    try:
        result = XDB.import_export(data_dir, src)
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(result))


Session = Annotated[str, typer.Option("--session", help="The session's id.")]


def _with_xdb(data_dir: Path, action: Callable[[XDB], object]) -> None:
    """Run `action` on a stopped server's XDB and print its result as JSON (exit 1 naming a failure)."""
    from xdb import XDB

    if not data_dir.is_dir():
        _fail(f"--data-dir {data_dir} is not a directory", 2)
    try:
        with XDB.open(data_dir) as xdb:
            result = action(xdb)
    except (ValueError, LookupError) as exc:
        _fail(str(exc.args[0]) if exc.args else str(exc))
    typer.echo(json.dumps(result))


@app.command("sessions")
def sessions_command(data_dir: DataDir,
                     limit: Annotated[int, typer.Option(help="At most this many.", min=1)] = 100) -> None:
    """List sessions: last tick, stored State versions. (A running server: GET /v1/context/sessions.)"""
    _with_xdb(data_dir, lambda xdb: xdb.read(list_sessions, EVERY, limit=limit))


@app.command("session-versions")
def session_versions_command(data_dir: DataDir, session: Session) -> None:
    """A session's stored State versions, each with whether its bytes still match its SHA-256."""
    _with_xdb(data_dir, lambda xdb: xdb.read(state_versions, session))


@app.command("rollback")
def rollback_command(data_dir: DataDir, session: Session,
                     version: Annotated[int, typer.Option(help="The version to restore.", min=1)]) -> None:
    """Store an earlier State version again as the session's newest: its next turn continues from it."""
    _with_xdb(data_dir, lambda xdb: xdb.rollback_session(session, version))


@app.command("vacuum")
def vacuum_command(data_dir: DataDir) -> None:
    """Rewrite a stopped server's experience file whole, so deleted sessions' rows leave its free blocks
    too (needs room for a second copy of the file)."""
    from xdb.storage.vacuum import vacuum_experience

    if not data_dir.is_dir():
        _fail(f"--data-dir {data_dir} is not a directory", 2)
    try:
        result = vacuum_experience(data_dir)
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(result))


@app.command("delete-session")
def delete_session_command(data_dir: DataDir, session: Session) -> None:
    """Delete every row of a session (an audit event)."""
    _with_xdb(data_dir, lambda xdb: xdb.delete_session(session))


@app.command("bud-export")
def bud_export_command(
    data_dir: DataDir,
    bud: Annotated[str, typer.Argument(help="The bud's name.")],
    out: Annotated[Path, typer.Option("--out", help="The training file to write (JSON).")],
    min_examples: Annotated[int, typer.Option(help="Example texts it needs at least (xdb.bud_min_examples).",
                                              min=1)] = BUD_MIN_EXAMPLES,
) -> None:
    """Write a ready bud's examples, against replies it does not tag, as a training file for
    `ahc lens train --examples` (a stopped server's XDB; a running one: GET /v1/xdb/buds/{tag}/examples)."""
    from xdb import XDB
    from xdb.bud_export import bud_training_file

    if not data_dir.is_dir():
        _fail(f"--data-dir {data_dir} is not a directory", 2)
    try:
        with XDB.open(data_dir, read_only=True) as xdb:
            training = xdb.read(bud_training_file, bud, min_examples)
        out.write_text(json.dumps(training, ensure_ascii=False, indent=1))
    except (ValueError, LookupError, OSError) as exc:
        _fail(str(exc))
    sizes = ", ".join(f"{c['id']} {len(c['examples'])}+{len(c['heldout'])}" for c in training["concepts"])
    typer.echo(f"{out} ({sizes} examples+heldout)")
