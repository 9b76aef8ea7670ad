"""Plug-ins from other packages: Python entry points, each a zero-argument factory, loaded and checked once
when the orchestrator is built, so a broken one is reported then (logged, and named by any request or
configuration that asks for it) rather than failing a request with a 500."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """A group's plug-ins: those that loaded, by entry point name, and why each of the others did not."""

    plugins: dict[str, T] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)


def load_group(group: str, check: Callable[[str, object], T]) -> Loaded[T]:
    """Every entry point of `group`, in name order: loaded, its factory called, and what it made passed
    through `check(name, made)`, which returns it typed or raises ValueError saying what is wrong. The
    first distribution to declare a name keeps it, as Python's own lookup does."""
    loaded: Loaded[T] = Loaded()
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        if ep.name in loaded.plugins or ep.name in loaded.broken:
            continue
        try:
            made = ep.load()()
            loaded.plugins[ep.name] = check(ep.name, made)
        # A plug-in is another package's code: whatever its import or factory raises is this plug-in's
        # fault, recorded against its name and logged, and the server still starts without it.
        except Exception as exc:  # noqa: BLE001
            reason = f"{ep.value}: {type(exc).__name__}: {exc}"
            loaded.broken[ep.name] = reason
            log.error("%s plug-in %r failed to load: %s", group, ep.name, reason)
    return loaded


def check_methods(kind: str, name: str, made: object, methods: tuple[str, ...]) -> None:
    """`made` names itself `name` and has every one of `methods`; ValueError saying which is missing."""
    missing = [m for m in methods if not callable(getattr(made, m, None))]
    if missing:
        raise ValueError(f"the factory returned {type(made).__name__}, not a {kind} "
                         f"(no {', '.join(missing)} method)")
    own = getattr(made, "name", None)
    if own != name:
        # The render cache keys on the name: a plug-in calling itself another's name would share its texts.
        raise ValueError(f"the {kind} calls itself {own!r}; its entry point names it {name!r}")
