"""A replica of a test's lake: its config, rows recorded in it, and the lake as a third replica sees it
(`lake_sql`, on a connection of the test's own, closed with the module by `close_observers`, which a test
module imports to use)."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from core.config import LakeConfig, XDBConfig
from xdb import XDB, TokenBatch
from xdb.lake.schema import attach_lake


def config(lake: LakeConfig, replica: str, **lake_fields: object) -> XDBConfig:
    return XDBConfig(backend="ducklake", lake=lake.model_copy(update={"replica_id": replica, **lake_fields}))


def record(xdb: XDB, session: str, n: int, text: str = "tok") -> range:
    ticks = xdb.next_ticks(session, n)
    xdb.writer.submit(TokenBatch(session, ticks, [f"{text}{t}" for t in ticks], token_ids=list(ticks),
                                 request_id=f"{session}-req"))
    xdb.writer.flush()
    return ticks



_observers: dict[str, duckdb.DuckDBPyConnection] = {}


def observer(lake: LakeConfig) -> duckdb.DuckDBPyConnection:
    """The test's own connection to the lake (a third replica's view), attached once per lake."""
    assert lake.catalog is not None
    if lake.catalog not in _observers:
        conn = duckdb.connect()
        attach_lake(conn, lake.catalog, lake.data_path)
        _observers[lake.catalog] = conn
    return _observers[lake.catalog]


def lake_sql(lake: LakeConfig, sql: str) -> list[tuple[object, ...]]:
    """Run SQL on the lake from the test's own connection (`observer`)."""
    with observer(lake).cursor() as cur:
        return cur.execute(sql).fetchall()


@pytest.fixture(autouse=True, scope="module")
def close_observers() -> Iterator[None]:
    yield
    for conn in _observers.values():
        conn.close()
    _observers.clear()
