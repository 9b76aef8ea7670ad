"""The command-line options a bench declares in bench/registry.py, and what each value does.

An option's value either chooses the bench's load (`presets`: value -> the preset it names, as
`ahc bench serve --profile gpu-rate` or `ahc bench agents --engine emulated`) or goes to the bench's
`run(load, **options)` under the option's name. The command line renders them (ahc/cli/app.py); nothing
here imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class BadOptions(ValueError):
    """Options that do not go together (bad usage, exit 2), found before anything starts."""


@dataclass(frozen=True)
class Option:
    """`--NAME` ("_" as "-"): `kind` int, str, bool (a flag, default False) or pathlib.Path; `choices`
    limit a str; `repeat` takes it again and again (a list, None when never given)."""

    name: str
    help: str
    kind: type = str
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    repeat: bool = False
    presets: Mapping[str, str] = field(default_factory=dict)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def chosen_preset(options: tuple[Option, ...], values: Mapping[str, Any]) -> str | None:
    """The preset the given values choose, if any; two options choosing different ones is BadOptions."""
    chosen = {f"{o.flag} {values[o.name]}": o.presets[values[o.name]]
              for o in options if o.presets and values.get(o.name) in o.presets}
    if len(set(chosen.values())) > 1:
        raise BadOptions(" and ".join(f"{given} chooses the load {p!r}" for given, p in chosen.items()))
    return next(iter(chosen.values()), None)


def run_options(options: tuple[Option, ...], values: Mapping[str, Any]) -> dict[str, Any]:
    """The values that go to the bench's run(): every option's that does not choose a preset."""
    return {o.name: values.get(o.name, o.default) for o in options if not o.presets}
