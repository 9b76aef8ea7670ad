"""`ahc bench cluster`: agents on two replicas behind vLLM's router, session affinity against round robin,
and a replica killed under load.

One local cluster (`ahc cluster`'s: PostgreSQL catalog, DuckLake, two tiny replicas, the router hashing
`X-Session-ID`) and, in the same run, a second router over the same replicas with `round_robin`. The
load is ordinary OpenAI clients: each of `sessions` agents resends its whole history every turn with
its session in `X-Session-ID`; the sessions' turns are interleaved in a new seeded order every round, so
round robin cannot pin a session by accident. Each load uses new session names and new system prompts,
so no load reuses another's cache. Reported: the hit ratio (cached / prompt tokens over every turn) on
one replica alone, through the affinity router and through the round-robin one, and the failover time:
from a SIGKILL of the replica holding a session to the first token of that session's next turn, which
the survivor serves from the State in the lake.

The load is `LOADS` (bench/load.py): `BENCH_CLUSTER_LOAD="smoke"` or e.g. `"sessions=4,turns=5"`.
"""

from __future__ import annotations

import dataclasses
import json
import random
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.load import DEFAULT, SMOKE, Loads
from bench.orchestrator import WORDS
from bench.result import BenchResult
from bench.servers import TINY_MODEL
from server.cluster.local_cluster import ClusterSpec, LocalCluster
from server.cluster.router import RouterProcess
from server.cluster.server_process import ServerProcess, free_port

HEADER = "X-Session-ID"
TIMEOUT_S = 300


@dataclass(frozen=True)
class ClusterLoad:
    sessions: int = 8
    turns: int = 10
    max_tokens: int = 6
    system_words: int = 60
    observation_words: int = 60  # what each turn adds, as a tool's observation would
    seed: int = 0


@dataclass(frozen=True)
class TurnRecord:
    session: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    first_changed_block: str | None


LOADS = Loads("cluster", {DEFAULT: ClusterLoad(), SMOKE: ClusterLoad(sessions=4, turns=5)})


def system_prompt(name: str, words: int, seed: int) -> str:
    """A system prompt of its own per session, so sessions share no prefix."""
    rng = random.Random(f"{seed}:{name}")
    return f"You are agent {name}. " + " ".join(rng.choice(WORDS) for _ in range(words))


def observation(name: str, turn: int, load: ClusterLoad) -> str:
    rng = random.Random(f"{load.seed}:{name}:{turn}")
    return f"Turn {turn}, observed: " + " ".join(rng.choice(WORDS) for _ in range(load.observation_words))


def chat(http: httpx.Client, model: str, session: str, messages: list[dict[str, Any]], max_tokens: int,
         context: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if context is not None:
        body["context"] = context
    response = http.post("/v1/chat/completions", json=body, headers={HEADER: session})
    if response.status_code != 200:
        raise RuntimeError(f"session {session}: {response.status_code} {response.text[:300]}")
    reply: dict[str, Any] = response.json()
    return reply


def run_load(base_url: str, model: str, names: Sequence[str], load: ClusterLoad,
             api_key: str | None = None) -> list[TurnRecord]:
    """Every session's turns, interleaved in a new seeded order each round; ordinary clients that resend
    their history, naming their session in the header."""
    histories = {n: [{"role": "system", "content": system_prompt(n, load.system_words, load.seed)}] for n in names}
    records: list[TurnRecord] = []
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url, headers=headers, timeout=TIMEOUT_S) as http:
        for turn in range(load.turns):
            order = list(names)
            random.Random(f"{load.seed}:{turn}").shuffle(order)
            for name in order:
                history = histories[name]
                history.append({"role": "user", "content": observation(name, turn, load)})
                reply = chat(http, model, name, history, load.max_tokens)
                history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"] or "-"})
                usage = reply["usage"]
                records.append(TurnRecord(name, turn, usage["prompt_tokens"],
                                          (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                                          usage["completion_tokens"], reply["context"]["first_changed_block"]))
    return records


def hit_ratio(records: Iterable[TurnRecord]) -> float:
    records = list(records)
    prompt = sum(r.prompt_tokens for r in records)
    return sum(r.cached_tokens for r in records) / prompt if prompt else 0.0


def holders(replicas: Sequence[ServerProcess], sessions: Iterable[str]) -> dict[str, list[int]]:
    """For each session, the replicas whose own XDB recorded any of its rows."""
    found: dict[str, list[int]] = {}
    clients = [r.http(timeout=60) for r in replicas]
    try:
        for session in sessions:
            found[session] = [i for i, http in enumerate(clients)
                              if http.get("/v1/xdb/recall", params={"session_id": session, "limit": 1})
                              .raise_for_status().json()["data"]]
    finally:
        for http in clients:
            http.close()
    return found


def first_token_s(base_url: str, model: str, session: str, context: dict[str, Any], question: str,
                  started: float, api_key: str | None = None) -> tuple[float, dict[str, Any]]:
    """Stream one turn of a server-kept session; the seconds from `started` to its first token, and
    the cache report the stream opened with."""
    headers = {HEADER: session, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    body = {"model": model, "stream": True, "max_tokens": 4, "temperature": 0, "context": context,
            "messages": [{"role": "user", "content": question}]}
    report: dict[str, Any] = {}
    with httpx.Client(base_url=base_url, headers=headers, timeout=TIMEOUT_S) as http, \
            http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"session {session}: {response.status_code} {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            report = report or chunk.get("context") or {}
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                return time.monotonic() - started, report
    raise RuntimeError(f"session {session}: the stream ended without a token")


def model_of(base_url: str, api_key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=60).raise_for_status()
    return str(response.json()["data"][0]["id"])


def run(load: ClusterLoad, data_dir: Path | None = None) -> BenchResult:
    with tempfile.TemporaryDirectory(prefix="ahc-bench-cluster-") as tmp:
        Path(tmp).chmod(0o755)  # as root, the catalog's PostgreSQL runs as `postgres` under it
        spec = ClusterSpec(Path(data_dir or tmp), replicas=2, model=str(TINY_MODEL), config="cpu-tiny",
                           port=free_port())
        with LocalCluster(spec) as cluster:
            return measure(cluster, load)


@dataclass(frozen=True)
class Routing:
    """One load three ways: on one replica alone, through the affinity router, through round robin; and
    for the routed loads, which replicas recorded each session."""

    single: list[TurnRecord]
    affinity: list[TurnRecord]
    round_robin: list[TurnRecord]
    pinned: dict[str, list[int]]
    spread: dict[str, list[int]]

    def hit_ratios(self) -> dict[str, float]:
        return {"single": hit_ratio(self.single), "affinity": hit_ratio(self.affinity),
                "round_robin": hit_ratio(self.round_robin)}


def compare_routing(cluster: LocalCluster, model: str, load: ClusterLoad) -> Routing:
    """The same load (new session names and prompts each time) on replica 0 directly, through the
    cluster's router, and through a round-robin router started over the same replicas."""
    names = [f"s{i}" for i in range(load.sessions)]
    single = run_load(cluster.replicas[0].base_url, model, [f"single-{n}" for n in names], load)
    affinity = run_load(cluster.url, model, [f"affinity-{n}" for n in names], load)
    rr_spec = dataclasses.replace(cluster.router_spec(), policy="round_robin", port=free_port(),
                                  metrics_port=free_port())
    with RouterProcess(rr_spec, cluster.data_dir / "router-round-robin.log") as rr:
        round_robin = run_load(rr.url, model, [f"rr-{n}" for n in names], load)
    return Routing(single, affinity, round_robin, holders(cluster.replicas, [f"affinity-{n}" for n in names]),
                   holders(cluster.replicas, [f"rr-{n}" for n in names]))


def measure(cluster: LocalCluster, load: ClusterLoad) -> BenchResult:
    model = model_of(cluster.url)
    routing = compare_routing(cluster, model, load)
    return result_of(load, routing, failover(cluster, model))


def result_of(load: ClusterLoad, routing: Routing, failover_s: float) -> BenchResult:
    """The bench's figures and ratios from one routing comparison and one failover time."""
    ratios_ = routing.hit_ratios()
    figures = {"single_hit_ratio": ratios_["single"], "affinity_hit_ratio": ratios_["affinity"],
               "round_robin_hit_ratio": ratios_["round_robin"],
               "affinity_sessions_on_one_replica": sum(len(v) == 1 for v in routing.pinned.values()),
               "round_robin_sessions_on_one_replica": sum(len(v) == 1 for v in routing.spread.values()),
               "sessions": load.sessions, "turns": load.turns, "failover_first_token_s": failover_s}
    # The tokens each setup had to prefill: what round robin costs in engine time.
    missed = {k: 1 - v for k, v in ratios_.items()}
    ratios = {"affinity_over_single": ratios_["affinity"] / max(ratios_["single"], 1e-9),
              "round_robin_over_affinity": ratios_["round_robin"] / max(ratios_["affinity"], 1e-9),
              "round_robin_prefill_over_affinity": missed["round_robin"] / max(missed["affinity"], 1e-9)}
    return BenchResult("cluster", figures, ratios)


def failover(cluster: LocalCluster, model: str, session: str = "failover-0") -> float:
    """A server-kept session through the router for two turns, then SIGKILL to the replica holding it;
    the seconds from the kill to the first token of its next turn (served by the survivor, resumed from
    the State in the lake). The killed replica is started again afterwards."""
    context = {"session_id": session, "identity": system_prompt(session, 60, 0)}
    with httpx.Client(base_url=cluster.url, timeout=TIMEOUT_S) as http:
        for question in ("Where is the first particle?", "And the second?"):
            chat(http, model, session, [{"role": "user", "content": question}], 4, context)
    (victim,) = holders(cluster.replicas, [session])[session]
    killed = time.monotonic()
    cluster.kill(victim)
    seconds, report = first_token_s(cluster.url, model, session, context, "Still there?", killed)
    if report.get("first_changed_block") != "replica":
        raise RuntimeError(f"the survivor did not report the move: {report}")
    cluster.restart(victim)
    return seconds
