"""The experience browser (`/ui/`) in a real browser: Debian's Chromium driven by Playwright.

Two setups. The shared real server (tiny model, lens on, API key): a session of several turns with a
karma edit and a switch to RAG, checked page by page against the cache reports the server returned.
A bare app over a real XDB file (no engine): a 50k-token session for paging and first-paint time, live
polling of the sessions list, discovery runs and the audit. Screenshots of every page go to the test's
tmp dir."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from browser import launched, served, sign_in, wait_for_turns
from fastapi import FastAPI

from agent.chart import chart
from server.cluster.server_process import ServerProcess
from server.http.gateway import install_gateway
from server.routes.agent_routes import agent_router
from server.routes.browse_routes import browse_router
from server.routes.ui_routes import install_ui
from server.routes.xdb_routes import xdb_router
from xdb import XDB, TimestepRow
from xdb.owner import EVERY
from xdb.rows import TokenBatch
from xdb.run_history import Progress, record_attempt, record_progress, record_theorem_version
from xdb.runs import log_interaction, save_meta_knowledge

CONCEPTS = ["motion", "motion-left", "motion-right", "collision"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not errors, f"the page threw: {errors}"


# ---- a bare app over a real XDB file ------------------------------------------------------------------

BIG_TURNS, BIG_TOKENS_PER_TURN = 10, 5000


def turn_row(session: str, tick: int, prompt: int, cached: int, generated: int, first_changed: str | None,
             mode: str = "cag") -> TimestepRow:
    """A turn record as the server writes it after a reply."""
    blocks = [{"name": n, "tokens": t, "sha256": f"{n}-{t}"} for n, t in
              (("identity", 40), ("codex", 300), ("karma", 20), ("state", max(prompt - 380, 0)), ("query", 20))]
    turn = {"mode": mode, "blocks": blocks, "first_changed_block": first_changed, "governor": [],
            "prefix_sha256": "x", "compactions": 0, "prompt_tokens": prompt, "cached_tokens": cached,
            "completion_tokens": generated, "request_id": f"req-{tick}"}
    return TimestepRow(session_id=session, tick=tick, event_type="system", content="turn", metadata={"turn": turn})


def write_session(xdb: XDB, session: str, turns: int, tokens_per_turn: int) -> None:
    rng = np.random.default_rng(0)
    for t in range(turns):
        first = xdb.next_ticks(session, 1)
        xdb.writer.submit([TimestepRow(session_id=session, tick=first[0], event_type="input", role="user",
                                       content=f"question {t}")])
        ticks = xdb.next_ticks(session, tokens_per_turn)
        index = np.stack([rng.permutation(len(CONCEPTS)) for _ in range(tokens_per_turn)]).astype(np.int32)
        values = np.sort(rng.random((tokens_per_turn, len(CONCEPTS)), dtype=np.float32), axis=1)[:, ::-1].copy()
        xdb.writer.submit(TokenBatch(session, ticks, [f"w{t}_{i} " for i in range(tokens_per_turn)],
                                     request_id=f"req-{session}-{t}", concept_names=CONCEPTS,
                                     concept_index=index, concept_values=values))
        prompt = 400 + 60 * t
        xdb.writer.submit([turn_row(session, xdb.next_ticks(session, 1)[0], prompt, 0 if t == 0 else prompt - 60,
                                    tokens_per_turn, None if t == 0 else "state")])
    xdb.writer.flush()


def report_png(tmp: Path) -> bytes:
    path = tmp / "report.png"
    chart(path, [1, 2, 3], lines={"coverage": ([0.1, 0.5, 0.9], (46, 160, 67))},
          bars={"cache hit": ([0.0, 0.8, 0.9], (245, 166, 35))})
    return path.read_bytes()


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, XDB]]:
    tmp = tmp_path_factory.mktemp("ui-bare")
    with XDB.open(tmp / "xdb") as xdb:
        write_session(xdb, "big", BIG_TURNS, BIG_TOKENS_PER_TURN)
        write_session(xdb, "small", 2, 30)
        xdb.pin("small", 0, 10, reason="evidence")
        for i in range(3):
            xdb.write(log_interaction, "run-1", journal_entry=f"entry {i}: tried a collision", token_count=10)
        xdb.write(save_meta_knowledge, "run-1",
                  theorems_json=json.dumps([{"name": "A moves right", "status": "proven"}]))
        xdb.write(save_meta_knowledge, "run-1", theorems_json=json.dumps([{"name": "A moves right", "status": "proven"},
                                                                   {"name": "B moves left", "status": "open"}]))
        xdb.save_run_report("run-1", report_png(tmp), owner=EVERY)
        for run_id, strategy, status, turns in (("run-1", "baseline", "solved", 3),
                                                ("run-2", "llm:tiny", "stopped", 9)):
            xdb.write(record_progress, run_id, Progress("kinetic", strategy, status, turns=turns))
        rule = json.dumps({"law": "moves", "symbol": "A", "direction": "right"})
        xdb.write(record_theorem_version, "run-1", theorem_id="T1", change="stored", turn=1, theorem_json=rule)
        xdb.write(record_theorem_version, "run-1", theorem_id="T1", change="retracted", turn=2, theorem_json=rule,
                  reason="A stopped at the wall")
        for tick in (0, 1):  # a tag growing toward a concept: a bud with two examples
            xdb.tag("sea-talk", session_id="small", tick=tick, tag_type="bud", owner=EVERY)
        xdb.write(record_attempt, "run-2", rule="kinetic", turn=2, kind="law", subject="L1", verdict="FAIL",
                  law_json=json.dumps({"law": "invariant", "expr": {"op": "count", "symbol": "A"}}),
                  detail="counterexample")
        app = FastAPI()
        install_gateway(app)
        for router in (xdb_router(xdb), browse_router(xdb), agent_router(xdb)):
            app.include_router(router)
        install_ui(app, model="bare", auth_required=False, version="test")
        with served(app) as base:
            yield base, xdb


@pytest.mark.process
def test_a_50k_token_session_paints_within_2s_and_pages_its_tokens(bare: tuple[str, XDB], page: Any,
                                                                 tmp_path: Path) -> None:
    base, _ = bare
    started = time.monotonic()
    page.goto(f"{base}/ui/#/session/big")
    page.locator("#turn-1 .tok").first.wait_for(state="visible", timeout=10_000)
    first_paint = time.monotonic() - started
    print(f"first tokens of a {BIG_TURNS * BIG_TOKENS_PER_TURN}-token session painted after {first_paint:.2f} s")
    assert first_paint < 2.0, f"first tokens painted after {first_paint:.2f} s"
    assert page.locator(".turns section.turn").count() == BIG_TURNS
    # Only what is near the screen is loaded: a page of tokens per visible turn, not the 50k.
    page.wait_for_timeout(300)
    shown = page.locator(".tok").count()
    assert 0 < shown < BIG_TOKENS_PER_TURN and shown % 400 == 0, shown
    assert page.locator(f"#turn-{BIG_TURNS} .tok").count() == 0
    first_turn = page.locator("#turn-1")
    before = first_turn.locator(".tok").count()
    first_turn.locator("button.more").click()
    page.wait_for_function("n => document.querySelectorAll('#turn-1 .tok').length > n", arg=before)
    assert first_turn.locator(".tok").count() == 2 * before
    # Coloured by the top concept, with the top-k on hover.
    tok = first_turn.locator(".tok").first
    assert tok.get_attribute("data-concept") in CONCEPTS
    assert "background-color" in (tok.get_attribute("style") or "")
    assert all(c in (tok.get_attribute("title") or "") for c in CONCEPTS)
    page.screenshot(path=str(tmp_path / "session-50k.png"))


def test_the_sessions_list_sorts_filters_and_shows_new_sessions_without_reload(bare: tuple[str, XDB], page: Any,
                                                                              tmp_path: Path) -> None:
    base, xdb = bare
    page.goto(f"{base}/ui/#/sessions")
    rows = page.locator("#sessions tbody tr")
    page.locator('#sessions tr[data-session="big"]').wait_for()
    small = page.locator('#sessions tr[data-session="small"]')
    assert "pinned" in small.inner_text()
    assert "10" in page.locator('#sessions tr[data-session="big"] td').nth(2).inner_text()
    page.locator('#sessions th[data-key="turns"]').click()  # most turns first
    assert rows.first.get_attribute("data-session") == "big"
    page.locator('#sessions th[data-key="turns"]').click()  # then fewest
    assert rows.last.get_attribute("data-session") == "big"
    page.fill("#session-filter", "sma")
    assert [rows.nth(i).get_attribute("data-session") for i in range(rows.count())] == ["small"]
    page.fill("#session-filter", "")
    write_session(xdb, "arrived-later", 1, 5)
    page.locator('#sessions tr[data-session="arrived-later"]').wait_for(timeout=10_000)
    page.screenshot(path=str(tmp_path / "sessions.png"))


def test_a_discovery_run_shows_its_journal_theorems_and_report(bare: tuple[str, XDB], page: Any,
                                                             tmp_path: Path) -> None:
    base, _ = bare
    page.goto(f"{base}/ui/#/runs")
    page.locator("#strategies tbody tr").first.wait_for()  # what the runs learned across runs
    assert page.locator("#strategies tbody tr").all_inner_texts()[0].split("\t")[:3] == ["baseline", "1", "1"]
    assert "refuted 1 times in 1 runs" in page.locator("#failed-laws li").inner_text()
    page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)
    page.locator("#runs a", has_text="run-1").click()
    page.locator("#journal li").first.wait_for()
    assert page.locator("#journal li").count() == 3
    assert page.locator("#theorems li").count() == 2
    assert page.locator("#lineage li").all_inner_texts() == [
        "T1 v1 stored at turn 1", "T1 v2 retracted at turn 2 (from v1): A stopped at the wall"]
    assert page.locator(".line-chart circle").count() == 2  # one point per knowledge version
    image = page.locator("#run-report img")
    image.wait_for()
    page.wait_for_function("() => document.querySelector('#run-report img').naturalWidth > 0")
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)


def test_a_concept_page_shows_its_tokens_and_its_related_concepts_by_relation(bare: tuple[str, XDB], page: Any,
                                                                             tmp_path: Path) -> None:
    base, _ = bare
    page.goto(f"{base}/ui/#/concepts")
    page.locator("#buds tbody tr").first.wait_for()
    assert page.locator("#buds tbody tr").all_inner_texts()[0].split("\t")[:3] == ["sea-talk", "candidate", "2"]
    page.goto(f"{base}/ui/#/concepts/motion")
    page.locator("#top-tokens tbody tr").first.wait_for()
    related = page.locator("#related li").all_inner_texts()
    # Every token of these sessions carries all four concepts: the other three are active with it.
    assert sorted(text.split(" · ")[0] for text in related) == sorted(c for c in CONCEPTS if c != "motion")
    assert all("often active with it" in text and "tokens together" in text for text in related), related
    page.screenshot(path=str(tmp_path / "concept.png"), full_page=True)


def test_the_audit_page_verifies_the_chain(bare: tuple[str, XDB], page: Any, tmp_path: Path) -> None:
    base, xdb = bare
    page.goto(f"{base}/ui/#/audit")
    page.locator("#audit-seq").wait_for()
    seq, head = xdb.audit_head()
    assert page.locator("#audit-head").inner_text() == head
    assert page.locator("#audit-seq").inner_text().replace(",", "") == str(seq)
    page.click("#verify-audit")
    page.locator("#audit-verdict.ok").wait_for(timeout=30_000)
    assert "Intact" in page.locator("#audit-verdict").inner_text()
    page.screenshot(path=str(tmp_path / "audit.png"))


# ---- the real server ----------------------------------------------------------------------------------

SESSION = "ui-walk"


def drive_session(server: ServerProcess) -> list[dict[str, Any]]:
    """Six turns: an edited karma fact at turn 3, a switch to RAG at turn 5. Returns the cache reports."""
    client = server.client()
    codex = [{"id": "manual", "text": "The universe has four symbols: _, A, B and K. " * 30}]
    reports = []
    for i in range(6):
        karma = [{"id": "k1", "text": "A moves right." if i < 2 else "A moves right, one cell a step.",
                  "verbatim": True}]
        context = {"session_id": SESSION, "identity": "You are a careful physicist.", "codex": codex,
                   "karma": karma, "mode": "rag" if i >= 4 else "cag"}
        reply = client.chat.completions.create(
            model="tiny", max_tokens=24, messages=[{"role": "user", "content": f"Question {i}: what happens next?"}],
            extra_body={"context": context})
        reports.append(reply.model_extra["context"])
    return reports


@pytest.mark.engine
def test_a_real_session_page_by_page(server: ServerProcess, page: Any, tmp_path: Path) -> None:
    reports = drive_session(server)
    breaks = [r["first_changed_block"] for r in reports]
    assert breaks[2] == "karma" and reports[4]["mode"] == "rag" and breaks[4] == "codex", breaks
    wait_for_turns(server, SESSION, len(reports))
    requests: list[Any] = []
    page.on("request", lambda r: requests.append(r))

    # The shell loads without the key; the page asks for it once and sends it as a header.
    assert httpx.get(f"{server.base_url}/v1/xdb/sessions").status_code == 401
    sign_in(page, server)
    page.locator(f'#sessions tr[data-session="{SESSION}"]').wait_for()
    row = page.locator(f'#sessions tr[data-session="{SESSION}"]').inner_text()
    assert "6" in row and "CAG" not in row and "RAG" in row  # the last turn's mode
    page.screenshot(path=str(tmp_path / "sessions.png"))

    page.click(f'#sessions tr[data-session="{SESSION}"] a')
    page.locator(".turns section.turn").nth(5).wait_for()
    assert page.locator(".turns section.turn").count() == 6
    for i, block in enumerate(breaks):
        changed = page.locator(f"#turn-{i + 1} .block.changed")
        if block is None:
            assert changed.count() == 0, i
        else:
            assert changed.get_attribute("data-block") == block, i
    assert "Karma" in page.locator("#turn-3 .break").inner_text()
    assert "mode cag → rag" in page.locator("#turn-5 .break").inner_text()
    for i, report in enumerate(reports):  # blocks drawn with the sizes the server reported
        drawn = page.locator(f"#turn-{i + 1} .block")
        assert [int(drawn.nth(j).get_attribute("data-tokens")) for j in range(drawn.count())] == \
            [b["tokens"] for b in report["blocks"]]
    assert page.locator("#turn-2 .cached-shade").count() == 1  # the second turn read the cache
    assert page.locator(".cache-chart .bar-cached").count() == 6
    coloured = page.locator("#turn-1 .tok[data-concept]")
    coloured.first.wait_for()
    assert coloured.count() >= 1
    top_concept = coloured.first.get_attribute("data-concept")
    page.screenshot(path=str(tmp_path / "session.png"), full_page=True)

    # Concepts: follow one to its strongest tokens, then a token to its turn.
    page.goto(f"{server.base_url}/ui/#/concepts")
    page.locator("#concept-tree a").first.wait_for()
    page.screenshot(path=str(tmp_path / "concepts.png"))
    concept = page.locator(f'#concept-tree a[data-concept="{top_concept}"]')
    concept.click()
    link = page.locator("#top-tokens a.turn-link", has_text=SESSION).first
    link.wait_for()
    page.screenshot(path=str(tmp_path / "concept.png"))
    tick = link.inner_text().rsplit("tick ", 1)[1]
    link.click()
    focused = page.locator(".tok.focus")
    focused.wait_for()
    assert focused.get_attribute("data-tick") == tick
    assert page.locator(".turns section.turn.focus").count() == 1

    wait_out_the_verification_cooldown(server)
    page.goto(f"{server.base_url}/ui/#/audit")
    page.click("#verify-audit")
    page.locator("#audit-verdict.ok").wait_for(timeout=60_000)
    page.screenshot(path=str(tmp_path / "audit.png"))

    api = [r for r in requests if "/v1/" in r.url]
    assert api, "the page read nothing from the API"
    assert all(server.api_key not in r.url for r in requests), "the key went into a URL"
    assert all(r.headers.get("authorization") == f"Bearer {server.api_key}" for r in api)
    # The key is asked for once: a reload in the same tab reads it from the tab's storage.
    page.reload()
    page.locator("#audit-seq").wait_for()
    assert page.locator("#key-form").is_hidden()


def wait_out_the_verification_cooldown(server: ServerProcess) -> None:
    """The shared server refuses a verification (429) for ten times the last one's duration, ten seconds at
    least, after it ends: another test of the same server may have verified moments ago."""
    with server.http() as http:
        last = http.get("/v1/xdb/audit").json()["last_verification"]
    if last is not None:
        finished = dt.datetime.fromisoformat(last["finished_at"].replace("Z", "+00:00"))
        since = (dt.datetime.now(dt.UTC) - finished).total_seconds()
        time.sleep(max(0.0, max(10.0, 10 * last["seconds"]) - since + 0.5))


@pytest.mark.engine
def test_the_karma_page_shows_each_proposal_and_who_decided_it(server: ServerProcess, page: Any,
                                                               tmp_path: Path) -> None:
    """Two outcomes proposed for a session's Karma: the operator accepts one as a person, with a rationale;
    the page lists both, newest first, the decided one with who verified it and why."""
    server.client().chat.completions.create(model="tiny", max_tokens=4,
                                            extra_body={"context": {"session_id": "ui-karma"}},
                                            messages=[{"role": "user", "content": "Which way does A move?"}])
    wait_for_turns(server, "ui-karma", 1)
    with server.http() as http:
        made = [http.post("/v1/context/karma/proposals", json={
            "text": text, "session_id": "ui-karma", "source_session_id": "ui-karma", "tick_range": [0, 100]}).json()
            for text in ("A moves right.", "B never moves.")]
        assert all("id" in proposal for proposal in made), made
        decided = http.post(f"/v1/context/karma/proposals/{made[0]['id']}/review",
                            json={"verdict": "accepted", "rationale": "turn 3 shows it"})
        assert decided.status_code == 200, decided.text
    sign_in(page, server)
    page.goto(f"{server.base_url}/ui/#/karma")
    rows = page.locator("#karma-proposals tbody tr")
    rows.first.wait_for()
    mine = {row.get_attribute("data-proposal"): row for row in rows.all()}
    accepted, pending = mine[str(made[0]["id"])], mine[str(made[1]["id"])]
    assert accepted.get_attribute("data-status") == "accepted" and "turn 3 shows it" in accepted.inner_text()
    assert "(person)" in accepted.inner_text() and "A moves right." in accepted.inner_text()
    assert pending.get_attribute("data-status") == "pending" and "B never moves." in pending.inner_text()
    page.screenshot(path=str(tmp_path / "karma.png"), full_page=True)
