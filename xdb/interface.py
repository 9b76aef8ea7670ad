"""Which of XDB's methods the XDB service serves across the process boundary, marked on the method.

`XDB` (xdb/store.py) is the one interface: a method the server may call in the service process carries
`@service`, or `@service_after_flush` when it must see every row submitted before it (the in-process
writer's rows are committed by then; the remote writer's are flushed first). The service accepts
exactly the marked methods and `RemoteXDB` forwards exactly them, so a new XDB method is one edit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

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
