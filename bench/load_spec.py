"""A bench's load changed by an environment variable: "sessions=4,turns=3" sets those fields of its
frozen load dataclass (the bench command takes no per-bench options)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

Load = TypeVar("Load")


def overridden(load: Load, spec: str | None, env: str) -> Load:
    """`load` with the fields named in `spec` changed, each parsed as its default's type; an unknown
    field is a ValueError naming `env` and the fields there are."""
    if not spec:
        return load
    types = {f.name: type(getattr(load, f.name)) for f in dataclasses.fields(load)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for item in spec.split(","):
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in types:
            raise ValueError(f"{env}: unknown field {name!r}; choose from {', '.join(types)}")
        changes[name] = types[name](value.strip())
    return dataclasses.replace(load, **changes)  # type: ignore[type-var]
