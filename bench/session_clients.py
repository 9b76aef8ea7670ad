"""The three ways a bench agent talks to its server, turn by turn, on the same script.

- `ContextClient`: AHC's `context` (session id, Identity, Codex, mode auto); it sends only what is new
  each turn (the tool result, a user instruction), and the server keeps and compacts the State.
- `HistoryClient`: an ordinary client on any OpenAI server: a system prompt (Identity + Codex), the
  whole history resent every turn, its oldest turn groups dropped when the window is full
  (bench/history_trim.py), counted with the model's chat template and the tools as the server renders
  them. `naive=True` puts the current time at the top of its system prompt, as agent frameworks often
  do, so nothing after it is ever cached.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import httpx

from bench.agent_script import TOOLS, AgentScript
from bench.chat_stream import StreamedReply, stream_chat
from bench.history_trim import Count, Message, trim

SESSION_ID = "long-session"


@dataclass(frozen=True)
class MeasuredTurn:
    """A turn as measured: the reply's figures, and the client's own count of its prompt (None where
    the server builds the prompt)."""

    reply: StreamedReply
    counted_tokens: int | None = None


class Client(Protocol):
    def turn(self, index: int) -> MeasuredTurn: ...


@dataclass(frozen=True)
class Sampling:
    """What every request carries besides its messages, the same for every client. `logit_bias`: the
    whitespace-only tokens banned (`whitespace_bias`), since the tool-call grammar allows any spacing
    and a random model would pad the call with it until max_tokens."""

    model: str
    max_tokens: int
    logit_bias: dict[str, int] = field(default_factory=dict)

    def body(self, script: AgentScript, index: int, messages: list[Message]) -> dict[str, Any]:
        return {"model": self.model, "messages": messages, "tools": list(TOOLS),
                "tool_choice": script.tool_choice(index), "max_tokens": self.max_tokens, "temperature": 0,
                "logit_bias": self.logit_bias}


def whitespace_bias(tokenizer: Any) -> dict[str, int]:
    return {str(i): -100 for i in range(len(tokenizer)) if (text := tokenizer.decode([i])) and not text.strip()}


@dataclass
class ContextClient:
    http: httpx.Client
    sampling: Sampling
    script: AgentScript
    call_id: str | None = None

    def context(self) -> dict[str, Any]:
        return {"session_id": SESSION_ID, "identity": self.script.identity, "codex": list(self.script.codex),
                "mode": "auto"}

    def turn(self, index: int) -> MeasuredTurn:
        body = self.sampling.body(self.script, index, self.script.new_messages(index, self.call_id))
        reply = stream_chat(self.http, {**body, "context": self.context()})
        self.call_id = reply.tool_call_id()
        return MeasuredTurn(reply)


@dataclass
class HistoryClient:
    """`count`: a prompt's tokens (`template_counter`); the history it keeps is what it last sent
    (dropped turns are gone for good, as with a trimmed message list)."""

    http: httpx.Client
    sampling: Sampling
    script: AgentScript
    max_model_len: int
    count: Count
    naive: bool = False
    history: list[Message] = field(default_factory=list)
    call_id: str | None = None
    dropped_groups: int = 0
    trims: int = 0

    def system(self) -> list[Message]:
        prompt = self.script.system_prompt()
        if self.naive:
            prompt = f"Current time: {datetime.now().isoformat(timespec='microseconds')}\n\n{prompt}"
        return [{"role": "system", "content": prompt}]

    def turn(self, index: int) -> MeasuredTurn:
        self.history += self.script.new_messages(index, self.call_id)
        system = self.system()
        trimmed = trim(system, self.history, self.count, self.max_model_len - self.sampling.max_tokens)
        self.history = trimmed.history
        self.dropped_groups += trimmed.dropped_groups
        self.trims += bool(trimmed.dropped_messages)
        messages = [*system, *self.history]
        reply = stream_chat(self.http, self.sampling.body(self.script, index, messages))
        self.call_id = reply.tool_call_id()
        self.history.append(reply.message)
        return MeasuredTurn(reply, self.count(messages))


def as_rendered(messages: Sequence[Message]) -> list[Message]:
    """The messages as vLLM hands them to the chat template: tool-call arguments parsed into objects
    (an unparsable one as {})."""
    out = copy.deepcopy(list(messages))
    for message in out:
        for call in message.get("tool_calls") or []:
            arguments = call["function"].get("arguments")
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments) if arguments else {}
                except json.JSONDecodeError:
                    parsed = {}
                call["function"]["arguments"] = parsed if isinstance(parsed, dict) else {}
    return out


def template_counter(tokenizer: Any, tools: Sequence[dict[str, Any]] = TOOLS) -> Count:
    """A prompt's tokens as the server counts them: the chat template rendered with the tools and the
    generation prompt, tokenized without added special tokens (the template writes its own)."""
    def count(messages: list[Message]) -> int:
        text = tokenizer.apply_chat_template(as_rendered(messages), tools=list(tools), add_generation_prompt=True,
                                             tokenize=False)
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


def run_turns(client: Client, turns: int) -> tuple[list[MeasuredTurn], float]:
    """Every turn of the script, one after another; the wall time."""
    start = time.perf_counter()
    done = [client.turn(index) for index in range(turns)]
    return done, time.perf_counter() - start
