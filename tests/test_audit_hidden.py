"""Hidden concepts' activations in the audit log alone (xdb/audit/hidden.py): their canonical bytes (a record
without any hashes as before), their storage apart (never in the experience file), the chain's check of each
stored value, and their way from the side channel through the writer's join."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from audit_files import sql
from lake_replica import close_observers, lake_sql  # noqa: F401 - close_observers: a fixture
from lake_replica import config as lake_config

from core.config import LakeConfig
from lens.side_channel import StepActivations
from xdb import XDB, verify_audit
from xdb.activation_join import ActivationJoiner
from xdb.audit.canonical import canonical_array
from xdb.audit.chain import RECORD_COLUMNS
from xdb.audit.hidden import digest, split_hidden
from xdb.rows import TokenBatch, hidden_json

VISIBLE = ("joy", "calm")
HIDDEN = ("deception", "spite")


def records(n: int = 2) -> pa.Table:
    """n audit records in clear, no activations, as `canonical_array` takes them."""
    columns: dict[str, pa.Array] = {}
    for name in RECORD_COLUMNS:
        if name in ("seq", "timestep_id", "tick"):
            columns[name] = pa.array(range(n), pa.int64())
        elif name == "created_at":
            columns[name] = pa.array([1_000_000] * n, pa.timestamp("us"))
        elif name in ("token_id", "key_id"):
            columns[name] = pa.nulls(n, pa.int32())
        elif name == "concept_ids":
            columns[name] = pa.nulls(n, pa.list_(pa.int32(), 10))
        elif name == "concept_values":
            columns[name] = pa.nulls(n, pa.list_(pa.float32(), 10))
        elif name == "sealed":
            columns[name] = pa.nulls(n, pa.binary())
        else:
            columns[name] = pa.array([f"{name}{i}" for i in range(n)], pa.string())
    return pa.table(columns)


# SHA-256 of records()'s canonical bytes as the layout made them before hidden activations existed.
BEFORE = ["df75da740f19960904ae86b8ee2801cc0cb46d3003c316ef1458716a7ee2f7ea",
          "446b6d306728973802222e69013f6885946a1f18e7e7a91a595e1b935e4727df"]


def test_a_record_without_hidden_activations_hashes_as_before() -> None:
    plain = canonical_array(records(), 10).to_pylist()
    assert [hashlib.sha256(raw).hexdigest() for raw in plain] == BEFORE
    with_null = records().append_column("hidden_digest", pa.nulls(2, pa.binary()))
    assert canonical_array(with_null, 10).to_pylist() == plain


def test_hidden_activations_add_their_digest_to_the_record_alone() -> None:
    plain = canonical_array(records(), 10).to_pylist()
    d = hashlib.sha256(b"x").digest()
    table = records().append_column("hidden_digest", pa.array([None, d], pa.binary()))
    got = canonical_array(table, 10).to_pylist()
    assert got[0] == plain[0]
    assert got[1] == plain[1] + b"hidden" + d


def test_split_hidden_keeps_the_values_apart_under_a_salted_digest() -> None:
    text = hidden_json(["spite", "deception"], [0.25, 0.5])
    assert json.loads(text) == {"deception": 0.5, "spite": 0.25} and text.index("deception") < text.index("spite")
    table = records(3).append_column("hidden_activations", pa.array([text, None, text], pa.string()))
    stored, hidden = split_hidden(table)
    assert "hidden_activations" not in stored.column_names
    assert hidden is not None and hidden.column("seq").to_pylist() == [0, 2]
    salts = hidden.column("salt").to_pylist()
    assert salts[0] != salts[1] and len(salts[0]) == 16
    digests = stored.column("hidden_digest").to_pylist()
    assert digests[1] is None and digests[0] != digests[2]  # the same values, two salts
    assert digests[0] == digest(salts[0], text)
    assert split_hidden(records()) == (records(), None)


def test_a_token_batch_names_hidden_and_visible_concepts_apart() -> None:
    def batch(hidden_names: tuple[str, ...], index: list[list[int]]) -> TokenBatch:
        return TokenBatch("s", [0], ["a"], concept_names=VISIBLE, concept_index=np.array([[0, 1]]),
                          concept_values=np.ones((1, 2), np.float32), hidden_names=hidden_names,
                          hidden_index=np.array(index, np.int32), hidden_values=np.ones((1, len(index[0])), np.float32))

    batch(HIDDEN, [[1, 0]]).check()
    with pytest.raises(ValueError, match="overlap"):
        batch(("joy",), [[0]]).check()
    with pytest.raises(ValueError, match="index into concept_names"):
        batch(HIDDEN, [[2]]).check()
    with pytest.raises(ValueError, match="hidden_index and hidden_values"):
        TokenBatch("s", [0], ["a"], hidden_names=HIDDEN, hidden_index=np.zeros((1, 1), np.int32)).check()


def write(data: Path, hidden: list[list[int]]) -> None:
    with XDB.open(data) as xdb:
        n = len(hidden)
        xdb.writer.submit(TokenBatch("s", xdb.next_ticks("s", n), [f"t{i}" for i in range(n)], token_ids=list(range(n)),
                                     concept_names=VISIBLE, concept_index=np.tile([0, 1], (n, 1)),
                                     concept_values=np.full((n, 2), 0.5, np.float32), hidden_names=HIDDEN,
                                     hidden_index=np.array(hidden, np.int32),
                                     hidden_values=np.tile(np.array([0.75, 0.125], np.float32), (n, 1))))
        xdb.writer.flush()


@pytest.fixture
def logged(tmp_path: Path) -> Path:
    data = tmp_path / "x"
    write(data, [[0, 1], [-1, -1], [1, -1]])
    return data


def test_hidden_activations_are_read_by_the_auditor_and_stored_nowhere_else(logged: Path) -> None:
    with XDB.open(logged) as xdb:
        audit = xdb.audit_records(session_id="s", limit=10)
        assert xdb.audit is not None
        concepts = sorted(name for _, name in xdb.audit.concepts())
    assert [r["hidden_activations"] for r in audit] == [{"deception": 0.75, "spite": 0.125}, None, {"spite": 0.75}]
    assert concepts == ["calm", "joy"]  # the visible concepts alone are named, in the audit's chain too
    assert sql(logged, "SELECT count(*) FROM audit_hidden") == [(2,)]
    conn = duckdb.connect(str(logged / "experience.duckdb"), read_only=True)
    try:
        assert sorted(n for (n,) in conn.execute("SELECT name FROM concepts").fetchall()) == ["calm", "joy"]
        assert "hidden_activations" not in {c for (c,) in conn.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'timesteps'").fetchall()}
    finally:
        conn.close()
    assert verify_audit(logged).ok


@pytest.mark.parametrize("statement, what", [
    ("UPDATE audit_hidden SET activations = replace(activations, '0.75', '0.5') WHERE seq = 2", "differ"),
    ("UPDATE audit_hidden SET salt = '\\x00'::BLOB WHERE seq = 0", "differ"),
    ("DELETE FROM audit_hidden WHERE seq = 2", "missing (deleted)"),
    ("INSERT INTO audit_hidden VALUES (1, '\\x00'::BLOB, '{}')", "inserted"),
    ("INSERT INTO audit_hidden SELECT * FROM audit_hidden WHERE seq = 2", "stored twice"),
])
def test_an_edited_hidden_value_fails_verification_naming_its_record(logged: Path, statement: str,
                                                                     what: str) -> None:
    sql(logged, statement)
    report = verify_audit(logged)
    seq = 0 if "seq = 0" in statement else 1 if "(1," in statement else 2
    assert not report.ok and report.first_bad is not None
    assert f"seq={seq}" in report.first_bad and what in report.first_bad, report.first_bad


def test_an_edited_digest_breaks_the_chain(logged: Path) -> None:
    sql(logged, "UPDATE audit_records SET hidden_digest = sha256('x')::BLOB WHERE seq = 0")
    report = verify_audit(logged)
    assert not report.ok and "seq=0" in (report.first_bad or "") and "hash mismatch" in (report.first_bad or "")


def test_retirement_takes_the_hidden_values_with_their_records(tmp_path: Path) -> None:
    data = tmp_path / "x"
    write(data, [[0, 1], [1, 0]])
    write(data, [[0, -1]])
    with XDB.open(data) as xdb:
        assert xdb.audit is not None
        xdb.audit.retire_through(1, "manual")
    assert sql(data, "SELECT seq FROM audit_hidden ORDER BY seq") == [(2,)]
    assert verify_audit(data).ok


def test_the_join_splits_a_rows_hidden_slots_off(tmp_path: Path) -> None:
    joiner = ActivationJoiner(f"ipc://{tmp_path}/j", k=10, wait_s=1.0)
    try:
        # 2 visible slots then 1 hidden one a row, as the worker ships them
        sent = StepActivations(["r", "r"], [0, 1], np.array([[1, 0, 1], [0, 1, 0]], np.int32),
                               np.array([[0.9, 0.1, 0.7], [0.8, 0.2, 0.6]], np.float32), "hidden_state", hidden_k=1)
        joiner.inbox.put(StepActivations.from_frames(sent.frames()))
        [run] = joiner.join([TokenBatch("s", [0, 1], ["a", "b"], concept_names=VISIBLE, hidden_names=HIDDEN,
                                        activation_key="r", join_by=0.0)])
    finally:
        joiner.close()
    assert isinstance(run, TokenBatch) and run.concept_index is not None and run.hidden_index is not None
    assert run.concept_index[:, :2].tolist() == [[1, 0], [0, 1]] and (run.concept_index[:, 2:] == -1).all()
    assert run.hidden_index.tolist() == [[1], [0]]
    assert run.hidden_values is not None and run.hidden_values[:, 0].tolist() == pytest.approx([0.7, 0.6])


def test_a_message_with_more_hidden_slots_than_slots_is_refused() -> None:
    sent = StepActivations(["r"], [0], np.zeros((1, 2), np.int32), np.zeros((1, 2), np.float32), "hidden_state",
                           hidden_k=1)
    frames = sent.frames()
    header = json.loads(frames[0])
    header["hidden_k"] = 3
    with pytest.raises(ValueError, match="hidden_k"):
        StepActivations.from_frames([json.dumps(header).encode(), *frames[1:]])


def test_deleting_a_session_erases_its_hidden_values_and_the_chain_still_verifies(logged: Path) -> None:
    with XDB.open(logged) as xdb:
        xdb.delete_session("s")
        outputs = xdb.audit_records(session_id="s", event_type="output", limit=10)
        assert [r["hidden_activations"] for r in outputs] == [None] * 3
    assert sql(logged, "SELECT count(*) FROM audit_hidden") == [(0,)]
    assert sql(logged, "SELECT count(hidden_digest) FROM audit_records") == [(2,)]  # the records stay
    report = verify_audit(logged)
    assert report.ok, report.first_bad


@pytest.mark.process
def test_a_lake_holds_the_digest_alone_and_rehashes_the_chain(lake: LakeConfig, tmp_path: Path) -> None:
    data = tmp_path / "r"
    with XDB.open(data, lake_config(lake, "H")) as xdb:
        n = 3
        xdb.writer.submit(TokenBatch("s", xdb.next_ticks("s", n), ["a", "b", "c"], token_ids=[1, 2, 3],
                                     concept_names=VISIBLE, concept_index=np.tile([0, 1], (n, 1)),
                                     concept_values=np.full((n, 2), 0.5, np.float32), hidden_names=HIDDEN,
                                     hidden_index=np.tile([1, 0], (n, 1)),
                                     hidden_values=np.tile(np.array([0.75, 0.125], np.float32), (n, 1))))
        xdb.writer.flush()
        xdb.lake_ship_now()
        reports = xdb.verify_lake_audit()
    assert reports["H"].ok and reports["H"].records_checked == n, reports["H"].first_bad
    assert lake_sql(lake, "SELECT count(hidden_digest) FROM lake.audit_records WHERE replica = 'H'") == [(n,)]
    tables = {t for (t,) in lake_sql(lake, "SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake'")}
    assert "audit_records" in tables and "audit_hidden" not in tables
    names = {n for (n,) in lake_sql(lake, "SELECT name FROM lake.concepts WHERE replica = 'H'")}
    assert names == set(VISIBLE)
