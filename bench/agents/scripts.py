"""What each session of the agents bench sends, and when: the same for every server in a given round."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.agents.load import AgentLoad
from bench.orchestrator import WORDS

MESSAGE_OVERHEAD_TOKENS = 8  # role markers and separators the chat template adds around a message


@dataclass(frozen=True)
class SessionScript:
    """What one session sends, and when: the same for both servers in a given round."""

    session_id: str
    identity: str
    codex: tuple[dict[str, str], ...]
    questions: tuple[str, ...]
    start_s: float
    think_s: tuple[float, ...]
    tool_results: tuple[tuple[str, ...], ...] = ()  # each turn's, one per call after its first
    tool_s: tuple[tuple[float, ...], ...] = ()  # the tool time before each of them

    def messages(self) -> list[list[str]]:
        """Each turn's new message of each call: the question, then the tool results."""
        return [[q, *(self.tool_results[t] if self.tool_results else ())] for t, q in enumerate(self.questions)]

    def context(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "identity": self.identity, "codex": list(self.codex), "mode": "cag"}

    def system(self) -> str:
        """Identity and Codex as one system message, for a client that sends its whole history."""
        return "\n\n".join([self.identity, *(f"## {d['id']}\n{d['text']}" for d in self.codex)])


def words(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def scripts(load: AgentLoad, round_no: int) -> list[SessionScript]:
    """Every session's content and timing for one round. The round's shared prefix (if any), then the
    agent's name, open its Identity, so sessions share only that prefix and no round shares a block with
    another."""
    out = []
    round_rng = np.random.default_rng([load.seed, round_no, SHARED_STREAM])
    shared = f"You are a coding agent of round {round_no}. {words(round_rng, load.shared_words)}\n\n" \
        if load.shared_words else ""
    # Open arrivals: exponential gaps; else staggered starts within one think time (agents do not
    # arrive in lockstep).
    arrivals = np.cumsum(round_rng.exponential(load.arrival_s / load.sessions, load.sessions)) \
        if load.arrival_s else None
    for s in range(load.sessions):
        rng = np.random.default_rng([load.seed, round_no, s])
        identity = shared + f"You are agent {s} of round {round_no}, a careful scientist. " + \
            words(rng, load.identity_words)
        codex = tuple({"id": f"doc{d}", "text": words(rng, load.codex_words)} for d in range(load.codex_docs))
        questions = tuple(f"Turn {t}: " + words(rng, load.question_words) for t in range(load.turns))
        start = float(rng.uniform(0, load.think_max_s)) if arrivals is None else float(arrivals[s])
        think = tuple(float(x) for x in rng.uniform(load.think_min_s, load.think_max_s, load.turns))
        tools = tuple(tuple(f"Tool result {t}.{c}: " + words(rng, load.tool_words) for c in range(1, load.calls))
                      for t in range(load.turns))
        tool_s = tuple(tuple(tool_times(rng, load, load.calls - 1)) for _ in range(load.turns))
        out.append(SessionScript(f"agents-r{round_no}-s{s}", identity, codex, questions, start, think, tools, tool_s))
    return out


SHARED_STREAM = 1 << 20  # the round's own random stream (shared prefix, arrivals), apart from its sessions'


def tool_times(rng: np.random.Generator, load: AgentLoad, n: int) -> list[float]:
    """`n` tool times: uniform over the load's range, or lognormal with the same mean (`tool_sigma`)."""
    if not load.tool_sigma:
        return [float(x) for x in rng.uniform(load.tool_min_s, load.tool_max_s, n)]
    mean = (load.tool_min_s + load.tool_max_s) / 2
    mu = math.log(mean) - load.tool_sigma ** 2 / 2 if mean > 0 else 0.0
    return [max(float(x), load.tool_min_s) for x in rng.lognormal(mu, load.tool_sigma, n)]


def session_tokens_estimate(script: SessionScript, max_tokens: int, count: Callable[[str], int]) -> int:
    """Tokens of the session's last prompt plus its reply: Identity, Codex, every question and every
    reply but the last in State, each message with the template's markers. `count`: text → tokens."""
    system = count(script.identity) + sum(count(f"## {d['id']}\n{d['text']}") for d in script.codex)
    sent = [m for turn in script.messages() for m in turn]
    turns = sum(count(m) for m in sent) + len(sent) * max_tokens
    messages = 2 * len(sent) + 2  # the questions and tool results, the replies, Identity and Codex
    return system + turns + messages * MESSAGE_OVERHEAD_TOKENS
