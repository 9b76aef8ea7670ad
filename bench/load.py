"""A bench's loads: its named presets, and the one way the environment chooses among them and changes one.

Every bench's load is a frozen dataclass; `Loads` holds the bench's presets of it. `BENCH_<NAME>_LOAD`
(the bench's name upper-cased, "-" as "_": BENCH_AGENTS_LOAD, BENCH_LONG_SESSION_LOAD) reads
`[PRESET,]FIELD=VALUE,...`: the preset named (else the bench's default) with the fields named changed,
each value read as its field's type (int, float, str, bool, one of them or None as "none", or a tuple of
ints joined by "+"). So `BENCH_AGENTS_LOAD=smoke` runs the agents bench's small load,
`BENCH_AGENTS_LOAD="sessions=4,turns=3"` its default with fewer sessions and turns, and
`BENCH_ORCHESTRATOR_LOAD="smoke,model=smollm2-135m"` the small load on the real model. Every bench has a
`smoke` preset, the small load the tests run it at.

Standard library only: scripts/universe_gpu_check.py runs the universe bench where nothing is installed.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

L = TypeVar("L")

DEFAULT = "default"
SMOKE = "smoke"
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def env_name(bench: str) -> str:
    """The environment variable that holds `bench`'s load."""
    return f"BENCH_{bench.upper().replace('-', '_')}_LOAD"


@dataclass(frozen=True)
class Loads(Generic[L]):
    """`bench`'s loads by name; `default` names the one it runs when nothing chooses another."""

    bench: str
    presets: Mapping[str, L]
    default: str = DEFAULT

    def __post_init__(self) -> None:
        missing = {self.default, SMOKE} - self.presets.keys()
        if missing:
            raise ValueError(f"{self.bench}: no preset {', '.join(sorted(missing))}")

    @property
    def env(self) -> str:
        return env_name(self.bench)

    def from_env(self, preset: str | None = None, environ: Mapping[str, str] | None = None) -> L:
        """The load the environment gives (`preset`, chosen on the command line, instead of the default)."""
        return self.parse((os.environ if environ is None else environ).get(self.env), preset)

    def parse(self, spec: str | None, preset: str | None = None) -> L:
        """The load `spec` describes (see the module's docstring) over `preset` or the default; a preset
        named in `spec` other than `preset` is a ValueError, as is an unknown preset or field."""
        items = [item.strip() for item in (spec or "").split(",") if item.strip()]
        named = items.pop(0) if items and "=" not in items[0] else None
        if named and preset and named != preset:
            raise ValueError(f"{self.env}: names the load {named!r}, the command line chose {preset!r}")
        name = named or preset or self.default
        if name not in self.presets:
            raise ValueError(f"{self.env}: unknown load {name!r}; choose from {', '.join(self.presets)}")
        changes: dict[str, str] = {}
        for item in items:
            field, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"{self.env}: {item!r} is not FIELD=VALUE (only the first item names a load)")
            changes[field.strip()] = value.strip()
        return self.changed(self.presets[name], changes)

    def changed(self, load: L, changes: Mapping[str, Any]) -> L:
        """`load` with the fields in `changes` set, values given as text read as the field's type."""
        if not changes:
            return load
        hints = typing.get_type_hints(type(load))
        fields = [f.name for f in dataclasses.fields(load)]  # type: ignore[arg-type]
        values = {}
        for name, value in changes.items():
            if name not in fields:
                raise ValueError(f"{self.env}: unknown field {name!r}; choose from {', '.join(fields)}")
            values[name] = read(value, hints[name], f"{self.env}: {name}") if isinstance(value, str) else value
        try:
            return dataclasses.replace(load, **values)  # type: ignore[type-var]
        except ValueError as exc:  # the load's own checks
            raise ValueError(f"{self.env}: {exc}") from None


def read(text: str, kind: Any, where: str) -> Any:
    """`text` as a value of the type `kind`; a ValueError naming `where` if it is not one."""
    options = typing.get_args(kind) if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union \
        else (kind,)
    if type(None) in options and text.lower() == "none":
        return None
    kind = next(option for option in options if option is not type(None))
    try:
        if kind is bool:
            if text.lower() not in TRUE + FALSE:
                raise ValueError(text)
            return text.lower() in TRUE
        if typing.get_origin(kind) is tuple:
            return tuple(read(part, typing.get_args(kind)[0], where) for part in text.split("+") if part)
        return kind(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a {getattr(kind, '__name__', kind)}") from None
