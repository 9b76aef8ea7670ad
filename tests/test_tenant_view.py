"""The tenant's view of XDB (server/tenancy/tenant_xdb.py): every read and write of XDB's that takes a
tenant's id is in it or named as the server's own, every id a declared call takes is scoped in, and
what comes back is the tenant's alone, named as it named it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import xdb
from core.errors import NotFound
from server.tenancy.scoped_call import SCOPES, ScopedCall
from server.tenancy.tenant_xdb import SERVER_ONLY, TENANT_PARAMETERS, WRITTEN_OUT, TenantXDB
from server.tenancy.tenants import Tenant
from xdb import XDB, RecallFilters, TimestepRow
from xdb.interface import ENTRY, service_methods


def xdb_calls() -> dict[str, Callable[..., Any]]:
    """Every `@reads` / `@writes` function of XDB's modules and every method XDB serves, by name."""
    found: dict[str, Callable[..., Any]] = {}
    for info in pkgutil.walk_packages(xdb.__path__, "xdb."):
        module = importlib.import_module(info.name)
        for name, fn in vars(module).items():
            if callable(fn) and getattr(fn, ENTRY, None) and fn.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = fn
    found.update({f"XDB.{name}": getattr(XDB, name) for name in service_methods(XDB)})
    return found


def declared() -> dict[str, ScopedCall]:
    return {name: call for name, call in vars(TenantXDB).items() if isinstance(call, ScopedCall)}


def test_every_call_that_takes_a_tenants_id_is_in_the_view_or_the_servers_own() -> None:
    calls = xdb_calls()
    taking = {name for name, fn in calls.items() if TENANT_PARAMETERS & set(inspect.signature(fn).parameters)}
    in_view = {name for name, fn in calls.items() if any(c.fn is fn for c in declared().values())}
    forgotten = taking - in_view - WRITTEN_OUT - set(SERVER_ONLY)
    assert not forgotten, f"XDB calls that take a tenant's id, in no list of server/tenancy/tenant_xdb.py: {forgotten}"
    stale = (WRITTEN_OUT | set(SERVER_ONLY)) - taking
    assert not stale, f"named in tenant_xdb.py's lists but no call of XDB's that takes a tenant's id: {stale}"
    assert len(in_view) == len(declared()) >= 30


@pytest.mark.parametrize("name", sorted(declared()))
def test_a_declared_call_scopes_every_id_its_target_takes_and_fills_in_the_owner(name: str) -> None:
    call = declared()[name]
    taken = {p.name for p in call.target_parameters}
    assert set(call.scopes) == set(SCOPES) & taken
    assert "owner" not in call.signature.parameters and call.takes_owner() == ("owner" in taken)


def test_each_tenant_reads_and_pins_only_its_own_sessions_named_as_it_names_them(tmp_path: Path) -> None:
    alice, bob = Tenant("alice", True), Tenant("bob", True)
    with XDB.open(tmp_path / "x") as store:
        mine, theirs = TenantXDB(store, alice), TenantXDB(store, bob)
        for tenant in (alice, bob):
            store.writer.submit([TimestepRow(tenant.scope("s"), t, "input", "user", f"{tenant.name} {t}")
                                 for t in range(3)])
        store.writer.flush()
        page = mine.recall_page(RecallFilters(session_id="s"))
        assert [(r["session_id"], r["content"]) for r in page["data"]] == [("s", f"alice {t}") for t in range(3)]
        first = page["data"][0]["id"]
        assert mine.timestep(first)["session_id"] == "s"
        with pytest.raises(NotFound):
            theirs.timestep(first)
        pinned = mine.pin("s", 0, 1, reason="keep")
        assert pinned["session_id"] == "s"
        assert [w["session_id"] for w in mine.windows(None)] == ["s"] and theirs.windows(None) == []
        assert [w["session_id"] for w in mine.windows("s")] == ["s"] and theirs.windows("s") == []
        assert [r["content"] for r in theirs.recall_page(RecallFilters(session_id="s"))["data"]] == \
            [f"bob {t}" for t in range(3)]


def test_related_concepts_share_the_hierarchy_and_keep_each_tenants_co_activations(tmp_path: Path) -> None:
    alice, bob = Tenant("alice", True), Tenant("bob", True)
    with XDB.open(tmp_path / "x") as store:
        mine, theirs = TenantXDB(store, alice), TenantXDB(store, bob)
        store.writer.submit([TimestepRow(alice.scope("s"), t, "output", content="w",
                                         concept_activations={"joy": 0.9, "fear": 0.2}) for t in range(3)])
        store.writer.flush()
        store.register_concepts([{"id": "emotion", "name": "Emotion", "parent": None},
                                 {"id": "joy", "name": "Joy", "parent": "emotion"}])
        assert [(r["concept"], r["relation"]) for r in mine.related_concepts("joy", 10, "s")] == [
            ("emotion", "parent"), ("fear", "co_activated")]
        assert [(r["concept"], r["relation"]) for r in theirs.related_concepts("joy")] == [("emotion", "parent")]
        assert mine.related_concepts("joy", 10, None, "co_activated")[0]["together"] == 3
