"""The auditor: a key marked `auditor` in the keys file reads the audit log over HTTP (records by
session, event and time, the head, a verification) and nothing else; no tenant's key reads the log.
AHC's whole app on the fake engine (tests/fake_app.py), a real XDB."""

from __future__ import annotations

import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fake_app import ALICE, BOB, CAROL
from fastapi.testclient import TestClient

from server.runtime import Runtime
from server.tenancy.tenants import TenantKeys


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}



def say(client: TestClient, key: str, session: str, words: str) -> None:
    response = client.post("/v1/chat/completions", headers=auth(key), json={
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": words}],
        "context": {"session_id": session, "identity": "You are terse."}})
    assert response.status_code == 200, response.text


def records(client: TestClient, **params: object) -> dict:  # type: ignore[type-arg]
    response = client.get("/v1/audit/records", headers=auth(CAROL), params=params)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_an_auditor_reads_the_log_by_session_event_and_time(audited: tuple[TestClient, Runtime]) -> None:
    client, _ = audited
    started = datetime.now(UTC) - timedelta(seconds=1)
    say(client, ALICE, "lab", "The vault code is QX-7731.")
    say(client, BOB, "desk", "Nothing to see.")
    alice = records(client, session_id="alice/lab", limit=1000)["data"]
    assert alice and {r["session_id"] for r in alice} == {"alice/lab"}
    assert any("QX-7731" in (r["content"] or "") for r in alice)  # the log holds what was said
    assert [r["seq"] for r in alice] == sorted(r["seq"] for r in alice)
    inputs = records(client, session_id="alice/lab", event_type="input")["data"]
    assert inputs and all(r["event_type"] == "input" for r in inputs) and len(inputs) < len(alice)
    assert records(client, until=started.isoformat())["data"] == []
    everything = records(client, since=started.isoformat(), limit=1000)["data"]
    assert {"alice/lab", "bob/desk"} <= {r["session_id"] for r in everything}
    # Pages in chain order: `after` the last seq seen.
    first = records(client, limit=2)
    assert first["has_more"] and len(first["data"]) == 2
    second = records(client, limit=2, after=first["data"][-1]["seq"])
    assert second["data"][0]["seq"] > first["data"][-1]["seq"]
    head = client.get("/v1/audit/head", headers=auth(CAROL)).json()
    assert head["head_seq"] >= max(r["seq"] for r in everything)
    verdict = client.post("/v1/audit/verify", headers=auth(CAROL))
    assert verdict.status_code == 200 and verdict.json()["ok"]


def test_an_auditor_reads_nothing_else_and_no_tenant_reads_the_log(audited: tuple[TestClient, Runtime]) -> None:
    client, runtime = audited
    say(client, ALICE, "lab", "hello")
    for method, path in (("GET", "/v1/xdb/recall"), ("GET", "/v1/context/sessions"), ("GET", "/v1/models"),
                         ("POST", "/v1/chat/completions"), ("GET", "/v1/xdb/sessions/alice%2Flab/turns")):
        refused = client.request(method, path, headers=auth(CAROL), json={})
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json()["error"]["type"] == "permission_error"
    for key in (ALICE, BOB):
        refused = client.get("/v1/audit/records", headers=auth(key))
        assert refused.status_code == 403 and "auditor" in refused.json()["error"]["message"]
    assert client.get("/v1/audit/records").status_code == 401
    assert client.get("/health", headers=auth(CAROL)).status_code == 200  # the probes stay open
    # The log's files are the server's alone: their folders are its user's only (DuckDB makes its
    # write-ahead log with the process's umask, so the folder is what keeps it private).
    audit_dir = Path(runtime.config.data_dir) / "audit"
    assert stat.S_IMODE(audit_dir.stat().st_mode) == stat.S_IMODE(audit_dir.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((audit_dir / "audit.duckdb").stat().st_mode) == 0o600


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"after": -2}, {"since": "yesterday"},
                                    {"session_id": "x" * 5000}])
def test_a_bad_audit_query_is_a_clear_error(audited: tuple[TestClient, Runtime], params: dict) -> None:  # type: ignore[type-arg]
    client, _ = audited
    response = client.get("/v1/audit/records", headers=auth(CAROL), params=params)
    assert response.status_code in (400, 422) and "error" in response.json()


def test_an_auditor_is_no_tenant(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"default:{ALICE}\nauditor default-reviewer:{CAROL}\n")
    built = TenantKeys.build([], keys)
    auditor, tenant = built.tenant_for(CAROL), built.tenant_for(ALICE)
    assert auditor is not None and auditor.auditor and not auditor.operator
    assert tenant is not None and tenant.operator and tenant.prefix == ""
    assert built.tenants == {"default"}
    assert built.cache_salt(tenant) is None  # one tenant: its cache is not salted for the auditor's sake
    keys.write_text(f"auditor bad/name:{CAROL}\n")
    with pytest.raises(ValueError, match="bad tenant name"):
        TenantKeys.build([], keys)
