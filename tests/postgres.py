"""PostgreSQL for the lake's tests: Debian's `postgresql`. Missing, a developer's run skips; CI fails, so CI
never passes by skipping. The fixtures `pg` and `lake` (tests/conftest.py makes them everyone's)."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from required import missing

from core.config import LakeConfig
from server.cluster.catalog import LocalPostgres, postgres_available

_names = itertools.count()


def require_postgres() -> None:
    if postgres_available():
        return
    message = ("PostgreSQL's initdb/pg_ctl/psql were not found (install the Debian package `postgresql`): "
               "the lake's tests need a real catalog")
    missing(message)


@pytest.fixture(scope="session")
def pg() -> Iterator[LocalPostgres]:
    """One PostgreSQL server a test session."""
    require_postgres()
    # As root the cluster runs as the `postgres` user, who cannot enter pytest's own (0700) temp dirs.
    directory = Path(tempfile.mkdtemp(prefix="ahc-test-pg-"))
    directory.chmod(0o755)
    server = LocalPostgres(directory).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def lake(pg: LocalPostgres, tmp_path: Path) -> LakeConfig:
    """A fresh lake (its own catalog database and data path) for each test; replica ids set per XDB."""
    dsn = pg.create_database(f"lake_{os.getpid()}_{next(_names)}")
    return LakeConfig(catalog=dsn, data_path=str(tmp_path / "lake-data"), ship_interval_s=0.1)
