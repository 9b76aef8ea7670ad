"""One call into XDB as a tenant makes it, declared instead of written out: its target and how the ids
in what comes back are handed back as the tenant named them.

    class TenantXDB:
        document = ScopedCall(get_document, out=row("id"))

`view.document(doc_id, version=2)` then runs `xdb.read(get_document, tenant.scope(doc_id), version=2)`
and unscopes the row's `id`. A call's parameters are its target's, less the cursor (and the audit hook
of a write) and less `owner`, which the view fills in with the tenant's; a target is a function of XDB's
modules marked `@reads` or `@writes` (run through `xdb.read` / `xdb.write`) or the name of one of XDB's
methods. What is scoped goes by the parameter's name, as XDB names its ids everywhere (SCOPES): a
call cannot pass one of the tenant's ids unscoped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property, partial
from typing import Any, Protocol, overload

from server.tenancy.tenants import Tenant
from xdb import XDB, RecallFilters, XDBClient
from xdb.interface import ENTRY

OWNER = "owner"
# How a parameter's value is scoped in, and how a result's ids are handed back out (given the arguments
# as the tenant named them).
Scope = Callable[[Tenant, Any], Any]
Out = Callable[[Tenant, Any, Mapping[str, Any]], Any]


class View(Protocol):
    """What a call runs on: an XDB and the tenant it runs for."""

    @property
    def xdb(self) -> XDBClient: ...

    @property
    def tenant(self) -> Tenant: ...


def tenant_id(tenant: Tenant, local_id: str | None) -> str | None:
    """One of the tenant's ids (None stays None: every session, every run)."""
    return tenant.scope_opt(local_id)


def tenant_filters(tenant: Tenant, filters: RecallFilters) -> RecallFilters:
    """Recall's filters, their session the tenant's."""
    return filters.model_copy(update={"session_id": tenant.scope_opt(filters.session_id)})


# XDB's parameters that are one of the tenant's ids, stored under its prefix (`after`: a session id),
# or that hold one (recall's filters), and how each is scoped in.
SCOPES: dict[str, Scope] = {"session_id": tenant_id, "run_id": tenant_id, "doc_id": tenant_id, "after": tenant_id,
                            "filters": tenant_filters}


def as_is(tenant: Tenant, result: Any, named: Mapping[str, Any]) -> Any:
    """A result that names none of the tenant's ids (counts, a PNG, a version list)."""
    return result


def rows(key: str = "session_id") -> Out:
    """Rows, each with its `key` handed back as the tenant named it."""
    return lambda tenant, found, named: tenant.unscope_rows(found, key)


def row(key: str = "session_id") -> Out:
    """One row, its `key` handed back (`Tenant.unscope` refuses an id the tenant does not own: every
    lookup here is scoped, so that would be a bug, a 500)."""
    return lambda tenant, found, named: tenant.unscope_rows([found], key)[0]


def owned(key: str = "session_id") -> Out:
    """Rows of every tenant (a listing XDB does not filter by owner): the tenant's own, handed back."""
    return lambda tenant, found, named: tenant.unscope_rows((r for r in found if tenant.owns(r[key])), key)


def page(tenant: Tenant, found: dict[str, Any], named: Mapping[str, Any]) -> dict[str, Any]:
    """A page of recall: its rows handed back."""
    return {**found, "data": tenant.unscope_rows(found["data"], "session_id")}


def named_as_asked(key: str = "session_id") -> Out:
    """A result about the one id asked for, named by it as the tenant asked."""
    return lambda tenant, found, named: {**found, key: named[key]}


class ScopedCall:
    """A descriptor: on a view, the call; on the class, the declaration."""

    def __init__(self, target: Callable[..., Any] | str, *, out: Out = as_is) -> None:
        self.target, self.out = target, out
        self.fn: Callable[..., Any] = getattr(XDB, target) if isinstance(target, str) else target
        self.scopes = {name: SCOPES[name] for name in self.signature.parameters if name in SCOPES}

    @cached_property
    def entry(self) -> str | None:
        """'read' or 'write' for a function of XDB's modules (marked so); None for one of XDB's methods."""
        return None if isinstance(self.target, str) else str(getattr(self.target, ENTRY))

    @cached_property
    def target_parameters(self) -> list[inspect.Parameter]:
        """The target's parameters less what XDB passes itself (self, the cursor, a write's audit hook)."""
        skip = {None: 1, "read": 1, "write": 2}[self.entry]
        return list(inspect.signature(self.fn).parameters.values())[skip:]

    @cached_property
    def signature(self) -> inspect.Signature:
        """The call's signature as a view offers it: the target's, less `owner`."""
        return inspect.Signature([p for p in self.target_parameters if p.name != OWNER])

    def takes_owner(self) -> bool:
        return any(p.name == OWNER for p in self.target_parameters)

    @overload
    def __get__(self, view: None, cls: type) -> ScopedCall: ...

    @overload
    def __get__(self, view: View, cls: type) -> Callable[..., Any]: ...

    def __get__(self, view: View | None, cls: type) -> ScopedCall | Callable[..., Any]:
        return self if view is None else partial(self.call, view)

    def call(self, view: View, /, *args: Any, **kwargs: Any) -> Any:
        named = self.signature.bind(*args, **kwargs).arguments
        sent = {name: self.scopes[name](view.tenant, value) if name in self.scopes else value
                for name, value in named.items()}
        if self.takes_owner():
            sent[OWNER] = view.tenant.owner
        keywords = dict(_flattened(sent.items(), self.signature))
        if self.entry == "read":
            found = view.xdb.read(self.fn, **keywords)
        elif self.entry == "write":
            found = view.xdb.write(self.fn, **keywords)
        else:
            found = getattr(view.xdb, str(self.target))(**keywords)
        return self.out(view.tenant, found, named)


def _flattened(arguments: Iterable[tuple[str, Any]], signature: inspect.Signature) -> Iterable[tuple[str, Any]]:
    """Bound arguments as keywords, a `**fields` parameter's spread out."""
    for name, value in arguments:
        if name in signature.parameters and signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            yield from value.items()
        else:
            yield name, value
