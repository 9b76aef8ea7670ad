"""`ahc bench orchestrator`: an agent session through the orchestrator vs the same content sent naively.

Both run against one server, in one run, by default on a random model larger than the tiny one (6 layers ×
512); `model=smollm2-135m` runs it on the real model, whose replies (and condensed Codex) are its own text:
ours sends only the new turn with a `session_id` (the server keeps the State, blocks in fixed order);
the naive client puts a timestamp at the top of its system prompt and resends the whole history, as
agent frameworks commonly do. Reported: hit ratio (cached / prompt tokens) and TTFT p50 of both, and
the assembly p99 at a ~100k-token context when every block is cached.

Then prompt density: a session whose Codex (stored once in XDB, named by reference) is too large for
its CAG threshold, sent as the Codex's condensed rendition, against the same session with the Codex
marked verbatim (never condensed, so RAG): the Codex tokens saved per turn and both hit ratios.

The load is `LOADS` (bench/load.py): `BENCH_ORCHESTRATOR_LOAD="smoke"` or e.g.
`"turns=4,density_turns=2,assembly_tokens=8000"`: `turns` of the session both clients run,
`density_turns` of each density session, `density_codex_tokens` of its Codex (600 to 5,000; the
session's CAG threshold scales with it, so only the condensed rendition fits), `assembly_tokens` of the
context prepare() is timed on (the prompt must reach 90% of it and fit the 131,072-token window),
`assembly_rounds` timed prepare() calls, `model` one of bench/models.py's SERVED.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openai

from bench.device import engine_device
from bench.load import DEFAULT, SMOKE, Loads
from bench.models import MODELS, served_model
from bench.prefix_ceiling import reusable_tokens
from bench.result import BenchResult
from bench.servers import start_server
from core.config import OrchestratorConfig, load_config
from orchestrator.message import Message
from orchestrator.turn_request import TurnRequest

REPLY_TOKENS = 16
WORDS = ("particle collision ring cell symbol left right moves splits merges period class window "
         "rule table experiment prediction counterexample theorem").split()
ASSEMBLY_WINDOW = 131072
# The share of `assembly_tokens` the assembled prompt must reach, or the figure is not the one named.
ASSEMBLY_MIN_SHARE = 0.9


@dataclass(frozen=True)
class OrchestratorLoad:
    """The session both clients run, the density sessions, and the context prepare() is timed on."""

    turns: int = 30
    density_turns: int = 8
    # The density session's Codex document, in the served model's tokens; the model condenses it to 0.3 of that.
    density_codex_tokens: int = 3000
    assembly_tokens: int = 100_000
    assembly_rounds: int = 300
    model: str = "bench-6x512"

    def __post_init__(self) -> None:
        if self.turns < 2 or self.density_turns < 1 or self.assembly_rounds < 1:
            # TTFT is the median over the turns after the first, which nothing could have cached.
            raise ValueError("turns must be at least 2, density_turns and assembly_rounds at least 1")
        if not 600 <= self.density_codex_tokens <= 5000:
            raise ValueError("density_codex_tokens must be 600 to 5000: its CAG threshold is a share of an 8k window")
        served_model(self.model)  # an unknown model fails here, before any server starts


LOADS = Loads("orchestrator", {DEFAULT: OrchestratorLoad(),
                               SMOKE: OrchestratorLoad(turns=2, density_turns=1, density_codex_tokens=600,
                                                       assembly_tokens=8000,
                                                       assembly_rounds=20)})


def text_of(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, n_words))


def session_content(turns: int) -> tuple[str, list[dict], list[str], dict[int, dict]]:
    # With the random models' tokenizer (~2 tokens a word): identity ~300 tokens, codex ~2k, an input ~60.
    identity = "You are a careful scientist. " + text_of(140, 1)
    codex = [{"id": f"doc{i}", "text": text_of(250, 10 + i)} for i in range(4)]
    questions = [f"Turn {t}: " + text_of(25, 100 + t) for t in range(turns)]
    karma_at = {t: {"id": f"k{t}", "text": f"Fact {t}: " + text_of(12, 200 + t)} for t in range(3, turns, 5)}
    return identity, codex, questions, karma_at


@dataclass
class TurnLog:
    """Per turn: time to first token, prompt tokens, cached prompt tokens, completion tokens."""

    ttft: list[float] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    completion: list[int] = field(default_factory=list)

    def add(self, ttft: float, usage) -> None:
        self.ttft.append(ttft)
        self.prompt.append(usage.prompt_tokens)
        self.cached.append(usage.prompt_tokens_details.cached_tokens)
        self.completion.append(usage.completion_tokens)

    def hit_ratio(self, first: int = 0) -> float:
        return sum(self.cached[first:]) / sum(self.prompt[first:])

    def ceiling(self, block_size: int) -> float:
        """The hit ratio an ideal prefix cache could reach on this session: each request reusing all of
        the previous request's prompt and reply that fills whole KV blocks (the first request, each
        turn's new input and the last partial block can never be served from a cache)."""
        reusable = [reusable_tokens(p, prev, out, block_size)
                    for p, prev, out in zip(self.prompt[1:], self.prompt, self.completion)]
        return sum(reusable) / sum(self.prompt)

    def per_turn(self) -> str:
        return " ".join(f"{c}/{p}" for c, p in zip(self.cached, self.prompt))


def stream_ttft(client: openai.OpenAI, **kwargs) -> tuple[float, str, Any]:
    start = time.perf_counter()
    ttft, text, usage = None, [], None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.choices and chunk.choices[0].delta.content is not None and ttft is None:
            ttft = time.perf_counter() - start
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    return (ttft if ttft is not None else time.perf_counter() - start), "".join(text), usage


def run_ours(client: openai.OpenAI, model: str, turns: int) -> TurnLog:
    identity, codex, questions, karma_at = session_content(turns)
    karma, log = [], TurnLog()
    for turn, question in enumerate(questions):
        if turn in karma_at:
            karma.append(karma_at[turn])
        context = {"session_id": "bench-ours", "identity": identity, "codex": codex, "karma": karma, "mode": "cag"}
        ttft, _, usage = stream_ttft(client, model=model, max_tokens=REPLY_TOKENS, temperature=0,
                                     messages=[{"role": "user", "content": question}], extra_body={"context": context})
        log.add(ttft, usage)
    return log


def run_naive(client: openai.OpenAI, model: str, turns: int) -> TurnLog:
    identity, codex, questions, karma_at = session_content(turns)
    karma, history, log = [], [], TurnLog()
    for turn, question in enumerate(questions):
        if turn in karma_at:
            karma.append(karma_at[turn])
        system = (f"Current time: {time.time():.6f}\n\n{identity}\n\n"
                  + "\n\n".join(f"## {d['id']}\n{d['text']}" for d in codex)
                  + "\n\n" + "\n".join(f"- {k['text']}" for k in karma))
        history.append({"role": "user", "content": question})
        ttft, reply, usage = stream_ttft(client, model=model, max_tokens=REPLY_TOKENS, temperature=0,
                                         messages=[{"role": "system", "content": system}, *history])
        history.append({"role": "assistant", "content": reply})
        log.add(ttft, usage)
    return log


def density_threshold(codex_tokens: int) -> float:
    """The density session's own cag_threshold: a share of the 8k window under the whole Codex, over its
    rendition (0.3 of it) and the Identity, so only the rendition fits (0.3 for a 3,000-token Codex)."""
    return codex_tokens / 10_000


def density_codex(tokenizer: Any, codex_tokens: int) -> str:
    """A Codex document of about `codex_tokens` tokens in the served model's tokenizer."""
    sample = 1500
    tokens = len(tokenizer.encode(text_of(sample, 77), add_special_tokens=False))
    return text_of(round(sample * codex_tokens / tokens), 77)


def run_density(server: Any, client: openai.OpenAI, model: str, tokenizer: Any, load: OrchestratorLoad,
                real: bool) -> dict[str, Any]:
    """One Codex document, condensed once by the served model; then a session on the rendition (CAG)
    and one on the verbatim document (RAG), turn by turn."""
    identity = "You are a careful scientist. " + text_of(140, 1)
    codex_text = density_codex(tokenizer, load.density_codex_tokens)
    threshold = density_threshold(load.density_codex_tokens)
    with server.http(timeout=1800) as http:
        doc = http.post("/v1/xdb/documents", json={"name": "density-codex", "content": codex_text}).json()
        start = time.perf_counter()
        made = http.post(f"/v1/xdb/documents/{doc['id']}/condensed")
        made.raise_for_status()
        condense_s = time.perf_counter() - start
    logs: dict[str, TurnLog] = {}
    reports: dict[str, list[dict[str, Any]]] = {}
    for name, verbatim in (("condensed", False), ("verbatim", True)):
        logs[name], reports[name] = TurnLog(), []
        for turn in range(load.density_turns):
            context = {"session_id": f"bench-density-{name}", "identity": identity, "cag_threshold": threshold,
                       "codex": [{"document": doc["id"], "verbatim": verbatim}]}
            start = time.perf_counter()
            reply = client.chat.completions.create(
                model=model, max_tokens=REPLY_TOKENS, temperature=0, extra_body={"context": context},
                messages=[{"role": "user", "content": f"Turn {turn}: " + text_of(25, 300 + turn)}])
            logs[name].add(time.perf_counter() - start, reply.usage)
            reports[name].append(reply.to_dict()["context"])
    dense = reports["condensed"]
    if {r["codex"][0]["rendition"] for r in dense} != {"condensed"}:
        raise RuntimeError(f"the density session did not use the condensed rendition: {dense[0]}")
    full_tokens = len(tokenizer.encode(codex_text, add_special_tokens=False))
    condensed_tokens = next(b["tokens"] for b in dense[0]["blocks"] if b["name"] == "codex")
    return {"figures": {
        "density_codex_tokens_full": full_tokens, "density_codex_tokens_condensed": condensed_tokens,
        "density_tokens_saved_per_turn": full_tokens - condensed_tokens,
        "density_hit_ratio": logs["condensed"].hit_ratio(), "density_rag_hit_ratio": logs["verbatim"].hit_ratio(),
        "density_prompt_tokens": sum(logs["condensed"].prompt),
        "density_rag_prompt_tokens": sum(logs["verbatim"].prompt), "density_condense_s": condense_s},
        "ratios": {"density_condensed_over_full": condensed_tokens / full_tokens},
        "notes": {"density": f"{load.density_turns} turns per session, Codex one ~{load.density_codex_tokens}-token "
                             f"document, cag_threshold "
                             f"{threshold}; modes {[r['mode'] for r in dense]} vs "
                             f"{[r['mode'] for r in reports['verbatim']]}; "
                             + ("the rendition is the model's own summary" if real else
                                "the rendition is a random model's text, so its length (not its content) is "
                                "what this measures")}}


def assembly_content(tokens: int, count: Callable[[str], int]) -> tuple[dict[str, Any], list[Message]]:
    """A session's `context` and State whose texts add up to about `tokens` tokens: a ~600-token
    Identity and 40 karma entries, then Codex documents (~5k tokens each) up to half of what is left,
    then State messages (~250 each) up to the rest, ending on a reply as a kept session's State does. The
    chat template adds a few tokens a message."""
    identity = text_of(300, 1)
    karma = [{"id": f"k{i}", "text": text_of(20, 50 + i)} for i in range(40)]
    left = tokens - count(identity) - sum(count(k["text"]) for k in karma)
    codex: list[dict[str, str]] = []
    used = 0
    while used < left / 2:
        codex.append({"id": f"d{len(codex)}", "text": text_of(2500, len(codex))})
        used += count(codex[-1]["text"])
    state: list[Message] = []
    while used < left or len(state) % 2:
        state.append(Message(role="assistant" if len(state) % 2 else "user", content=text_of(120, 1000 + len(state))))
        used += count(state[-1].content)
    return {"session_id": "big", "identity": identity, "mode": "cag", "codex": codex, "karma": karma}, state


def assembly_p99_ms(model_dir: Path, load: OrchestratorLoad) -> tuple[float, int]:
    """Orchestrator.prepare's p99 on a session holding about `load.assembly_tokens` tokens, every block
    unchanged (cached), and the prompt's tokens."""
    import asyncio

    from transformers import AutoTokenizer

    from orchestrator.context_spec import parse_context
    from orchestrator.orchestrator import Orchestrator
    from orchestrator.session import SessionStore
    from orchestrator.token_counter import TokenCounter

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    orch = Orchestrator(OrchestratorConfig(compaction_threshold_tokens=10**9), ASSEMBLY_WINDOW, TokenCounter(encode),
                        SessionStore())
    context, state = assembly_content(load.assembly_tokens, lambda text: len(encode(text)))
    spec = parse_context(context)
    orch.sessions.get("big").messages = state
    messages = [{"role": "user", "content": "next question"}]

    async def once() -> float:
        start = time.perf_counter()
        await orch.prepare(TurnRequest(spec, messages))  # preparing never changes the State: every round sees the same
        return time.perf_counter() - start

    async def measure() -> tuple[list[float], int]:
        first = await orch.prepare(TurnRequest(spec, messages))
        return [await once() for _ in range(load.assembly_rounds)], first.prompt.tokens

    times, tokens = asyncio.run(measure())
    if tokens < ASSEMBLY_MIN_SHARE * load.assembly_tokens:
        raise RuntimeError(f"assembly benchmark context too small: {tokens} tokens for {load.assembly_tokens}")
    return float(np.percentile(times, 99) * 1000), tokens


def run(load: OrchestratorLoad) -> BenchResult:
    served = served_model(load.model)
    model_dir = served.ensure()
    block_size = load_config(served.config).engine.block_size
    assembly_ms, assembly_tokens = assembly_p99_ms(model_dir, load)  # first: it needs no server, and fails fast
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "xdb", model=model_dir, config=served.config, lens="off",
                              extra=["--max-model-len", "8192"])
        try:
            client = server.client(timeout=600)
            model = client.models.list().data[0].id
            naive = run_naive(client, model, load.turns)
            ours = run_ours(client, model, load.turns)
            from transformers import AutoTokenizer

            density = run_density(server, client, model, AutoTokenizer.from_pretrained(model_dir),
                                  load, real=served.name not in MODELS)
        finally:
            server.stop()
    # Turn 0 of each run has nothing cached by construction; the steady state is what agents live in.
    ours_p50 = statistics.median(ours.ttft[1:]) * 1000
    naive_p50 = statistics.median(naive.ttft[1:]) * 1000
    figures = {
        "hit_ratio": ours.hit_ratio(), "naive_hit_ratio": naive.hit_ratio(),
        # Without the first request, which nothing can have cached: the steady state of a long run.
        "hit_ratio_warm": ours.hit_ratio(1), "naive_hit_ratio_warm": naive.hit_ratio(1),
        "hit_ratio_ceiling": ours.ceiling(block_size),
        "ttft_p50_ms": ours_p50, "naive_ttft_p50_ms": naive_p50,
        "assembly_p99_ms": assembly_ms, "assembly_prompt_tokens": assembly_tokens, "turns": load.turns,
        "prompt_tokens": sum(ours.prompt), "naive_prompt_tokens": sum(naive.prompt),
        **density["figures"],
    }
    notes = {"model": served.description, "device": engine_device(),
             "session": f"{load.turns} turns, identity 145 words, codex 4 x 250 words, a karma entry every 5 "
                        f"turns from turn 3, 27-word inputs, {REPLY_TOKENS}-token replies, {block_size}-token "
                        f"KV blocks; turn 0 {ours.prompt[0]} prompt tokens",
             "cached_over_prompt_per_turn": ours.per_turn(), "naive_cached_over_prompt_per_turn": naive.per_turn(),
             "assembly": f"prepare() p99 over {load.assembly_rounds} calls on a kept session of "
                         f"{assembly_tokens:,} prompt tokens (half Codex, half State), every block unchanged",
             **density["notes"]}
    return BenchResult("orchestrator", figures, {"ttft_naive_over_ours": naive_p50 / ours_p50, **density["ratios"]},
                       notes)
