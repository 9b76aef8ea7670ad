"""A server without keys serves the audit log to no one over HTTP: nobody holds an auditor's key, and an
agent with a shell tool must not read its own audit from localhost. Everything else stays open, and the
dashboard's audit panel (head and verification, never the records) is not the log's route.
AHC's whole app on the fake engine (tests/fake_app.py), a real XDB."""

from __future__ import annotations

from pathlib import Path

from fake_app import serving

from core.config import AHCConfig


def test_a_server_without_keys_refuses_the_audit_log_to_everyone(config: AHCConfig, vllm_config,  # type: ignore[no-untyped-def]
                                                                tmp_path: Path) -> None:
    with serving(config, vllm_config, tmp_path) as (client, _):
        reply = client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}],
            "context": {"session_id": "s", "identity": "You are terse."}})
        assert reply.status_code == 200, reply.text  # no key needed elsewhere
        for method, path in (("GET", "/v1/audit/records"), ("GET", "/v1/audit/head"), ("POST", "/v1/audit/verify"),
                             ("GET", "/v1/audit")):
            refused = client.request(method, path, headers={"Authorization": "Bearer anything"})
            assert refused.status_code == 403, (path, refused.text)
            error = refused.json()["error"]
            assert error["type"] == "permission_error" and "auditor's key" in error["message"]
        assert client.get("/v1/xdb/audit").status_code == 200  # the dashboard's panel: head and last verification
