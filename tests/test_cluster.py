"""A cluster on this machine, loopback only: PostgreSQL from Debian (the lake's catalog, run as its own
user), DuckLake, two tiny `ahc serve` replicas and vLLM's router hashing `X-Session-ID`.

Asserted: 8 interleaved sessions x 10 turns through the router each stay on one replica and keep the
hit ratio of one replica alone (within 0.05), while a round-robin router over the same replicas in the
same run scores far lower; then one replica is killed (SIGKILL) under load: the router stops sending to
it, its server-kept sessions continue on the other from the State in the lake (reported as
`first_changed_block: "replica"`), no completed reply is lost from the lake, and every replica's audit
chain verifies there. `ahc bench cluster`'s result, built from that routing comparison and failover
time, is checked against its entry in tests/bench_smoke.py (the bench itself is not run again).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from bench_smoke import check_result
from postgres import require_postgres

from bench.cluster import (
    HEADER,
    ClusterLoad,
    Routing,
    chat,
    compare_routing,
    first_token_s,
    holders,
    model_of,
    result_of,
    system_prompt,
)
from bench.servers import TINY_MODEL
from core.config import LakeConfig
from server.cluster import fork_server
from server.cluster.local_cluster import ClusterSpec, LocalCluster, replica_id
from server.cluster.server_process import AHC, child_env, free_port
from xdb.lake.lake import Lake
from xdb.owner import EVERY

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(1800)]

LOAD = ClusterLoad(sessions=8, turns=10)


EVIL = {"Origin": "http://evil.example"}  # a web page's request


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require_postgres()
    data_dir = tmp_path_factory.mktemp("cluster")
    # As root PostgreSQL runs as the `postgres` user, who cannot enter pytest's own (0700) temp dirs.
    catalog_dir = Path(tempfile.mkdtemp(prefix="ahc-test-catalog-"))
    catalog_dir.chmod(0o755)
    spec = ClusterSpec(data_dir, replicas=2, model=str(TINY_MODEL), config="cpu-tiny", port=free_port(),
                       catalog_dir=catalog_dir)
    try:
        with LocalCluster(spec) as running:
            yield running
    finally:
        shutil.rmtree(catalog_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def lake(cluster: LocalCluster) -> Iterator[Lake]:
    assert cluster.dsn is not None
    reader = Lake.open(LakeConfig(catalog=cluster.dsn, data_path=str(cluster.lake_path), replica_id="test-reader"))
    yield reader
    reader.close()


@pytest.fixture(scope="module")
def routing(cluster: LocalCluster) -> Routing:
    """The bench's routing comparison, run once: asserted here, and `ahc bench cluster`'s figures with the
    failover time the failover test measures."""
    return compare_routing(cluster, model_of(cluster.url), LOAD)


def test_affinity_keeps_sessions_on_one_replica_and_round_robin_loses_the_cache(routing: Routing) -> None:
    ratios = routing.hit_ratios()
    print(f"hit ratios over {LOAD.sessions} sessions x {LOAD.turns} turns: {ratios}")
    assert all(len(where) == 1 for where in routing.pinned.values()), routing.pinned
    assert {where[0] for where in routing.pinned.values()} == {0, 1}, "both replicas serve some sessions"
    assert sum(len(where) == 2 for where in routing.spread.values()) >= LOAD.sessions - 1, routing.spread
    assert abs(ratios["affinity"] - ratios["single"]) <= 0.05
    assert ratios["single"] > 0.7
    assert ratios["round_robin"] <= ratios["affinity"] - 0.1
    # After its first turn an affinity session's every turn extends the prefix it left on its replica.
    assert {r.first_changed_block for r in routing.affinity if r.turn > 0} == {"state"}


class Background:
    """Ordinary clients sending turns through the router until stopped; what completed, and what failed."""

    def __init__(self, url: str, model: str, sessions: int) -> None:
        self.url, self.model = url, model
        self.names = [f"bg-{i}" for i in range(sessions)]
        self.completed: dict[str, int] = dict.fromkeys(self.names, 0)  # completion tokens of completed replies
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        histories = {n: [{"role": "system", "content": system_prompt(n, 40, 1)}] for n in self.names}
        with httpx.Client(base_url=self.url, timeout=120) as http:
            turn = 0
            while not self._stop.is_set():
                for name in self.names:
                    histories[name].append({"role": "user", "content": f"Background turn {turn}."})
                    try:
                        reply = chat(http, self.model, name, histories[name], 4)
                    except (RuntimeError, httpx.HTTPError) as exc:  # cut off by the kill: never completed
                        self.failures.append(f"{name}: {exc}")
                        histories[name].pop()
                        continue
                    histories[name].append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]
                                            or "-"})
                    self.completed[name] += reply["usage"]["completion_tokens"]
                turn += 1


def lake_outputs(lake: Lake, session: str) -> list[dict]:
    return lake.recall(session_id=session, event_types="output", limit=10_000, owner=EVERY)


def wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.5)


def test_a_killed_replica_fails_over_from_the_lake_and_every_chain_verifies(cluster: LocalCluster, lake: Lake,
                                                                            routing: Routing) -> None:
    model = model_of(cluster.url)
    sessions = [f"kept-{i}" for i in range(4)]
    contexts = {s: {"session_id": s, "identity": system_prompt(s, 60, 2)} for s in sessions}
    completed: dict[str, int] = dict.fromkeys(sessions, 0)
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        for question in ("Where is the first particle?", "And the second one?"):
            for s in sessions:
                reply = chat(http, model, s, [{"role": "user", "content": question}], 4, contexts[s])
                completed[s] += reply["usage"]["completion_tokens"]
    where = holders(cluster.replicas, sessions)
    victim = where[sessions[0]][0]
    moved = [s for s in sessions if where[s] == [victim]]
    survivor = cluster.replicas[1 - victim]

    with Background(cluster.url, model, sessions=3) as background:
        time.sleep(2)
        killed = time.monotonic()
        cluster.kill(victim)
        seconds, report = first_token_s(cluster.url, model, moved[0], contexts[moved[0]], "Still there?", killed)
        print(f"failover: first token {seconds:.2f} s after the kill")
        assert report["first_changed_block"] == "replica" and report["session_id"] == moved[0]
        state = next(b for b in report["blocks"] if b["name"] == "state")
        assert state["tokens"] > 0  # the two turns the dead replica served came from the lake
        assert seconds < 30
        check_result("cluster", json.loads(result_of(LOAD, routing, seconds).to_json()))
        time.sleep(3)  # the load goes on through the survivor alone
    assert sum(background.completed.values()) > 0

    # Every moved session goes on at the survivor; the router sends nothing to the dead replica.
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        for s in moved[1:]:
            reply = chat(http, model, s, [{"role": "user", "content": "And now?"}], 4, contexts[s])
            assert reply["context"]["first_changed_block"] == "replica"
    after = holders([survivor], moved)
    assert all(after[s] == [0] for s in moved)

    # The killed replica comes back on its data dir: what it had committed but not shipped goes to the lake.
    cluster.restart(victim)
    assert cluster.replicas[victim].http().get("/health").status_code == 200
    for s in sessions:  # every reply completed before the kill is in the lake (States shipped with them)
        assert len(lake_outputs(lake, s)) >= completed[s], s
    for name, tokens in background.completed.items():
        wait_for(lambda name=name, tokens=tokens: len(lake_outputs(lake, name)) >= tokens, 30,
                 f"{name}'s completed replies in the lake")
    rows = lake.recall(event_types="output", limit=10_000, owner=EVERY)
    assert len(rows) < 10_000, "every output row fits one recall"
    keys = [(r["replica"], r["id"]) for r in rows]
    assert len(keys) == len(set(keys)), "a row shipped twice"
    assert {r["replica"] for r in rows} == {replica_id(0), replica_id(1)}
    chains = lake.verify_audit()
    assert set(chains) >= {replica_id(0), replica_id(1)}
    assert all(report.ok and report.records_checked > 0 for report in chains.values()), chains


def test_cluster_reads_see_every_replica(cluster: LocalCluster) -> None:
    """Any replica answers cluster-wide recall from the lake, its own rows and the other's."""
    with httpx.Client(base_url=cluster.url, timeout=60) as http:
        for s in ("read-a", "read-b", "read-c", "read-d"):
            chat(http, model_of(cluster.url), s, [{"role": "user", "content": f"Hello from {s}"}], 2)
    wait_for(lambda: all(_cluster_recall(r.base_url, "read-") >= 4 for r in cluster.replicas), 30,
             "every replica sees all four sessions' inputs")


def _cluster_recall(base_url: str, prefix: str) -> int:
    response = httpx.get(f"{base_url}/v1/xdb/recall", params={"scope": "cluster", "event_types": "input",
                                                               "text": "Hello from", "limit": 1000}, timeout=60)
    response.raise_for_status()
    rows = response.json()["data"]
    assert all("replica" in r for r in rows)
    return len({r["session_id"] for r in rows if r["session_id"].startswith(prefix)})


def test_a_session_deleted_on_one_replica_is_gone_from_every_replica(cluster: LocalCluster) -> None:
    """Served on one replica, then on the other (which holds it in memory and in its own files), then
    deleted on the first: the next turn anywhere starts afresh, and the word said is found nowhere."""
    model, session, secret = model_of(cluster.url), "gone-1", "xylophone"
    context = {"session_id": session, "identity": "You keep notes."}
    first, second = (r.http(timeout=120) for r in cluster.replicas)
    try:
        chat(first, model, session, [{"role": "user", "content": f"The password is {secret}."}], 2, context)
        reply = chat(second, model, session, [{"role": "user", "content": "Noted?"}], 2, context)
        assert next(b for b in reply["context"]["blocks"] if b["name"] == "state")["tokens"] > 0  # resumed

        deleted = first.delete(f"/v1/context/sessions/{session}")
        assert deleted.status_code == 200, deleted.text
        recalled = first.get("/v1/xdb/recall", params={"scope": "cluster", "text": secret}).raise_for_status()
        assert recalled.json()["data"] == []

        # The second replica still held the session in memory and in its files: neither comes back.
        reply = chat(second, model, session, [{"role": "user", "content": "What was the password?"}], 2, context)
        assert next(b for b in reply["context"]["blocks"] if b["name"] == "state")["tokens"] == 0
        wait_for(lambda: not second.get("/v1/xdb/recall", params={"session_id": session, "text": secret})
                 .raise_for_status().json()["data"], 30, "the second replica's own copies deleted")
        again = second.get("/v1/xdb/recall", params={"session_id": session, "text": "What was the password"})
        assert again.raise_for_status().json()["data"], "the turn after the deletion is recorded"
    finally:
        first.close()
        second.close()


def test_the_router_passes_errors_and_the_context_field_through(cluster: LocalCluster) -> None:
    model = model_of(cluster.url)
    with httpx.Client(base_url=cluster.url, timeout=60) as http:
        bad = http.post("/v1/chat/completions", headers={HEADER: "err-1"},
                        json={"model": model, "messages": [{"role": "user", "content": "x"}],
                              "context": {"session_id": "err-1", "codex": [{"id": 5}]}})
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("context.codex.0")
        conflict = http.post("/v1/chat/completions", headers={HEADER: "a"},
                             json={"model": model, "messages": [{"role": "user", "content": "x"}],
                                   "context": {"session_id": "b"}})
        assert conflict.status_code == 400 and conflict.json()["error"]["param"] == HEADER
        with http.stream("POST", "/v1/chat/completions", headers={HEADER: "stream-1"},
                         json={"model": model, "stream": True, "max_tokens": 3,
                               "messages": [{"role": "user", "content": "x"}],
                               "context": {"session_id": "stream-1"}}) as stream:
            assert stream.headers["x-session-id"] == "stream-1"
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and '"context"' in lines[0]
        # The router's own routes stay behind the guard; nothing grants a web page CORS access.
        assert http.post(f"/add_worker?url=http://127.0.0.1:{free_port()}", headers=EVIL).status_code == 404
        assert http.get("/list_workers").status_code == 404
        assert "access-control-allow-origin" not in http.get("/v1/models", headers=EVIL).headers


def test_ahc_cluster_starts_and_stops_everything_on_sigterm(tmp_path_factory: pytest.TempPathFactory) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="ahc-test-cli-cluster-"))
    data_dir.chmod(0o755)  # the catalog runs as `postgres` when the tests run as root
    port = free_port()
    log = tmp_path_factory.mktemp("cli-cluster") / "cluster.log"
    process: subprocess.Popen[bytes] | None = None
    # As a user starts it, its replica its own child (not the suite's fork server's).
    env = {name: value for name, value in child_env().items() if name != fork_server.ENV}
    try:
        with log.open("w") as out:
            process = subprocess.Popen([AHC, "cluster", str(TINY_MODEL), "--config", "cpu-tiny", "--replicas", "1",
                                        "--port", str(port), "--data-dir", str(data_dir)],
                                       stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: "router on" in log.read_text() or process.poll() is not None, 600, "the cluster up")
        assert process.poll() is None, log.read_text()[-3000:]
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={HEADER: "cli-1"}, timeout=120,
                           json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200 and reply.headers["x-session-id"] == "cli-1"
        assert "access-control-allow-origin" not in reply.headers
        assert httpx.post(f"http://127.0.0.1:{port}/add_worker?url=http://127.0.0.1:{free_port()}",
                          headers=EVIL, timeout=30).status_code == 404
        children = psutil.Process(process.pid).children(recursive=True)
        assert len(children) >= 2  # the replica and the router
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0, log.read_text()[-3000:]
        assert "cluster stopped" in log.read_text()
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        postmaster = data_dir / "catalog" / "pgdata" / "postmaster.pid"
        assert not postmaster.exists(), "the catalog's PostgreSQL was stopped"
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        shutil.rmtree(data_dir, ignore_errors=True)
