"""An empty data directory for a test, copied from one XDB.open made once per test process.

A new data directory's migrations take ~0.1 s of DuckDB DDL; copying the files they leave takes ~1 ms,
and the app tests open hundreds. Only for the fixtures that want an empty XDB to serve from: a test of
how a new file is created or migrated opens its own path with XDB.open."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

from xdb import XDB


@cache
def _template() -> Path:
    root = Path(tempfile.mkdtemp(prefix="ahc-empty-xdb-"))
    atexit.register(shutil.rmtree, root, True)
    XDB.open(root / "xdb").close()
    return root / "xdb"


def empty_xdb(data_dir: Path) -> XDB:
    """XDB.open(data_dir), an empty copy of the template put there first if nothing is (a data dir
    already there, as on a restart within a test, is opened as it is)."""
    if not data_dir.exists():
        shutil.copytree(_template(), data_dir)
    return XDB.open(data_dir)
