"""`ahc serve --api-server-count 2`: two API processes over one engine core and one XDB service, through
real HTTP. A session's turns go through both processes and stay in order, with their State and their
recorded ticks whole; sessions inferred from the messages continue across them; two tenants stay
apart; /metrics is one view; a kill -9 of one process stops the server with every committed row kept."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import psutil
import pytest

from bench.serve import Side, side_figures
from bench.servers import TINY_MODEL, scrape_metrics, start_server
from bench.stream_load import Load, Target
from server.cluster.server_process import VERIFY_TLS, ServerProcess

pytestmark = [pytest.mark.engine, pytest.mark.slow]

KEYS = {"ada": "key-ada-0123456789", "bob": "key-bob-0123456789"}
AUDITOR_KEY = "key-auditor-0123456789"
TURNS = 6
SESSIONS = 3
# A log line of one chat request, with the API process that served it (vLLM's log prefix).
SERVED_BY = re.compile(r"\((ApiServer_\d) pid=(\d+)\).* chat session=(\S+) ")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if not (TINY_MODEL / "config.json").exists():
        raise RuntimeError("the tiny model is missing: run `make setup` first")
    home = tmp_path_factory.mktemp("api2")
    keys = home / "keys"
    keys.write_text("".join(f"{tenant}:{key}\n" for tenant, key in KEYS.items()) + f"auditor aud:{AUDITOR_KEY}\n")
    keys.chmod(0o600)
    srv = start_server(home / "xdb", extra=["--api-server-count", "2", "--api-keys-file", str(keys)])
    yield srv
    srv.stop()


def fresh_client(server: ServerProcess, tenant: str) -> openai.OpenAI:
    """A client whose every request opens a connection of its own, so the kernel may hand it to either
    API process (a kept-alive connection stays with the process that accepted it)."""
    http = httpx.Client(verify=VERIFY_TLS, limits=httpx.Limits(max_keepalive_connections=0))
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEYS[tenant], max_retries=0, timeout=120,
                         http_client=http)


def served_by(server: ServerProcess) -> dict[str, list[str]]:
    """Each session's requests (by its stored id, `tenant/session`), by the API process that served each,
    in log order."""
    by_session: dict[str, list[str]] = {}
    for line in server.log.read_text(errors="replace").splitlines():
        found = SERVED_BY.search(line)
        if found:
            by_session.setdefault(found.group(3), []).append(found.group(1))
    return by_session


def tenant_http(server: ServerProcess, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {KEYS[tenant]}"},
                        verify=VERIFY_TLS, timeout=60)


def run_session(server: ServerProcess, tenant: str, session: str) -> None:
    client = fresh_client(server, tenant)
    for turn in range(TURNS):
        client.chat.completions.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": f"{session} turn {turn}"}],
            extra_body={"context": {"session_id": session}})


def test_a_sessions_turns_go_through_both_processes_in_order(two: ServerProcess) -> None:
    sessions = [(tenant, f"{tenant}-s{i}") for tenant in KEYS for i in range(SESSIONS)]
    with ThreadPoolExecutor(len(sessions)) as pool:
        for done in [pool.submit(run_session, two, tenant, session) for tenant, session in sessions]:
            done.result()
    processes = served_by(two)
    assert any(len(set(processes[f"{tenant}/{session}"])) == 2 for tenant, session in sessions), \
        f"no session was served by both API processes: {processes}"
    for tenant, session in sessions:
        other = "bob" if tenant == "ada" else "ada"
        with tenant_http(two, tenant) as http, tenant_http(two, other) as foreign:
            state = http.get(f"/v1/context/sessions/{session}")
            rows = http.get("/v1/xdb/recall", params={"session_id": session, "limit": 1000}).json()["data"]
            hidden = foreign.get(f"/v1/context/sessions/{session}")
        assert state.status_code == 200 and state.json()["turns"] == TURNS, state.text
        ticks = [row["tick"] for row in rows]
        assert len(ticks) == len(set(ticks)), f"{session}: a tick recorded twice"
        assert inputs_of(rows) == [f"{session} turn {i}" for i in range(TURNS)], session
        assert hidden.status_code == 404, hidden.text  # the other tenant's session is not found


def converse(server: ServerProcess, name: str) -> None:
    """A client that names no session and resends its whole history each turn, as most agents do."""
    client = fresh_client(server, "ada")
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are {name}."}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"{name} turn {turn}"})
        reply = client.chat.completions.create(model="tiny", max_tokens=4, messages=messages)  # type: ignore[arg-type]
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


def test_a_conversation_without_a_session_id_continues_across_processes(two: ServerProcess) -> None:
    before = set(served_by(two))
    with ThreadPoolExecutor(SESSIONS) as pool:  # side by side, so both processes are busy
        for done in [pool.submit(converse, two, f"agent {i}") for i in range(SESSIONS)]:
            done.result()
    new = {sid: seen for sid, seen in served_by(two).items() if sid not in before}
    # Each conversation joined one inferred session, whichever process took each turn.
    assert len(new) == SESSIONS and all(len(seen) == TURNS for seen in new.values()), new
    assert any(len(set(seen)) == 2 for seen in new.values()), f"no conversation went through both processes: {new}"


def test_metrics_are_one_view_over_both_processes(two: ServerProcess) -> None:
    client = fresh_client(two, "bob")
    before = scrape_metrics(two.base_url).get("ahc_prompt_tokens_total", 0.0)
    for i in range(6):
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": f"m{i}"}])
    time.sleep(1.5)  # the computed gauges are written once a second
    text = httpx.get(f"{two.base_url}/metrics", timeout=30).text
    after = scrape_metrics(two.base_url).get("ahc_prompt_tokens_total", 0.0)
    assert after > before
    series = [line.split(" ")[0] for line in text.splitlines() if line.startswith("ahc_") and "{" in line]
    assert len(series) == len(set(series)), "a series reported twice"
    assert any(line.startswith("ahc_xdb_queue_depth") for line in text.splitlines())


def test_the_serving_bench_measures_both_api_processes(two: ServerProcess) -> None:
    """`ahc bench serve --api-server-count 2` at a tiny load, on this server: the API processes' CPU together,
    the XDB service and the engine apart, and every token recorded."""
    side = Side("", Target(two.base_url, "tiny", KEYS["ada"], two.process.pid), check_xdb=True)
    result = side.measure(Load(clients=8, requests=1, max_tokens=8))
    assert result.tokens == 64 and side.recorded_rows == 64
    api = [c for c in psutil.Process(two.process.pid).children(recursive=True) if "APIServer" in " ".join(c.cmdline())]
    assert len(api) == 2
    figures = side_figures(side, [result])
    assert figures["cpu_us_per_token"] > 0 and figures["xdb_cpu_us_per_token"] > 0
    assert figures["engine_cpu_us_per_token"] > 0


def test_kill_9_of_one_api_process_stops_the_server_and_keeps_what_was_committed(two: ServerProcess) -> None:
    """The module's last test: it ends the module's server."""
    client = fresh_client(two, "ada")
    for turn in range(4):
        client.chat.completions.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": f"k{turn}"}],
                                       extra_body={"context": {"session_id": "killed"}})
    pids = {int(found.group(1)) for line in two.log.read_text(errors="replace").splitlines()
            if (found := re.search(r"\(ApiServer_1 pid=(\d+)\)", line))}
    assert len(pids) == 1, two.log_tail()
    os.kill(pids.pop(), signal.SIGKILL)
    assert two.process.wait(120) != 0, two.log_tail()
    assert two.data_dir is not None
    again = start_server(two.data_dir, extra=["--api-keys-file", str(two.data_dir.parent / "keys")])
    try:  # one process, the same data: the session goes on
        audit = httpx.post(f"{again.base_url}/v1/audit/verify", headers={"Authorization": f"Bearer {AUDITOR_KEY}"},
                           verify=VERIFY_TLS, timeout=300).json()
        with tenant_http(again, "ada") as http:
            before = http.get("/v1/xdb/recall", params={"session_id": "killed", "limit": 1000}).json()["data"]
            fresh_client(again, "ada").chat.completions.create(
                model="tiny", max_tokens=4, messages=[{"role": "user", "content": "k4"}],
                extra_body={"context": {"session_id": "killed"}})
            rows = http.get("/v1/xdb/recall", params={"session_id": "killed", "limit": 1000}).json()["data"]
            state = http.get("/v1/context/sessions/killed").json()
    finally:
        again.stop()
    assert audit["ok"], audit
    assert inputs_of(before) == [f"k{turn}" for turn in range(4)]
    assert inputs_of(rows) == [f"k{turn}" for turn in range(5)]
    assert state["turns"] == 5, state


def inputs_of(rows: list[dict[str, Any]]) -> list[str]:
    return [row["content"] for row in sorted(rows, key=lambda r: r["tick"]) if row["event_type"] == "input"]
