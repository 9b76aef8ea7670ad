"""The shared DuckLake's trust: each replica's audit chain verified in the lake (a tampered row named, a
chain rewritten as a whole caught against the replica's own anchored head, an older lake given the
sealed audit's columns), and the catalog's access (passwords kept in private files, none in any DSN or
log), on a real PostgreSQL catalog (LocalPostgres)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import duckdb
import pytest
from lake_replica import close_observers, config, lake_sql, observer, record  # noqa: F401 - close_observers: a fixture
from postgres import require_postgres
from typer.testing import CliRunner

from core.config import LakeConfig
from server.cluster.catalog import LocalPostgres, postgres_bin
from xdb import XDB
from xdb.cli import app as xdb_cli
from xdb.lake.schema import attach_lake, redacted
from xdb.runs import purge_run


@pytest.mark.process
def test_verify_lake_audit_checks_every_chain_and_names_a_tampered_row(lake: LakeConfig, tmp_path: Path) -> None:
    with XDB.open(tmp_path / "a", config(lake, "A")) as a, XDB.open(tmp_path / "b", config(lake, "B")) as b:
        record(a, "sa", 20)
        a.write(purge_run, "nothing")  # an audit event record, shipped like the rest
        record(b, "sb", 10)
        b.lake_ship_now()
        reports = a.verify_lake_audit()
        assert reports["A"].ok and reports["A"].records_checked == 21
        assert reports["B"].ok and reports["B"].records_checked == 10

        lake_sql(lake, "UPDATE lake.audit_records SET content = 'rewritten' WHERE replica = 'A' AND seq = 3")
        reports = b.lake.verify_audit()  # type: ignore[union-attr]
        assert not reports["A"].ok and "replica 'A' audit record seq=3: hash mismatch" in str(reports["A"].first_bad)
        assert reports["B"].ok

    assert lake.catalog is not None
    result = CliRunner().invoke(xdb_cli, ["verify-audit", "--lake-catalog", lake.catalog])
    assert result.exit_code == 1 and "seq=3" in result.output and "replica 'B' intact: 10 records" in result.output
    lake_sql(lake, "DELETE FROM lake.audit_records WHERE replica = 'B' AND seq = 4")
    result = CliRunner().invoke(xdb_cli, ["verify-audit", "--lake-catalog", lake.catalog,
                                          "--data-dir", str(tmp_path / "b")])
    assert result.exit_code == 1 and "audit log intact: 10 records" in result.output
    assert "replica 'B' audit record seq=4: missing" in result.output


@pytest.mark.process
def test_a_lake_made_before_the_audit_was_sealed_gains_its_columns(lake: LakeConfig, tmp_path: Path) -> None:
    """A lake an earlier AHC made lacks the audit's key_id and sealed columns: a replica adds them when it
    attaches, ships its sealed records, and the lake's chain verifies."""
    lake_sql(lake, "ALTER TABLE lake.audit_records DROP COLUMN key_id")
    lake_sql(lake, "ALTER TABLE lake.audit_records DROP COLUMN sealed")
    with XDB.open(tmp_path / "a", config(lake, "A")) as a:
        record(a, "sa", 5, text="secret")
        a.lake_ship_now()
        assert a.verify_lake_audit()["A"].ok
    rows = lake_sql(lake, "SELECT key_id, sealed IS NOT NULL, content FROM lake.audit_records WHERE replica = 'A'")
    # sealed: every record under its key, the batch's content in one blob in its first record (audit v5)
    assert len(rows) == 5 and all(key is not None and content is None for key, _, content in rows)
    assert sum(has for _, has, _ in rows) == 1


# -- the catalog's access: passwords, private files, no password in any DSN or log -------------------------
def connects_without_password(server: LocalPostgres, user: str, host: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGPASSFILE": "/nonexistent", "PGCONNECT_TIMEOUT": "5"}
    env.pop("PGPASSWORD", None)
    return subprocess.run([postgres_bin("psql"), "-X", "-w", "-h", host, "-p", str(server.port), "-U", user,
                           "-d", "postgres", "-c", "SELECT 1"], capture_output=True, text=True, env=env, timeout=30)


@pytest.mark.process
def test_the_catalog_asks_every_connection_for_a_password_kept_in_a_private_file(pg: LocalPostgres,
                                                                                 lake: LakeConfig,
                                                                                 tmp_path: Path) -> None:
    assert "password" not in pg.dsn and f"passfile={pg.passfile}" in pg.dsn
    assert pg.passfile.stat().st_mode & 0o777 == 0o600 and pg.directory.stat().st_mode & 0o777 == 0o700
    for user, host in (("ahc", "127.0.0.1"), ("postgres", "127.0.0.1"), ("postgres", str(pg.socket_dir))):
        refused = connects_without_password(pg, user, host)
        assert refused.returncode != 0 and "password" in refused.stderr, (user, host, refused.stderr)
    with XDB.open(tmp_path / "a", config(lake, "A")) as a:  # the lake's own connection reads the passfile
        record(a, "s", 3)
        a.lake_ship_now()
    assert Path(lake.data_path).stat().st_mode & 0o777 == 0o700  # the lake's Parquet files: nobody else's
    assert redacted("dbname=a password=s3cret user=b") == "dbname=a password=*** user=b"
    assert redacted("postgresql://ahc:s3cret@127.0.0.1/ahc") == "postgresql://ahc:***@127.0.0.1/ahc"
    with pytest.raises(ValueError) as refused_attach:
        attach_lake(duckdb.connect(), "dbname=nope host=127.0.0.1 port=1 user=x password=s3cret", tmp_path / "d")
    assert "s3cret" not in str(refused_attach.value) and "password=***" in str(refused_attach.value)


@pytest.mark.process
def test_a_catalog_made_with_trust_moves_to_passwords_at_its_next_start() -> None:
    require_postgres()
    directory = Path(tempfile.mkdtemp(prefix="ahc-test-pg-trust-"))
    directory.chmod(0o755)
    server = LocalPostgres(directory).start()
    try:
        server.stop()
        hba = server.pgdata / "pg_hba.conf"  # as an older AHC left it: trust, and no password file
        hba.write_text(hba.read_text().replace("scram-sha-256", "trust"))
        server.passfile.unlink()
        server = LocalPostgres(directory).start()
        rules = [line for line in hba.read_text().splitlines() if line.strip() and not line.startswith("#")]
        assert server.passfile.exists() and rules and not any("trust" in line for line in rules)
        refused = connects_without_password(server, "postgres", "127.0.0.1")
        assert refused.returncode != 0 and "password" in refused.stderr
        con = duckdb.connect()
        attach_lake(con, server.dsn, directory / "lake-data")  # the lake role's new password works
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.process
def test_a_lake_chain_rewritten_as_a_whole_fails_against_the_replicas_own_head(lake: LakeConfig,
                                                                               tmp_path: Path) -> None:
    """Recomputed from genesis, an edited lake chain whose every hash was recomputed too verifies; the
    replica's own anchored head (its data dir's audit.head, out of the lake's reach) catches it."""
    from xdb.audit.chain import GENESIS, RECORD_COLUMNS, stamp
    from xdb.schema import TOP_K

    with XDB.open(tmp_path / "a", config(lake, "A")) as a:
        record(a, "sa", 12)
        a.lake_ship_now()
    assert lake.catalog is not None
    anchored = ["verify-audit", "--lake-catalog", lake.catalog, "--replica", f"A={tmp_path / 'a'}"]
    result = CliRunner().invoke(xdb_cli, anchored)
    assert result.exit_code == 0 and "anchored to its own audit head" in result.output, result.output

    lake_sql(lake, "UPDATE lake.audit_records SET content = 'forged' WHERE replica = 'A' AND seq = 3")
    cols = ", ".join(f"CAST({c} AS {'INTEGER' if c == 'concept_ids' else 'FLOAT'}[{TOP_K}]) AS {c}"
                     if c in ("concept_ids", "concept_values") else c for c in RECORD_COLUMNS)
    conn = observer(lake)
    rows = conn.execute(f"SELECT {cols}, record_hash, activation_root FROM lake.audit_records WHERE replica = 'A' "
                        "ORDER BY seq").to_arrow_table()
    ends = [seq for seq, h in zip(rows.column("seq").to_pylist(), rows.column("record_hash").to_pylist()) if h]
    roots = {seq: bytes(r) for seq, r in zip(rows.column("seq").to_pylist(), rows.column("activation_root").to_pylist())
             if r is not None}
    leaves, hashes = stamp(GENESIS, rows, ends, acts=roots)  # batch by batch, as the writer chains them
    for seq, leaf, digest in zip(rows.column("seq").to_pylist(), leaves.tolist(), hashes):
        conn.execute("UPDATE lake.audit_records SET leaf = ?, record_hash = ? WHERE replica = 'A' AND seq = ?",
                     [leaf, digest, seq])
    unanchored = CliRunner().invoke(xdb_cli, ["verify-audit", "--lake-catalog", lake.catalog])
    assert unanchored.exit_code == 0 and "unanchored" in unanchored.output  # the rewrite passes on its own
    result = CliRunner().invoke(xdb_cli, anchored)
    assert result.exit_code == 1 and "differs from the replica's own anchored head" in result.output, result.output
    bad = CliRunner().invoke(xdb_cli, ["verify-audit", "--lake-catalog", lake.catalog, "--replica", "A"])
    assert bad.exit_code == 2 and "NAME=DATA_DIR" in bad.output
