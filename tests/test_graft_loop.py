"""Folksonomy to graft, end to end on the real small model (SmolLM2-135M-Instruct): a client's tag grows into
a lens. Replies of a session are tagged with a new tag, which becomes a bud, READY with enough examples; its
evidence is submitted (the package written), its training file exported, `ahc lens train` learns it, and a
server restarted with the new pack records the bud's concept on new tokens: a new reply like the bud's
examples carries it more than one unlike them. The pack's contrast concept is hidden there: the auditor's key
reads it in the audit log, the agent's recall never returns it. Resolving the submission as accepted grafts
the bud."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean
from typing import Any

import httpx
import pytest
import yaml

from bench.servers import REAL_MODEL, recall_until, start_server
from server.cluster.server_process import AHC, ServerProcess, child_env

pytestmark = [pytest.mark.engine, pytest.mark.real_model, pytest.mark.slow, pytest.mark.process]

REPO = Path(__file__).resolve().parents[1]
BUD = "sea-talk"
SEA = ["Describe the ocean waves at night.", "What lives in a coral reef?", "Why is the sea salty?",
       "What do whales eat in the sea?"]
OTHER = ["Count from one to ten using digits.", "What is 12 times 12?", "List the days of the week.",
         "What is the square root of 81?"]
NEW_SEA, NEW_OTHER = "Describe the deep blue ocean and its fish.", "Add 7 and 15 and give the number."
MAX_TOKENS = 16
AUDITOR = "carol-audits"


def ask(server: ServerProcess, questions: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each question in a session of its own, all at once (the engine batches them): per session its
    reply's request id, text and rows."""
    client = server.client(timeout=300)

    def one(session: str) -> dict[str, Any]:
        answer = client.chat.completions.create(
            model="smollm2-135m", max_tokens=MAX_TOKENS, temperature=0,
            messages=[{"role": "user", "content": questions[session]}], extra_headers={"X-Session-ID": session})
        assert answer.usage is not None
        rows = recall_until(server, answer.usage.completion_tokens, timeout=10, session_id=session,
                            event_types="output")
        assert len({r["request_id"] for r in rows}) == 1
        return {"request_id": rows[0]["request_id"], "text": "".join(r["content"] for r in rows), "rows": rows}

    with ThreadPoolExecutor(len(questions)) as pool:
        return dict(zip(questions, pool.map(one, questions)))


def operator(server: ServerProcess, method: str, path: str, **kwargs: Any) -> Any:
    with server.http() as http:
        answer = http.request(method, path, **kwargs)
    assert answer.status_code == 200, f"{method} {path}: {answer.status_code} {answer.text}"
    return answer.json()


def test_a_tag_grows_into_a_lens(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / "configs" / "cpu-small.yaml").read_text())
    config.setdefault("xdb", {})["bud_min_examples"] = len(SEA)
    (tmp_path / "graft.yaml").write_text(yaml.safe_dump(config))
    data_dir = tmp_path / "xdb"

    server = start_server(data_dir, model=REAL_MODEL, config=tmp_path / "graft.yaml", lens="off", api_key="k")
    try:
        recorded = ask(server, {f"sea-{i}": q for i, q in enumerate(SEA)} | {f"other-{i}": q for i, q in
                                                                             enumerate(OTHER)})
        sea = [recorded[f"sea-{i}"] for i in range(len(SEA))]
        for i, reply in enumerate(sea):
            operator(server, "POST", "/v1/xdb/tag", json={"tag": BUD, "tag_type": "bud", "session_id": f"sea-{i}",
                                                          "event_id": reply["request_id"]})
            status = "ready" if i == len(sea) - 1 else "candidate"
            with server.http() as http:  # READY only once it has enough examples
                moved = http.post("/v1/xdb/buds", json={"tag": BUD, "status": "ready"})
            assert moved.status_code == (200 if status == "ready" else 409), moved.text
        submitted = operator(server, "POST", "/v1/xdb/evidence", json={"bud": BUD, "submission_id": "graft-1"})
        package = Path(submitted["package"])
        manifest = json.loads((package / "evidence.json").read_text())
        assert package == data_dir / "exports" / "graft-1" and len(manifest["windows"]) == len(SEA)
        assert manifest["rows"]["training_examples"] == {BUD: len(SEA), f"not-{BUD}": len(OTHER)}
        training = operator(server, "GET", f"/v1/xdb/buds/{BUD}/examples")
        assert training["concepts"] == json.loads((package / "training.json").read_text())["concepts"]
        bud_texts = training["concepts"][0]["examples"] + training["concepts"][0]["heldout"]
        assert sorted(bud_texts) == sorted(r["text"] for r in sea)
    finally:
        server.stop()

    examples, pack = tmp_path / "training.json", tmp_path / "lens"
    examples.write_text(json.dumps(training))
    trained = subprocess.run([AHC, "lens", "train", "--model", str(REAL_MODEL), "--examples", str(examples),
                              "--layer", "15", "--method", "logistic", "--out", str(pack)],
                             capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=600)
    assert trained.returncode == 0, trained.stderr

    # Restarted with the new pack, its contrast concept hidden: measured for the audit log alone (an auditor's
    # key reads it there), never among the activations the agent's own recall returns.
    keys = tmp_path / "keys"
    keys.write_text(f"default:k\nauditor carol:{AUDITOR}\n")
    keys.chmod(0o600)
    config["lens"] = {**config.get("lens", {}), "hidden": [f"not-{BUD}"], "audit_k": 1}
    (tmp_path / "grafted.yaml").write_text(yaml.safe_dump({**config, "api_keys_file": str(keys)}))
    server = start_server(data_dir, model=REAL_MODEL, config=tmp_path / "grafted.yaml", lens=str(pack))
    server.api_key = "k"
    try:
        new = ask(server, {"after-sea": NEW_SEA, "after-other": NEW_OTHER})
        like, unlike = new["after-sea"], new["after-other"]
        assert all(set(r["concept_activations"]) == {BUD} for reply in (like, unlike) for r in reply["rows"])
        with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {AUDITOR}"}) as auditor:
            audited = auditor.get("/v1/audit/records", params={"session_id": "after-sea", "event_type": "output",
                                                               "limit": 100}).json()["data"]
        assert len(audited) == len(like["rows"]) and all(
            set(r["hidden_activations"]) == {f"not-{BUD}"} for r in audited), audited[:2]
        strength = [mean(r["concept_activations"][BUD] for r in reply["rows"]) for reply in (like, unlike)]
        assert strength[0] > strength[1], f"{BUD}: {strength} on {like['text']!r} / {unlike['text']!r}"
        # Recalled by the concept above the midpoint of the two replies' means: the like reply's tokens come back,
        # more of them than of the other's. The probe's raw sign is no boundary: on another CPU the same greedy
        # replies scored 16 of 16 and 14 of 16 above 0, where this machine measured 16 and 0.
        middle = (strength[0] + strength[1]) / 2
        found = [recall_until(server, 0, timeout=5, session_id=session, concept=BUD, min_activation=middle)
                 for session in ("after-sea", "after-other")]
        assert found[0] and {r["request_id"] for r in found[0]} == {like["request_id"]}
        assert len(found[0]) > len(found[1]), f"{BUD} > {middle:.3f} on {len(found[0])} / {len(found[1])} tokens"
        operator(server, "POST", "/v1/xdb/evidence/graft-1/resolve", json={"accepted": True})
        [bud] = operator(server, "GET", "/v1/xdb/buds")["data"]
        assert (bud["name"], bud["bud_status"]) == (BUD, "grafted")
        assert (package / "evidence.json").is_file()
    finally:
        server.stop()
