"""XDB's interface, written once: what the XDB service serves across the process boundary, marked on
XDB's methods, and the generic read and write entry that runs the functions of XDB's modules.

`XDB` (xdb/store.py, with some of its methods in xdb/store_*.py) is the one interface: a method the
server may call in the service process carries `@service`, or `@service_after_flush` when it must see
every row submitted before it (the in-process writer's rows are committed by then; the remote writer's
are flushed first). The service accepts exactly the marked methods and `RemoteXDB` forwards exactly
them, so a new XDB method is one edit.

Most of what XDB stores is read or written by one function of its modules that takes a cursor
(`documents.list_documents(cur, ...)`). Such a function is marked `@reads` or `@writes` where it is
defined, and callers run it through `xdb.read(fn, ...)` / `xdb.write(fn, ...)` (datasette's
`execute_fn` / `execute_write_fn`); across the process boundary the function travels by reference,
and the service runs only marked ones. XDB keeps a method of its own only where it adds something
(its concept index, a lock, the configured limits, the lake, the writer's queue).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

import duckdb

Kind = Literal["call", "after_flush"]
F = TypeVar("F", bound=Callable[..., object])
MARK = "__xdb_service__"


def service(fn: F) -> F:
    """Served by the XDB service as it is."""
    setattr(fn, MARK, "call")
    return fn


def service_after_flush(fn: F) -> F:
    """Served by the XDB service once every row the caller submitted before is committed."""
    setattr(fn, MARK, "after_flush")
    return fn


def service_methods(cls: type) -> dict[str, Kind]:
    """The marked methods of `cls` (and its bases) by name, with how each is called."""
    found: dict[str, Kind] = {}
    for klass in reversed(cls.__mro__):
        for name, member in vars(klass).items():
            kind = getattr(member, MARK, None)
            if kind is not None:
                found[name] = kind
    return found


# -- the generic entry: a function of XDB's modules, run on a cursor of its own ----------------------
ENTRY = "__xdb_entry__"
Entry = Literal["read", "write"]
Cursor = duckdb.DuckDBPyConnection


def reads(fn: F) -> F:
    """A read function, `fn(cur, ...)`, that callers run through `XDB.read(fn, ...)`, in the service too."""
    setattr(fn, ENTRY, "read")
    return fn


def writes(fn: F) -> F:
    """A write function, `fn(cur, audit, ...)`, that callers run through `XDB.write(fn, ...)`: one at a time,
    given the audit log's event hook second (to chain what it deletes or rewrites; an append chains nothing)."""
    setattr(fn, ENTRY, "write")
    return fn


def check_entry(fn: Callable[..., object], entry: Entry) -> None:
    """Only functions marked for the entry run through it, so the service runs nothing else it is sent."""
    if getattr(fn, ENTRY, None) != entry:
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        raise TypeError(f"{name} is not marked @{'reads' if entry == 'read' else 'writes'} in xdb/")
