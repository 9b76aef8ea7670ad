"""Standing load check: many concurrent streaming sessions against one real server, through every door
(Chat Completions with `context`, the Messages API, the Responses API), then every completed reply's
tokens in XDB and the audit chain intact after a SIGTERM.

The sessions belong to two tenants (half each), while a third tenant exports its data and asks for
audit verifications in a loop, and streams a session of its own that it deletes again and again: nothing
but deliberate 429/503 refusals anywhere, every completed reply recorded, each tenant sees exactly its own
sessions, and every verification finds the log intact.

Figures (TTFT percentiles, replies, tokens, deliberate refusals) are printed (`pytest -s`) and written to
`load.json` under the test's tmp_path, so a run can be compared with the last."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import numpy as np
import openai
import pytest

from bench.servers import TINY_MODEL, recall_until, start_server
from server.cluster.server_process import AHC, ServerProcess, child_env

pytestmark = [pytest.mark.slow, pytest.mark.engine]

# Long enough for every session to grow State past its first turns (about a dozen replies a session on the
# tiny model here, 405 in all) and for the XDB writer to batch under pressure (32 sessions streaming at
# once), short enough that the whole test, a server start included, stays under a minute.
DURATION_S = 15.0
SESSIONS = 32
MAX_TOKENS = 16
TENANTS = {"alice": "alice-key", "bob": "bob-key"}
THIRD_PARTY = ("carol", "carol-key")  # exports and verifies, runs no session
# A deliberate refusal asks the client to come back; honouring it (bounded) keeps the loop from
# hammering a server that said it is full, without one long Retry-After eating the whole run.
MAX_BACKOFF_S = 2.0
# Rows become queryable within about a second of the reply; a loaded writer gets a little longer.
RECALL_TIMEOUT_S = 5.0

CODEX = [{"id": "ring", "text": "A ring of 64 cells. Particle A moves right one cell per step; "
                                "particle B moves left; when they meet both vanish."}]


@dataclass
class SessionResult:
    session_id: str
    tenant: str
    replies: int = 0
    completion_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)  # status -> count, deliberate 429/503
    errors: list[str] = field(default_factory=list)


def tenant_of(index: int) -> str:
    return sorted(TENANTS)[index % len(TENANTS)]


def as_tenant(server: ServerProcess, tenant: str) -> ServerProcess:
    key = THIRD_PARTY[1] if tenant == THIRD_PARTY[0] else TENANTS[tenant]
    return dataclasses.replace(server, api_key=key)


DOORS = ("chat", "chat", "messages", "responses")  # a session's door, by its index


@dataclass
class Turn:
    """What one streamed reply came to: its completion tokens and time to first token (None: none)."""

    tokens: int
    ttft: float | None


def run_session(server: ServerProcess, model: str, index: int, deadline: float) -> SessionResult:
    """Turns back to back until the deadline; a turn started before it runs to completion. Half the
    sessions speak Chat Completions with a `context` (server-kept State), a quarter the Messages API and
    a quarter the Responses API, each naming its session in X-Session-ID."""
    result = SessionResult(f"load-{index:02d}", tenant_of(index))
    server = as_tenant(server, result.tenant)
    door = DOORS[index % len(DOORS)]
    identity = f"You are observer {index}, who watches a ring of cells."
    context = {"session_id": result.session_id, "identity": identity, "codex": CODEX,
               "karma": [{"id": "k1", "text": f"Observer {index} counts particles twice."}]}
    header = {"X-Session-ID": result.session_id}
    client = server.client(timeout=120)
    anthropic_client = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0,
                                           timeout=120)
    turn = 0
    while time.monotonic() < deadline:
        turn += 1
        question = f"Turn {turn}: where is particle A now?"
        start = time.monotonic()
        try:
            if door == "chat":
                got = chat_turn(client, model, question, context, start)
            elif door == "messages":
                got = messages_turn(anthropic_client, model, question, identity, header, start)
            else:
                got = responses_turn(client, model, question, identity, header, start)
        except (openai.APIStatusError, anthropic.APIStatusError) as exc:
            if exc.status_code in (429, 503):
                retry_after = exc.response.headers.get("retry-after")
                result.refused[exc.status_code] += 1
                if retry_after is None:
                    result.errors.append(f"{door} turn {turn}: {exc.status_code} without Retry-After")
                    continue
                time.sleep(min(float(retry_after), MAX_BACKOFF_S, max(0.0, deadline - time.monotonic())))
                continue
            result.errors.append(f"{door} turn {turn}: {exc.status_code} {exc.message}")
            continue
        except (openai.APIError, anthropic.APIError) as exc:  # an error event in the stream, a dropped connection
            result.errors.append(f"{door} turn {turn}: {type(exc).__name__} {exc}")
            continue
        if got is None:
            result.errors.append(f"{door} turn {turn}: stream ended without usage or a finish")
            continue
        result.replies += 1
        result.completion_tokens += got.tokens
        if got.ttft is not None:
            result.ttft.append(got.ttft)
    client.close()
    anthropic_client.close()
    return result


def chat_turn(client: openai.OpenAI, model: str, question: str, context: dict, start: float) -> Turn | None:  # type: ignore[type-arg]
    stream = client.chat.completions.create(
        model=model, max_tokens=MAX_TOKENS, temperature=0, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": question}], extra_body={"context": context})
    first: float | None = None
    usage = finish = None
    for chunk in stream:
        if chunk.choices:
            choice = chunk.choices[0]
            if first is None and choice.delta.content:
                first = time.monotonic() - start
            finish = choice.finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    return None if usage is None or finish is None else Turn(usage.completion_tokens, first)


def messages_turn(client: anthropic.Anthropic, model: str, question: str, identity: str,
                  header: dict[str, str], start: float) -> Turn | None:
    first: float | None = None
    with client.messages.stream(model=model, max_tokens=MAX_TOKENS, system=identity, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": question}], extra_headers=header) as stream:
        for text in stream.text_stream:
            if first is None and text:
                first = time.monotonic() - start
        final = stream.get_final_message()
    return None if final.stop_reason is None else Turn(final.usage.output_tokens, first)


def responses_turn(client: openai.OpenAI, model: str, question: str, identity: str, header: dict[str, str],
                   start: float) -> Turn | None:
    first: float | None = None
    completed = None
    stream = client.responses.create(model=model, instructions=identity, input=question, max_output_tokens=MAX_TOKENS,
                                     temperature=0, stream=True, store=False, extra_headers=header)
    for event in stream:
        if event.type == "response.output_text.delta" and first is None and event.delta:
            first = time.monotonic() - start
        if event.type == "response.completed":
            completed = event.response
    if completed is None or completed.usage is None:
        return None
    return Turn(completed.usage.output_tokens, first)


@dataclass
class ThirdParty:
    """What the exporting, verifying tenant got: successes and deliberate refusals by route, errors."""

    done: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


DOOMED = "carol-doomed"  # the third party's session, deleted while it streams


def stream_and_delete(server: ServerProcess, model: str, stop: threading.Event, out: ThirdParty) -> None:
    """Stream turns of one session while deleting it every 200 ms: each deletion retires what the stream
    has recorded so far, and the rows recorded after it stay readable in the audit log."""
    tenant = as_tenant(server, THIRD_PARTY[0])

    def deleter() -> None:
        with tenant.http(timeout=120) as http:
            while not stop.wait(0.2):
                gone = http.delete(f"/v1/context/sessions/{DOOMED}")
                if gone.status_code == 200:
                    out.done["delete"] += 1
                elif gone.status_code != 404:  # not recorded yet since the last deletion
                    out.errors.append(f"delete session: {gone.status_code} {gone.text[:200]}")

    thread = threading.Thread(target=deleter, name="load-deleter")
    thread.start()
    with tenant.client(timeout=120) as client:
        while not stop.is_set():
            try:
                for _ in client.chat.completions.create(
                        model=model, max_tokens=MAX_TOKENS, stream=True,
                        messages=[{"role": "user", "content": "Count the particles."}],
                        extra_headers={"X-Session-ID": DOOMED}):
                    pass
                out.done["doomed_turn"] += 1
            except openai.APIStatusError as exc:
                if exc.status_code not in (429, 503):
                    out.errors.append(f"doomed turn: {exc.status_code} {exc.message}")
                stop.wait(0.2)
    thread.join()


def export_and_verify(server: ServerProcess, stop: threading.Event, out: ThirdParty) -> None:
    """Export everything the tenant holds, delete the export, ask for an audit verification; again."""
    with as_tenant(server, THIRD_PARTY[0]).http(timeout=120) as http:
        while not stop.is_set():
            for route, call in (("export", lambda: http.post("/v1/xdb/exports", json={"format": "parquet"})),
                                ("verify", lambda: http.post("/v1/xdb/audit/verify"))):
                response = call()
                if response.status_code in (429, 503) and "retry-after" in response.headers:
                    out.refused[route] += 1
                elif response.status_code != 200:
                    out.errors.append(f"{route}: {response.status_code} {response.text[:200]}")
                else:
                    out.done[route] += 1
                    if route == "verify" and not response.json().get("ok"):
                        out.errors.append(f"verify: {response.text[:300]}")
                    if route == "export":
                        gone = http.delete(f"/v1/xdb/exports/{response.json()['id']}")
                        if gone.status_code != 200:
                            out.errors.append(f"delete export: {gone.status_code} {gone.text[:200]}")
            stop.wait(0.5)


def sessions_seen(server: ServerProcess, tenant: str) -> set[str]:
    with as_tenant(server, tenant).http() as http:
        response = http.get("/v1/context/sessions", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return {row["session_id"] for row in response.json()["data"]}


def percentile(values: list[float], q: float) -> float:
    """numpy's percentile; inf for no values, so an empty run fails the finiteness check."""
    return float(np.percentile(values, q)) if values else math.inf


def test_concurrent_streaming_sessions_lose_nothing(tmp_path: Path) -> None:
    if not (TINY_MODEL / "config.json").exists():
        raise RuntimeError("the tiny model is missing: run `make setup` first")
    data_dir = tmp_path / "xdb"
    keys = tmp_path / "keys.txt"
    keys.write_text("".join(f"{name}: {key}\n" for name, key in [*TENANTS.items(), THIRD_PARTY]))
    server = start_server(data_dir, extra=["--api-keys-file", str(keys)])
    third = ThirdParty()
    try:
        with as_tenant(server, "alice").client() as probe:
            model = probe.models.list().data[0].id
        results: list[SessionResult | None] = [None] * SESSIONS
        deadline = time.monotonic() + DURATION_S

        def worker(i: int) -> None:
            try:
                results[i] = run_session(server, model, i, deadline)
            except Exception as exc:  # noqa: BLE001 - an unexpected failure must reach the assertions
                results[i] = SessionResult(f"load-{i:02d}", tenant_of(i), errors=[f"{type(exc).__name__}: {exc}"])

        def background(job: Callable[[], None]) -> None:
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - an unexpected failure must reach the assertions
                third.errors.append(f"{type(exc).__name__}: {exc}")

        stop = threading.Event()
        threads = [threading.Thread(target=worker, args=(i,), name=f"load-{i}") for i in range(SESSIONS)]
        third_party = [threading.Thread(target=background, args=(job,), name=f"load-third-{n}") for n, job in
                       enumerate([lambda: export_and_verify(server, stop, third),
                                  lambda: stream_and_delete(server, model, stop, third)])]
        began = time.monotonic()
        for t in third_party:
            t.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        for t in third_party:
            t.join()
        wall = time.monotonic() - began
        done = [r for r in results if r is not None]

        # Every completed reply's tokens are in XDB, and nothing else is recorded as output.
        missing = {}
        for r in done:
            rows = recall_until(as_tenant(server, r.tenant), r.completion_tokens, timeout=RECALL_TIMEOUT_S,
                                session_id=r.session_id, event_types="output", limit=10_000)
            requests = {row["request_id"] for row in rows}
            if len(rows) != r.completion_tokens or len(requests) != r.replies:
                missing[r.session_id] = dict(rows=len(rows), tokens=r.completion_tokens,
                                             requests=len(requests), replies=r.replies)
        # Each tenant sees exactly its own sessions; the third party, none.
        seen = {name: sessions_seen(server, name) for name in [*TENANTS, THIRD_PARTY[0]]}
    finally:
        status = server.stop()

    ttft = [t for r in done for t in r.ttft]
    refused = sum((r.refused for r in done), Counter())
    figures = {
        "sessions": SESSIONS, "duration_s": DURATION_S, "wall_s": round(wall, 1), "max_tokens": MAX_TOKENS,
        "replies": sum(r.replies for r in done), "completion_tokens": sum(r.completion_tokens for r in done),
        "ttft_p50_s": round(percentile(ttft, 50), 3), "ttft_p99_s": round(percentile(ttft, 99), 3),
        "refused_429": refused[429], "refused_503": refused[503],
        "errors": sum(len(r.errors) for r in done), "min_replies_per_session": min(r.replies for r in done),
        "server_exit": status, "exports": third.done["export"], "verifications": third.done["verify"],
        "third_party_refused": sum(third.refused.values()), "deletions_while_streaming": third.done["delete"],
    }
    (tmp_path / "load.json").write_text(json.dumps(figures, indent=2))
    print("\nload:", json.dumps(figures))

    errors = [f"{r.session_id} {e}" for r in done for e in r.errors] + [f"third party {e}" for e in third.errors]
    assert not errors, f"{len(errors)} errors, first ones: {errors[:10]}\n{server.log_tail()}"
    assert len(done) == SESSIONS and all(r.replies >= 1 for r in done), figures
    assert math.isfinite(figures["ttft_p99_s"]), figures
    assert not missing, f"XDB output rows differ from the replies' usage: {missing}"
    for name in TENANTS:
        assert seen[name] == {r.session_id for r in done if r.tenant == name}, (name, seen[name])
    assert seen[THIRD_PARTY[0]] <= {DOOMED}, seen[THIRD_PARTY[0]]  # what it recorded since its last deletion
    assert third.done["export"] >= 1 and third.done["verify"] >= 1 and third.done["delete"] >= 5, figures
    assert status == 0, f"server exited {status} on SIGTERM:\n{server.log_tail()}"
    verify = subprocess.run([AHC, "xdb", "verify-audit", "--data-dir", str(data_dir)], capture_output=True,
                            text=True, env=child_env())
    assert verify.returncode == 0, verify.stdout + verify.stderr
