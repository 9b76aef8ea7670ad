"""The agents bench's load: the sessions, their turns, tool and think times, the cache's overcommit,
the sides measured; its presets (the default, `smoke` for the tests, `emulated` for `--engine emulated`)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.load import DEFAULT, SMOKE, Loads
from bench.models import MODELS

MODEL = "bench-2x64"  # prefill next to free: what a wait may cost is all latency
CLIENTS = ("context", "messages")
AHC_SIDES = ("ahc", "fcfs", "ahc_priority", "ahc_gpu")
SIDES = {"ahc": "AHC, session-aware admission, program order (priority), expected-return eviction in the "
                "CPU tier (engine.return_order cpu, the defaults)",
         "fcfs": "AHC, first come first served",
         "ahc_priority": "AHC with program order alone (engine.return_order off)",
         "ahc_gpu": "AHC with the GPU's free blocks in return order too (engine.return_order both)",
         "vllm": "vanilla vllm serve", "offload": "vllm serve with native CPU offload, the same tier as AHC's",
         "ideal": "vanilla vllm serve on a cache that holds every session"}


@dataclass(frozen=True)
class AgentLoad:
    """The sessions, their turns and think time, and how far their contexts overcommit the cache."""

    sessions: int = 16
    turns: int = 6
    think_min_s: float = 0.5
    think_max_s: float = 1.0
    max_tokens: int = 24
    cache_multiple: float = 3.0
    rounds: int = 3
    # A warm-up round on each side before the measured ones; off in the smoke runs, which only check that
    # every figure is there (each round uses new sessions, so a warm-up primes no cache).
    warmup: bool = True
    identity_words: int = 120
    codex_docs: int = 2
    codex_words: int = 80
    question_words: int = 20
    seed: int = 0
    # One of bench/models.py's: "bench-6x512" makes a prefill cost real time, as a long context on a GPU.
    model: str = MODEL
    # A coding agent's shape: each user turn is `calls` model calls, each after the first sending a tool's
    # result of `tool_words` words after `tool_min_s`-`tool_max_s` of tool time.
    calls: int = 1
    tool_words: int = 0
    tool_min_s: float = 0.0
    tool_max_s: float = 0.0
    # An emulation profile (server/emulation/): every server on that emulated GPU, `model` only its tokenizer.
    emulate: str = ""
    # Words every session's prompt opens with, as real agents share their system prompt and tool
    # schemas (each round its own, so no round reuses another's cache).
    shared_words: int = 0
    # Tool times: 0, uniform in [tool_min_s, tool_max_s]; else lognormal of this sigma with the same
    # mean, at least tool_min_s (test runs and builds give real tool times a heavy tail).
    tool_sigma: float = 0.0
    # Open arrivals: sessions start over this many seconds (a Poisson process), not within one think time.
    arrival_s: float = 0.0
    # The CPU tier (GiB of host memory, vLLM's native offloading) of AHC, FCFS and vLLM with offload;
    # emulated engine only.
    offload_gib: float = 0.0
    # What a call sends: "context", its new message with AHC's `context` (the server keeps the State);
    # "messages", the whole history, as agent clients do (the only way vanilla vLLM can be served).
    client: str = "context"
    # The sides to run, joined by "+" ("ahc+vllm+offload"; empty: every side the engine has, SIDES).
    sides: str = ""

    def __post_init__(self) -> None:
        # A bad load fails here, before any server starts.
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose from {', '.join(MODELS)}")
        if self.client not in CLIENTS:
            raise ValueError(f"unknown client {self.client!r}; choose from {', '.join(CLIENTS)}")
        if self.emulate and self.client != "messages":
            raise ValueError("vanilla vLLM knows no `context`: the emulated sides need client=messages")
        if self.offload_gib and not self.emulate:
            raise ValueError("offload_gib needs the emulated engine (vLLM's CPU build has no CPU tier)")
        chosen = self.side_names()
        if chosen and "ahc" not in chosen:
            raise ValueError("sides must include ahc, the side every ratio is of")
        unknown = [name for name in chosen if name not in SIDES]
        if unknown:
            raise ValueError(f"unknown side {unknown[0]!r}; choose from {', '.join(SIDES)}")

    def side_names(self) -> list[str]:
        """The sides `sides` names; empty: every side."""
        return [name.strip() for name in self.sides.split("+") if name.strip()]

    def describe(self) -> str:
        calls = (f", {self.calls} model calls a turn (tool results ~{self.tool_words} words after "
                 f"{self.tool_min_s}-{self.tool_max_s} s of tool time)" if self.calls > 1 else "")
        engine = f" on the EMULATED {self.emulate}" if self.emulate else ""
        tools = f", tool times lognormal sigma {self.tool_sigma}" if self.tool_sigma else ""
        arrivals = (f"sessions arriving over {self.arrival_s} s (Poisson)" if self.arrival_s else
                    f"sessions starting within {self.think_max_s} s")
        tier = f"; a {self.offload_gib} GiB CPU tier" if self.offload_gib else ""
        return (f"{self.model}{engine}: {self.sessions} sessions x {self.turns} turns{calls}{tools}, "
                f"think {self.think_min_s}-{self.think_max_s} s "
                f"(seeded), {arrivals}, {self.max_tokens}-token replies (ignore_eos), a shared prefix of "
                f"~{self.shared_words} words, identity ~{self.identity_words} words, "
                f"codex {self.codex_docs} x ~{self.codex_words} words, questions ~{self.question_words} words; "
                f"each call sends {'its whole history' if self.client == 'messages' else 'AHC context'}; "
                f"contexts at the last turn ~{self.cache_multiple}x the KV cache{tier}; {self.rounds} measured "
                f"rounds{' after a warm-up each' if self.warmup else ', no warm-up'}")


# `ahc bench agents --engine emulated`: coding agents on an emulated H100 serving Llama-3.1-8B. Shaped
# as the GitHub Copilot coding-agent trace describes a session (Azure Public Dataset, 2026: about 4 user
# turns of about 8 model calls, tool time between them, prompts growing as tool results join them,
# about 530 generated tokens a call), scaled down about 4x in turns, reply and prompt so a round takes
# about two minutes here: 2 turns of 8 calls, 128-token replies, ~400-token tool results after 1-3 s
# of tool time (heavy-tailed, mean 2 s), a ~7k-token system prompt of which ~2.7k (2,000 words: the
# agent's instructions and tool schemas) every session shares; sessions arriving over 20 s; every call
# sending the whole history, as agent clients do; the sessions' last contexts 3x the KV cache, a 16 GiB
# CPU tier.
EMULATED_LOAD = AgentLoad(sessions=16, turns=2, calls=8, max_tokens=128, tool_words=300, tool_min_s=1.0,
                          tool_max_s=3.0, tool_sigma=1.0, think_min_s=2.0, think_max_s=4.0, shared_words=2000,
                          identity_words=500, codex_docs=2, codex_words=500, question_words=60,
                          cache_multiple=3.0, rounds=3, arrival_s=20.0, offload_gib=16.0, client="messages",
                          emulate="h100-llama-8b")


LOADS = Loads("agents", {DEFAULT: AgentLoad(),
                         SMOKE: AgentLoad(sessions=4, turns=3, rounds=1, warmup=False, think_min_s=0.2,
                                          think_max_s=0.4),
                         "emulated": EMULATED_LOAD})
