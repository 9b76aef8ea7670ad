"""XDB's files are every tenant's prompts and replies: their directories are 0700 and the files this
process writes 0600, whatever the umask, so no other local user reads them. DuckDB's write-ahead logs,
which it makes as it writes, take the umask's mode, inside those directories. A directory or file that
another user owns (a volume mounted in) is left as its owner set it."""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: Path) -> Path:
    """`path`, made with its parents if missing, readable by this user only."""
    path.mkdir(parents=True, exist_ok=True)
    _chmod(path, 0o700)
    return path


def private_files(*paths: Path) -> None:
    """Each file that exists, readable and writable by this user only."""
    for path in paths:
        if path.is_file():
            _chmod(path, 0o600)


def private_tree(root: Path) -> None:
    """Every directory under `root` (itself included) 0700, every file 0600: an export once written."""
    _chmod(root, 0o700)
    for path in root.rglob("*"):
        _chmod(path, 0o700 if path.is_dir() else 0o600)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a new or renamed name in it survives a crash only then) by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _chmod(path: Path, mode: int) -> None:
    if path.stat().st_uid == os.geteuid() and path.stat().st_mode & 0o777 != mode:
        path.chmod(mode)
