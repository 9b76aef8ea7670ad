"""XDB's files are every tenant's prompts and replies: under a umask of 022 (the usual one), the data
directory, its audit log, an export and a backup are still 0700 directories of 0600 files, and a keys
file other users can read is warned about."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.tenancy.tenants import TenantKeys
from xdb import XDB, TokenBatch
from xdb.owner import EVERY


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, str]:
    """Each path under `root` (itself too) whose mode is not private, with that mode (DuckDB's write-ahead
    logs, made by DuckDB as it writes, are inside the private directories)."""
    found = {}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.suffix == ".wal":
            continue
        if mode != (0o700 if path.is_dir() else 0o600):
            found[str(path.relative_to(root.parent))] = oct(mode)
    return found


def test_data_export_and_backup_are_private_whatever_the_umask(tmp_path: Path, umask_022: None) -> None:
    data = tmp_path / "xdb"
    with XDB.open(data) as xdb:
        ticks = xdb.next_ticks("s1", 3)
        assert xdb.writer is not None
        xdb.writer.submit(TokenBatch("s1", ticks, ["a", "b", "c"], token_ids=list(ticks), request_id="r1"))
        xdb.writer.flush()
        xdb.export(tmp_path / "export", owner=EVERY)
        xdb.backup(tmp_path / "backup")
        assert modes(data) == {}  # while open
    for root in (data, tmp_path / "export", tmp_path / "backup"):
        assert modes(root) == {}, root


@pytest.mark.process
def test_the_xdb_service_makes_even_duckdbs_write_ahead_logs_private(tmp_path: Path, umask_022: None) -> None:
    from core.config import XDBConfig
    from xdb import RemoteXDB

    data = tmp_path / "xdb"
    remote = RemoteXDB(data, XDBConfig())
    try:
        ticks = remote.next_ticks("s1", 3)
        remote.writer.submit(TokenBatch("s1", ticks, ["a", "b", "c"], token_ids=list(ticks), request_id="r1"))
        remote.writer.flush()
        logs = list(data.rglob("*.wal"))
        assert logs  # written, not yet checkpointed into their files
        assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in logs} == {str(p): "0o600" for p in logs}
    finally:
        remote.close()


def test_a_keys_file_others_can_read_is_warned_about(tmp_path: Path, umask_022: None,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice:sk-alice\nbob:sk-bob\n")
    with caplog.at_level(logging.WARNING, logger="ahc.tenants"):
        TenantKeys.build([], keys)
    assert "can be read by other users" in caplog.text
    caplog.clear()
    keys.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="ahc.tenants"):
        TenantKeys.build([], keys)
    assert caplog.text == ""
