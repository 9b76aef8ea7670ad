"""The documentation's reference pages, generated from the code they describe: the typed configuration, the
Prometheus registry the server builds, the routes of the app `ahc serve` builds and the `ahc` command line.
`docs/hooks/reference.py` adds them to the MkDocs site at build time; nothing here is written to disk, so a
reference page can never drift from the code or be edited by hand."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

if TYPE_CHECKING:
    from fastapi import FastAPI

GENERATED = "<!-- Generated from the code by ahc/docs_reference.py at build time: do not edit. -->\n\n"


# --- Markdown helpers --------------------------------------------------------------------------------------------

def cell(text: str) -> str:
    """`text` on one line of a Markdown table. Outside code spans, pipes are escaped and angle brackets made
    entities (Markdown would read them as HTML); inside one, a pipe is no cell separator and stays as it is."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return "`".join(parts)


def code(text: str) -> str:
    return f"`{text}`" if text else ""


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- Configuration -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigField:
    """One leaf of the configuration: its dotted YAML key, environment variable and what it is."""

    key: str
    env: str
    type: str
    default: str
    description: str


def type_name(annotation: Any) -> str:
    """An annotation as a reader writes it: `int | None`, `"pause" | "spill"`, `list[str]`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        inner = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def bounds(field: FieldInfo) -> str:
    """The field's numeric bounds (`> 0, <= 1`) and pattern, from its `Field(...)` constraints."""
    found = [f"{sign} {getattr(m, name)}" for m in field.metadata for name, sign in _BOUNDS.items()
             if getattr(m, name, None) is not None]
    found += [f"matches `{m.pattern}`" for m in field.metadata if getattr(m, "pattern", None)]
    return ", ".join(found)


def default_of(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return repr(field.default_factory())  # type: ignore[call-arg]
    return "" if field.default is PydanticUndefined else repr(field.default)


def config_fields(model: type[BaseModel], prefix: str = "") -> Iterator[ConfigField]:
    """Every leaf field of `model`, depth first, in declaration order; a section (a nested model) is
    descended into rather than listed."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from config_fields(annotation, f"{key}.")
            continue
        kind = type_name(annotation)
        limits = bounds(field)
        yield ConfigField(key=key, env="AHC_" + key.replace(".", "__").upper(),
                          type=f"{kind} ({limits})" if limits else kind, default=default_of(field),
                          description=field.description or "")


def sections(model: type[BaseModel]) -> Iterator[tuple[str, type[BaseModel]]]:
    """The model's nested sections, with their dotted keys (`xdb`, `xdb.retention`, ...)."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield name, annotation
            yield from ((f"{name}.{sub}", inner) for sub, inner in sections(annotation))


def configuration_page() -> str:
    from core.config import AHCConfig

    out = [GENERATED, "# Configuration\n\n",
           "Every setting of `ahc serve`, as the typed configuration (`core/config.py`) declares it. Each "
           "comes from, in order, its built-in default, the YAML file given with `--config FILE` (or a bundled "
           "example by name: `gpu`, `cpu-small`, `cpu-tiny`), its environment variable, then the command line "
           "(vLLM's flag of the same name, where there is one), each overriding the one before. An unknown key, "
           "variable or flag stops start-up with one line naming it.\n\n",
           "In YAML a dotted key is a nested mapping: `xdb.lake.catalog` is `xdb: {lake: {catalog: ...}}`. Its "
           "environment variable joins the parts with `__` after the prefix `AHC_` (case does not matter); a "
           "list or a mapping is given as JSON, except `api_key`, where a plain string is one key. The API key "
           "is also read from vLLM's `VLLM_API_KEY` (`AHC_API_KEY` wins), so it stays out of `ps`.\n\n"]
    top = [f for f in config_fields(AHCConfig) if "." not in f.key]
    out += ["## Server\n\n", AHCConfig.__doc__ or "", "\n\n", field_table(top)]
    for key, model in sections(AHCConfig):
        leaves = [f for f in config_fields(model, f"{key}.") if f.key.count(".") == key.count(".") + 1]
        out += [f"\n## `{key}`\n\n", " ".join((model.__doc__ or "").split()), "\n\n", field_table(leaves)]
    return "".join(out)


def field_table(fields: list[ConfigField]) -> str:
    return table(("key", "type", "default", "environment", "description"),
                 [(code(f.key), code(f.type), code(f.default), code(f.env), f.description) for f in fields])


# --- Metrics -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MetricSeries:
    """One metric family of the server's registry, named as `/metrics` exposes it."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


def metric_series() -> list[MetricSeries]:
    """Every family of the registry a fresh `AHCMetrics` builds, its labels read from the metric objects
    that registered it."""
    from prometheus_client.metrics import MetricWrapperBase

    from server.metrics import AHCMetrics

    metrics = AHCMetrics()
    labels = {m._name: tuple(m._labelnames) for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)}
    return [MetricSeries(name=f"{family.name}_total" if family.type == "counter" else family.name,
                         type=family.type, labels=labels.get(family.name, ()), help=family.documentation)
            for family in metrics.registry.collect()]


def metrics_page() -> str:
    out = [GENERATED, "# Metrics\n\n",
           "Every `ahc_*` series `GET /metrics` serves beside vLLM's own `vllm:*` series, read from the "
           "Prometheus registry the server builds. Each is labelled `model_name` (the served model), as vLLM "
           "labels its own; a histogram is exposed as its `_bucket`, `_sum` and `_count` series. What the "
           "series mean together, and the vLLM series the dashboard uses: [Metrics](../metrics.md).\n\n"]
    rows = [(code(s.name), s.type, ", ".join(code(label) for label in s.labels), s.help) for s in metric_series()]
    out.append(table(("series", "type", "labels", "help"), rows))
    return "".join(out)


# --- HTTP routes -------------------------------------------------------------------------------------------------

def build_app() -> FastAPI:
    """The app `ahc serve` builds (vLLM's OpenAI app with AHC's routes, its removals and its gateway), over a
    runtime whose parts are never called: building routes reads only their signatures, so no engine is
    started and no data directory opened."""
    from unittest.mock import NonCallableMagicMock

    from core.config import AHCConfig
    from server.app import build_app as build_server_app
    from server.engine_args import build_vllm_namespace

    config = AHCConfig(model="model")
    runtime = NonCallableMagicMock(name="runtime")
    runtime.config, runtime.keys = config, []
    return build_server_app(runtime, build_vllm_namespace(config), ("generate",), None)


@dataclass(frozen=True)
class MountedRoute:
    """A route of the app: its path, its methods, and whether the OpenAPI schema describes it."""

    path: str
    methods: tuple[str, ...]
    in_schema: bool
    name: str


def public_path(path: str) -> str:
    """A route's path as a client writes it (and the OpenAPI schema names it): `{path:path}` is `{path}`."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def mounted_routes(app: FastAPI) -> list[MountedRoute]:
    """The routes requests can reach, in the app's order: a route whose every method an earlier route on the
    same path answers (vLLM's own, behind AHC's installed ahead of it) is never reached and left out."""
    from starlette.routing import Mount

    out: list[MountedRoute] = []
    answered: set[tuple[str, str]] = set()
    for route in app.router.routes:
        path = public_path(getattr(route, "path", ""))
        if isinstance(route, Mount):
            out.append(MountedRoute(path=path, methods=("GET",), in_schema=False, name=route.name or path))
            continue
        methods = tuple(m for m in sorted(getattr(route, "methods", None) or ()) if m != "HEAD")
        if all((path, m) in answered for m in methods):
            continue
        answered.update((path, m) for m in methods)
        out.append(MountedRoute(path=path, methods=methods, name=getattr(route, "name", "") or "",
                                in_schema=bool(getattr(route, "include_in_schema", False))))
    return out


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def routes_page(app: FastAPI | None = None) -> str:
    from server.app import REMOVED_PATHS

    app = app or build_app()
    schema = app.openapi()
    served = mounted_routes(app)
    # A schema entry whose path and method a route outside the schema answers first (AHC's `/health`, ahead
    # of vLLM's) describes a route never reached: that route is listed with the others outside the schema.
    elsewhere = {(r.path, m) for r in served if not r.in_schema for m in r.methods}
    out = [GENERATED, "# HTTP routes\n\n",
           "Every route `ahc serve` mounts, read from the app it builds: vLLM's OpenAI-compatible server with "
           "AHC's routes installed ahead of vLLM's on the same paths, and the routes listed at the end taken "
           "out. Requests with a body must be `Content-Type: application/json`; with `--api-key`, every route "
           "but `/health`, `/metrics` and `/ping` needs the key (`Authorization: Bearer KEY` or "
           "`x-api-key: KEY`). Errors are in the shape of the API the request was sent to.\n\n",
           "## Described by the OpenAPI schema\n\n",
           "The running server serves this schema at `/openapi.json` (and pages for it at `/docs`).\n\n"]
    for path, operations in sorted(schema["paths"].items()):
        for method, operation in sorted(operations.items()):
            if (path, method.upper()) in elsewhere:
                continue
            out.append(f"### `{method.upper()} {path}`\n\n")
            what = _first_paragraph(operation.get("description") or "") or operation.get("summary", "")
            out.append(f"{cell(what)}\n\n")
            params = operation.get("parameters", [])
            if params:
                out.append(table(("parameter", "in", "required", "type", "description"), [
                    (code(p["name"]), p["in"], "yes" if p.get("required") else "no",
                     code(_schema_type(p.get("schema", {}))), p.get("description", "") or "")
                    for p in params]))
                out.append("\n")
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                out.append(f"Body: {code(_schema_type(body))}.\n\n")
    outside = [r for r in served if not r.in_schema]
    out += ["## Served outside the schema\n\n",
            "Probes, the experience browser, its static files, vLLM's own helpers that the schema leaves out, "
            "and the schema itself.\n\n",
            table(("path", "methods", "handler"), [(code(r.path), ", ".join(r.methods), code(r.name))
                                                   for r in outside]),
            "\n## Taken out of vLLM's server\n\n",
            "Routes vLLM mounts that `ahc serve` removes: they would run past AHC's chat handling (no sessions, "
            "governors or admission), or change, pause or stop the engine under it. They answer 404.\n\n",
            table(("path",), [(code(p),) for p in REMOVED_PATHS])]
    return "".join(out)


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " | ".join(_schema_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array[{_schema_type(schema.get('items', {}))}]"
    return str(schema.get("type", "any"))


# --- Command line ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CliCommand:
    """One command of `ahc`: its words, help and parameters (name, kind, type, default, help)."""

    words: str
    help: str
    params: tuple[tuple[str, str, str, str, str], ...]
    passes_extra: bool
    is_group: bool


def cli_commands() -> list[CliCommand]:
    """Every command and sub-command of the Typer app `ahc.cli.app:app`, depth first."""
    import typer

    from ahc.cli.app import app

    out: list[CliCommand] = []

    def walk(command: Any, words: str) -> None:
        params = tuple(_param(p) for p in command.params if not getattr(p, "hidden", False))
        subcommands = getattr(command, "commands", None)
        out.append(CliCommand(words=words, help=command.help or "", params=params,
                              passes_extra=bool((command.context_settings or {}).get("allow_extra_args")),
                              is_group=subcommands is not None))
        for name, sub in sorted((subcommands or {}).items()):
            if not getattr(sub, "hidden", False):
                walk(sub, f"{words} {name}")

    walk(typer.main.get_command(app), "ahc")
    return out


def _param(param: Any) -> tuple[str, str, str, str, str]:
    kind = param.param_type_name
    names = ", ".join([*param.opts, *param.secondary_opts]) if kind == "option" else param.name.upper()
    descriptor = getattr(param, "type_descriptor", None)
    annotation = descriptor.annotation if descriptor is not None else str
    default = param.default
    flag = kind == "option" and getattr(param, "is_flag", False) and default is False
    unset = default is None or callable(default) or type(default).__name__.endswith(("Sentinel", "Unset"))
    shown = "" if unset or flag else _value(default)
    if kind == "argument" and not param.required:
        shown = shown or "(optional)"
    return names, kind, _cli_type(annotation), shown, getattr(param, "help", None) or ""


def _cli_type(annotation: Any) -> str:
    """Choices for an Enum (the values a user types), else the annotation's name."""
    inner = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType) and len(inner) == 1:
        return _cli_type(inner[0]) + (" ..." if typing.get_origin(annotation) is list else "")
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(str(m.value) for m in annotation)
    return type_name(annotation)


def _value(default: Any) -> str:
    if isinstance(default, list | tuple):
        return " ".join(_value(d) for d in default)
    return str(default.value if isinstance(default, Enum) else default)


def cli_page() -> str:
    out = [GENERATED, "# Command line\n\n",
           "Every command of `ahc`, read from its Typer app (`ahc.cli.app:app`). Each answers `--help`. Exit "
           "codes: 0 success, 2 bad usage, 1 a failure, with one line on stderr naming what was wrong.\n\n"]
    for command in cli_commands():
        level = "#" * min(2 + command.words.count(" "), 4) if command.words != "ahc" else "##"
        out.append(f"{level} `{command.words}`\n\n")
        if command.help:
            out.append(_help_text(command.help) + "\n\n")
        if command.passes_extra:
            out.append("Options it does not know itself are passed on (to vLLM's own parser, for the server).\n\n")
        if command.params:
            out.append(table(("parameter", "kind", "type", "default", "help"),
                             [(code(n), k, code(t), code(d), h) for n, k, t, d, h in command.params]))
            out.append("\n")
    return "".join(out)


def _help_text(text: str) -> str:
    """A command's docstring as Markdown: its paragraphs kept, Typer's `\\b` (no re-wrap) markers dropped."""
    paragraphs = [" ".join(p.replace("\b", "").split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(cell(p).replace("\\|", "|") for p in paragraphs if p)


# --- The pages ---------------------------------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": configuration_page,
    "reference/metrics.md": metrics_page,
    "reference/http.md": routes_page,
    "reference/cli.md": cli_page,
}
