"""A streaming chat load on any OpenAI-compatible server, and the figures taken from one round of it.

Every client runs in one asyncio event loop over one aiohttp session, parsing only the SSE lines it
needs: with 32-64 streams, a thread per client with the `openai` client would spend a core of its own
and the client, not the server, would set the pace. The client's own CPU is measured anyway, so a
report shows when it comes close.

Latency is measured at the client: TTFT from sending the request to the first chunk with content,
inter-token latency as the gaps between successive content chunks of one reply (a server that falls
behind sends several tokens in one chunk, which shows as fewer, longer gaps)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np
import psutil


@dataclass(frozen=True)
class Load:
    """`clients` concurrent clients, each sending `requests` streaming chat requests of exactly
    `max_tokens` tokens (`ignore_eos`) one after another."""

    clients: int
    requests: int
    max_tokens: int

    @property
    def expected_tokens(self) -> int:
        return self.clients * self.requests * self.max_tokens


@dataclass(frozen=True)
class Target:
    """A server to load: where, which model, and the pid of its API process when its CPU is measured."""

    base_url: str
    model: str
    api_key: str | None = None
    pid: int | None = None
    api_pids: tuple[int, ...] = ()  # the API processes when there are several (`--api-server-count`)
    xdb_pid: int | None = None  # AHC's XDB service process, measured on its own
    engine_pids: tuple[int, ...] = ()  # the other processes under the API process (vLLM's EngineCore)


@dataclass
class TimedReply:
    """One streamed reply: when it was sent, when each chunk with content arrived and when the stream
    ended (perf_counter seconds), its completion tokens (from the usage chunk), and AHC's XDB session
    of it."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    session_id: str | None = None
    ended: float | None = None

    @property
    def end_wait(self) -> float | None:
        """From the last token to the stream's end: what a client waits for the reply's finish (on AHC,
        the commit that makes the reply durable before it ends)."""
        return None if self.ended is None or not self.chunk_times else self.ended - self.chunk_times[-1]

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


@dataclass
class Round:
    """One round of a load on one server."""

    replies: list[TimedReply]
    wall_s: float
    client_cpu_s: float
    api_cpu_s: float | None  # None when the API process is not known
    xdb_cpu_s: float | None = None  # AHC's XDB service process, when known
    engine_cpu_s: float | None = None  # the engine core (every other process under the API process)

    @property
    def tokens(self) -> int:
        return sum(r.completion_tokens for r in self.replies)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def cpu_us_per_token(self) -> float | None:
        return None if self.api_cpu_s is None else cpu_us_per_token(self.api_cpu_s, self.tokens)

    @property
    def xdb_cpu_us_per_token(self) -> float | None:
        return None if self.xdb_cpu_s is None else cpu_us_per_token(self.xdb_cpu_s, self.tokens)

    @property
    def engine_cpu_us_per_token(self) -> float | None:
        return None if self.engine_cpu_s is None else cpu_us_per_token(self.engine_cpu_s, self.tokens)

    @property
    def cpu_us_per_request(self) -> float | None:
        """The API process's CPU a reply (its per-request and per-token work together)."""
        return None if self.api_cpu_s is None or not self.replies else self.api_cpu_s / len(self.replies) * 1e6

    @property
    def cores(self) -> dict[str, float]:
        """Cores each process kept busy on average over the round (CPU seconds over wall seconds)."""
        used = {"api": self.api_cpu_s, "xdb": self.xdb_cpu_s, "engine": self.engine_cpu_s, "client": self.client_cpu_s}
        return {name: cpu / self.wall_s for name, cpu in used.items() if cpu is not None}

    @property
    def client_cpu_us_per_token(self) -> float:
        return cpu_us_per_token(self.client_cpu_s, self.tokens)

    @property
    def chunks(self) -> int:
        return sum(len(r.chunk_times) for r in self.replies)


def processes_cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these processes together (each alone, as `process_cpu_s`); one that has
    ended counts nothing."""
    total = 0.0
    for pid in pids:
        try:
            total += process_cpu_s(pid)
        except psutil.NoSuchProcess:
            continue
    return total


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of this one process, all its threads; its child processes (vLLM's
    EngineCore) are not included, alive or finished."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def cpu_us_per_token(cpu_s: float, tokens: int) -> float:
    return cpu_s / tokens * 1e6 if tokens else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """numpy's q-th percentile (0-100, linear between order statistics); NaN for no values, so a run
    that measured nothing shows as such instead of raising."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def latency_ms(rounds: Sequence[Round]) -> dict[str, float]:
    """TTFT, inter-token latency and the wait from last token to the stream's end, p50/p99 in ms, over
    every reply of the rounds together (p99 of one round's 32 TTFTs would be its slowest one)."""
    ttfts = [r.ttft for rnd in rounds for r in rnd.replies if r.chunk_times]
    gaps = [g for rnd in rounds for r in rnd.replies for g in r.gaps()]
    ends = [w for rnd in rounds for r in rnd.replies if (w := r.end_wait) is not None]
    return {"ttft_p50_ms": percentile(ttfts, 50) * 1e3, "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
            "itl_p50_ms": percentile(gaps, 50) * 1e3, "itl_p99_ms": percentile(gaps, 99) * 1e3,
            "end_wait_p50_ms": percentile(ends, 50) * 1e3, "end_wait_p99_ms": percentile(ends, 99) * 1e3}


def parse_event(line: bytes, reply: TimedReply, now: float) -> None:
    """Take what the figures need from one SSE line of a chat completion stream."""
    if not line.startswith(b"data: {"):
        return
    data = json.loads(line[6:])
    choices = data.get("choices")
    if choices and choices[0].get("delta", {}).get("content"):
        reply.chunk_times.append(now)
    if reply.session_id is None and isinstance(data.get("context"), dict):
        reply.session_id = data["context"].get("session_id")
    if data.get("usage"):
        reply.completion_tokens = data["usage"]["completion_tokens"]


async def one_reply(session: aiohttp.ClientSession, target: Target, load: Load, client: int,
                    request: int) -> TimedReply:
    body = {"model": target.model, "max_tokens": load.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Client {client}, request {request}: what do the particles do?"}]}
    reply = TimedReply(sent=time.perf_counter())
    async with session.post(f"{target.base_url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{target.base_url} answered {response.status}: {(await response.text())[:500]}")
        async for line in response.content:
            parse_event(line, reply, time.perf_counter())
    reply.ended = time.perf_counter()
    return reply


async def run_round(target: Target, load: Load) -> Round:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:

        async def client(c: int) -> list[TimedReply]:
            return [await one_reply(session, target, load, c, i) for i in range(load.requests)]

        api = target.api_pids or ((target.pid,) if target.pid else ())
        api_before = processes_cpu_s(api) if api else None
        xdb_before = process_cpu_s(target.xdb_pid) if target.xdb_pid else None
        engine_before = processes_cpu_s(target.engine_pids) if target.engine_pids else None
        client_before, started = time.process_time(), time.perf_counter()
        replies = [r for rs in await asyncio.gather(*(client(c) for c in range(load.clients))) for r in rs]
        wall, client_cpu = time.perf_counter() - started, time.process_time() - client_before
        api_cpu = processes_cpu_s(api) - api_before if api_before is not None else None
        xdb_cpu = process_cpu_s(target.xdb_pid) - xdb_before if target.xdb_pid and xdb_before is not None else None
        engine_cpu = processes_cpu_s(target.engine_pids) - engine_before if engine_before is not None else None
    result = Round(replies, wall, client_cpu, api_cpu, xdb_cpu, engine_cpu)
    if result.tokens != load.expected_tokens:
        raise RuntimeError(f"{target.base_url}: {result.tokens} completion tokens, expected {load.expected_tokens}")
    return result


def measure(target: Target, load: Load) -> Round:
    """One round, in an event loop of its own."""
    import uvloop

    return uvloop.run(run_round(target, load))
