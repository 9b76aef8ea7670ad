"""PostgreSQL for the lake's tests: Debian's `postgresql`. Missing, a developer's run skips; CI fails, so CI
never passes by skipping."""

from __future__ import annotations

import os

import pytest

from server.cluster.catalog import postgres_available


def require_postgres() -> None:
    if postgres_available():
        return
    message = ("PostgreSQL's initdb/pg_ctl/psql were not found (install the Debian package `postgresql`): "
               "the lake's tests need a real catalog")
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
