"""Hidden lens concepts (lens.hidden) on the tiny model's engine: measured inside the engine like the others,
kept in the audit log alone (top lens.audit_k a token), read by the auditor's key and by nothing the agent
reads (recall, the concepts list, the experience file); bound into the chain, so an edited hidden value fails
`ahc xdb verify-audit` naming its record. A config naming a concept the pack lacks stops the start."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import duckdb
import httpx
import pytest
import yaml

from bench.servers import TINY_MODEL, recall_until, start_server
from server.cluster.server_process import AHC, ServerProcess, child_env

REPO = Path(__file__).resolve().parents[1]  # the checkout under test
PACK = REPO / ".cache" / "lenses" / "tiny-demo"
HIDDEN = ["negation", "motion"]  # "motion" has children: they are shown as roots
DISPLAY = ["Negation", "Motion"]
AGENT, AUDITOR = "agent-key-1", "auditor-key-1"

pytestmark = [pytest.mark.engine, pytest.mark.process]


def write_config(root: Path, hidden: list[str]) -> Path:
    config = yaml.safe_load((REPO / "configs" / "cpu-tiny.yaml").read_text())
    config["lens"] = {"enabled": True, "pack": str(PACK), "k": 10, "hidden": hidden, "audit_k": 1}
    keys = root / "keys"
    keys.write_text(f"agent:{AGENT}\nauditor carol:{AUDITOR}\n")
    keys.chmod(0o600)
    config["api_keys_file"] = str(keys)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("hidden-lens")
    server = start_server(root / "xdb", config=write_config(root, HIDDEN))
    server.api_key = AGENT
    try:
        reply = server.client().chat.completions.create(
            model=server.client().models.list().data[0].id, max_tokens=12, temperature=0,
            messages=[{"role": "user", "content": "Which particle moves right?"}],
            extra_body={"return_token_ids": True, "context": {"session_id": "watched"}})
        tokens = len(reply.choices[0].token_ids or [])
        assert tokens > 0
        rows = recall_until(server, tokens, timeout=10, session_id="watched", event_types="output")
        assert len(rows) == tokens
        yield server, rows, root
    finally:
        server.stop()


def auditor(server: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {AUDITOR}"}, timeout=60)


def test_the_auditor_reads_the_hidden_concepts_top_audit_k_a_token(served) -> None:
    server, rows, _ = served
    with auditor(server) as http:
        records = http.get("/v1/audit/records", params={"event_type": "output", "limit": 1000}).json()["data"]
        verified = http.post("/v1/audit/verify").json()
    assert len(records) == len(rows)
    for record in records:
        hidden = record["hidden_activations"]
        assert hidden is not None and len(hidden) == 1 and set(hidden) <= set(HIDDEN), record
        assert all(isinstance(v, float) for v in hidden.values())
    assert verified["ok"], verified


def test_the_audit_page_shows_hidden_concepts_to_the_auditor_alone(served, tmp_path: Path) -> None:
    """In the browser, the audit page lists the latest records with their hidden concepts under an auditor's
    key; under the agent's it says the records are refused, and no hidden concept is on the page."""
    from browser import launched

    server, rows, _ = served
    errors: list[str] = []
    with launched() as browser:
        for key in (AUDITOR, AGENT):
            context = browser.new_context(viewport={"width": 1300, "height": 900})
            page = context.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{server.base_url}/ui/#/audit")
            page.locator("#key-form").wait_for(state="visible")
            page.fill("#api-key", key)
            page.click("#key-form button[type=submit]")
            page.locator("#audit-seq").wait_for()  # the head, read from the log's own routes or from XDB's
            if key == AUDITOR:
                cells = page.locator("#audit-records .hidden-activations")
                cells.first.wait_for()
                shown = cells.all_inner_texts()
                assert sum(any(name in text for name in HIDDEN) for text in shown) >= min(len(rows), 40), shown
                page.click("#verify-audit")
                page.locator("#audit-verdict.ok").wait_for(timeout=30_000)
            else:
                page.locator("#audit-records-refused").wait_for()
                assert not any(name in page.content() for name in HIDDEN)
            assert page.locator("[role=alert]").count() == 0
            page.screenshot(path=str(tmp_path / f"audit-{'auditor' if key == AUDITOR else 'agent'}.png"))
            context.close()
            assert not errors, errors


def test_the_agent_never_sees_a_hidden_concept(served) -> None:
    server, rows, _ = served
    assert all(row["concept_activations"] for row in rows)  # the visible concepts are measured
    seen = {name for row in rows for name in row["concept_activations"]}
    assert seen and not seen & set(HIDDEN)
    with server.http() as http:
        concepts = http.get("/v1/xdb/concepts")
        assert concepts.status_code == 200
        names = json.dumps(concepts.json())
        refused = http.get("/v1/audit/records")
    assert '"motion-right"' in names  # the pack's visible concepts are listed, a hidden parent's child a root
    assert not any(f'"{name}"' in names for name in HIDDEN + DISPLAY)
    assert refused.status_code in (401, 403)


def test_no_hidden_concept_reaches_the_experience_file(served) -> None:
    server, _, root = served
    server.stop()
    conn = duckdb.connect(str(root / "xdb" / "experience.duckdb"), read_only=True)
    try:
        columns = conn.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = "
                               "current_database() AND data_type = 'VARCHAR'").fetchall()
        assert any(t == "concepts" for t, _ in columns)
        names = {n for (n,) in conn.execute("SELECT name FROM concepts").fetchall()}
        assert "motion-right" in names and not names & set(HIDDEN)
        for table, column in columns:
            found = conn.execute(f'SELECT count(*) FROM "{table}" WHERE "{column}" IN ({", ".join("?" * 4)}) '
                                 f'OR "{column}" LIKE ? OR "{column}" LIKE ?',
                                 [*HIDDEN, *DISPLAY, '%"negation"%', '%"motion"%']).fetchone()
            assert found == (0,), (table, column)
    finally:
        conn.close()


def test_the_chain_binds_the_hidden_values(served, tmp_path: Path) -> None:
    server, _, root = served
    server.stop()
    ok = subprocess.run([AHC, "xdb", "verify-audit", "--data-dir", str(root / "xdb")], capture_output=True,
                        text=True, timeout=120, env=child_env())
    assert ok.returncode == 0, ok.stderr
    read = subprocess.run([AHC, "xdb", "audit-records", "--data-dir", str(root / "xdb"), "--event-type", "output",
                           "--limit", "1000"], capture_output=True, text=True, timeout=120, env=child_env())
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    assert lines and all(len(r["hidden_activations"]) == 1 and set(r["hidden_activations"]) <= set(HIDDEN)
                         for r in lines)
    copy = tmp_path / "copy"
    shutil.copytree(root / "xdb" / "audit", copy / "audit")
    conn = duckdb.connect(str(copy / "audit" / "audit.duckdb"))
    seq = conn.execute("SELECT min(seq) FROM audit_hidden").fetchone()[0]  # type: ignore[index]
    conn.execute("UPDATE audit_hidden SET activations = '{\"negation\":9.0}' WHERE seq = ?", [seq])
    conn.close()
    bad = subprocess.run([AHC, "xdb", "verify-audit", "--data-dir", str(copy)], capture_output=True, text=True,
                         timeout=120, env=child_env())
    assert bad.returncode == 1
    assert f"seq={seq}" in bad.stderr and "hidden activations" in bad.stderr


def test_an_unknown_hidden_concept_stops_the_start(tmp_path: Path) -> None:
    config = write_config(tmp_path, ["negation", "no-such-concept"])
    out = subprocess.run([AHC, "serve", "--config", str(config), "--model", str(TINY_MODEL),
                          "--data-dir", str(tmp_path / "xdb"), "--port", "0"],
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert out.returncode == 1
    assert "lens.hidden" in out.stderr and "no-such-concept" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
