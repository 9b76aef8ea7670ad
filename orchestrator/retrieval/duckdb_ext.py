"""Loading DuckDB's fts and vss extensions from their PyPI packages.

The `duckdb-extension-fts` / `-vss` wheels carry the signed extension binaries under
`<package>/extensions/v<duckdb version>/<name>.duckdb_extension` and no loader, and the server has no
network for `INSTALL`: we `LOAD` the file by path. The binaries load only into the DuckDB release they
were built for, hence the version in the path (and the pins in pyproject.toml).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import duckdb


def extension_path(name: str) -> Path:
    package = importlib.import_module(f"duckdb_extension_{name}")
    root = Path(package.__path__[0]) / "extensions"
    wanted = root / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if wanted.is_file():
        return wanted
    found = sorted(root.glob(f"v*/{name}.duckdb_extension"))
    raise RuntimeError(f"duckdb-extension-{name} has {[p.parent.name for p in found]} but DuckDB is "
                       f"v{duckdb.__version__}: install the matching duckdb-extension-{name}")


def load_extensions(con: duckdb.DuckDBPyConnection, names: tuple[str, ...] = ("fts", "vss")) -> None:
    for name in names:
        # A path literal cannot be a prepared parameter in LOAD; escape quotes for safety.
        con.execute(f"LOAD '{str(extension_path(name)).replace(chr(39), chr(39) * 2)}'")
