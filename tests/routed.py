"""XDB's routers on a bare app behind the gateway, for a route's tests without the whole server: who calls
is the API key middleware's job there, here the tenant the test puts in `caller[0]`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from server.http.gateway import install_gateway
from server.tenancy.request_context import request_tenant
from server.tenancy.tenants import Tenant


@contextmanager
def routed(*routers: APIRouter, tenant: str = "default") -> Iterator[tuple[TestClient, list[Tenant]]]:
    """A client of `routers` and the one-item list holding its caller (replace the item to switch)."""
    app = FastAPI()
    install_gateway(app)
    for router in routers:
        app.include_router(router)
    caller = [Tenant(tenant)]
    app.dependency_overrides[request_tenant] = lambda: caller[0]
    with TestClient(app) as client:
        yield client, caller
