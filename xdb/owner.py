"""Whose rows a tenant reads: the *owner* string that every data-layer filter of a tenant takes.

A tenant's ids are stored as its prefix followed by the id it named ("alice/s1"); tenant names hold
no "/", so a prefix never starts another's. An owner is one of:
- `"name/"`: the ids that start with it (a named tenant's);
- `EVERY` (`""`): every id (the only tenant of a server: nothing there is anyone else's);
- `FLAT`: the ids with no "/" (the `default` tenant among others: its ids carry no prefix, and any
  id with a "/" may be another tenant's).
New ids are built with `build_prefix(owner)`: "" for the last two.
Every data-layer function that filters by owner takes it without a default, so a caller that forgets
its tenant's owner is a type error rather than a silent read of every tenant's rows.
"""

from __future__ import annotations

from typing import Any

FLAT = "/"
# The owner that reads every tenant's rows: for the only tenant of a server, operator tools and the CLI
# on a data directory. Named so that reaching past every tenant is a visible choice at the call site.
EVERY = ""


def build_prefix(owner: str) -> str:
    """The prefix the owner's new ids are stored with."""
    return "" if owner == FLAT else owner


def owns(owner: str, stored_id: str | None) -> bool:
    if stored_id is None:
        return False
    return "/" not in stored_id if owner == FLAT else stored_id.startswith(owner)


def owned(column: str, owner: str) -> tuple[str, list[Any]]:
    """A SQL condition (positional parameters) that `column` is one of the owner's ids, and its parameters."""
    if owner == FLAT:
        return f"NOT contains({column}, '/')", []
    return f"starts_with({column}, ?)", [owner]


def owned_named(column: str, param: str = "owner") -> str:
    """The same condition over a named parameter (`$owner`) holding the owner."""
    return f"(CASE WHEN ${param} = '{FLAT}' THEN NOT contains({column}, '/') ELSE starts_with({column}, ${param}) END)"
