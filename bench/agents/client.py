"""The agents bench's load against a running server: every session's calls in order with its tool and
think times, and the server's counters around each round."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx

from bench.agents.figures import CACHED_BY, WAIT_BUCKET, AgentRound, TurnResult
from bench.agents.load import AgentLoad
from bench.agents.scripts import SessionScript, scripts
from server.cluster.server_process import ServerProcess

MAX_RETRIES = 50
WAIT_HISTOGRAM = "ahc_session_wait_seconds"
REQUEST_TIMEOUT_S = 600


async def send_turn(http: aiohttp.ClientSession, base_url: str, body: dict[str, Any]) -> TurnResult:
    """One streamed chat turn; a 429 waits its Retry-After and is sent again."""
    ready, rejections = time.perf_counter(), 0
    while True:
        sent = time.perf_counter()
        async with http.post(f"{base_url}/v1/chat/completions", json=body) as response:
            if response.status == 429 and rejections < MAX_RETRIES:
                rejections += 1
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            if response.status != 200:
                raise RuntimeError(f"{base_url} answered {response.status}: {(await response.text())[:500]}")
            first, usage, text = None, None, []
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                data = json.loads(line[6:])
                choices = data.get("choices")
                content = choices[0].get("delta", {}).get("content") if choices else None
                if content:
                    first = first if first is not None else time.perf_counter()
                    text.append(content)
                usage = data.get("usage") or usage
        if usage is None:
            raise RuntimeError(f"{base_url}: a streamed reply without usage")
        first = first if first is not None else time.perf_counter()
        details = usage.get("prompt_tokens_details") or {}
        return TurnResult(usage["prompt_tokens"], details.get("cached_tokens") or 0, usage["completion_tokens"],
                          first - sent, first - ready, rejections, "".join(text))


async def run_session(http: aiohttp.ClientSession, base_url: str, model: str, script: SessionScript,
                      max_tokens: int, client: str = "context") -> tuple[list[TurnResult], float]:
    """The session's calls in order, with its tool and think times; its results and its job completion
    time (first call sent to last reply). `client`: AgentLoad.client."""
    await asyncio.sleep(script.start_s)
    results: list[TurnResult] = []
    history: list[dict[str, str]] = [{"role": "system", "content": script.system()}]
    started = time.perf_counter()
    for t, (turn, think) in enumerate(zip(script.messages(), script.think_s)):
        for c, message in enumerate(turn):
            if c:
                await asyncio.sleep(script.tool_s[t][c - 1])  # the tool runs; the session's KV waits
            body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                                    "stream": True, "stream_options": {"include_usage": True}}
            history.append({"role": "user", "content": message})
            if client == "messages":
                body["messages"] = list(history)
            else:
                body.update(messages=[history[-1]], context=script.context())
            results.append(await send_turn(http, base_url, body))
            history.append({"role": "assistant", "content": results[-1].reply})
        if t < len(script.questions) - 1:
            await asyncio.sleep(think)
    return results, time.perf_counter() - started


async def run_sessions(base_url: str, model: str, load: AgentLoad,
                       round_no: int) -> tuple[list[tuple[list[TurnResult], float]], float]:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        started = time.perf_counter()
        sessions = await asyncio.gather(*(run_session(http, base_url, model, s, load.max_tokens, load.client)
                                          for s in scripts(load, round_no)))
        return list(sessions), time.perf_counter() - started


# vLLM's counters a side reports, by the name they are kept under.
ENGINE_COUNTERS = {"vllm:num_preemptions_total": "preemptions", "vllm:kv_offload_load_bytes_total": "load_bytes",
                   "vllm:kv_offload_store_bytes_total": "store_bytes"}


def server_counters(base_url: str) -> dict[str, float]:
    """The engine's preemptions, cached tokens by tier and offload bytes, the governor's actions and the
    admission-wait histogram, each summed over its series."""
    from prometheus_client.parser import text_string_to_metric_families

    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name in ENGINE_COUNTERS:
                key = ENGINE_COUNTERS[sample.name]
                counters[key] = counters.get(key, 0.0) + sample.value
            elif sample.name == "vllm:prompt_tokens_cached_by_source_total":
                key = f"{CACHED_BY}{sample.labels.get('source', '?')}"
                counters[key] = counters.get(key, 0.0) + sample.value
            elif sample.name == "ahc_governor_actions_total":
                key = f"governor:{sample.labels.get('action', '?')}"
                counters[key] = counters.get(key, 0.0) + sample.value
            elif sample.name.startswith(WAIT_HISTOGRAM):
                suffix = sample.name.removeprefix(WAIT_HISTOGRAM)
                name = {"_bucket": f"{WAIT_BUCKET}{sample.labels.get('le')}", "_sum": "session_wait_sum",
                        "_count": "session_wait_count"}.get(suffix)
                if name is not None:
                    counters[name] = counters.get(name, 0.0) + sample.value
    return counters


@dataclass
class Side:
    """One server under the agents' load; its rounds count up so every server sees the same scripts."""

    name: str
    server: ServerProcess
    model: str
    load: AgentLoad
    rounds_run: int = 0

    def measure(self) -> AgentRound:
        import uvloop

        before = server_counters(self.server.base_url)
        sessions, wall = uvloop.run(run_sessions(self.server.base_url, self.model, self.load, self.rounds_run))
        after = server_counters(self.server.base_url)
        self.rounds_run += 1
        return AgentRound([turns for turns, _ in sessions], wall,
                          {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after.keys() | before},
                          [jct for _, jct in sessions])
