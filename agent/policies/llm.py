"""The model as the scientist: each turn one chat request through the AHC server, the tools offered
as OpenAI function tools, the reply's tool calls run by the loop.

The request carries only the turn's new messages and the `context` field; the server keeps the
session's State and appends the reply itself. Whatever the model writes is tolerated: a reply
without a usable tool call becomes an error the model reads next turn, arguments that are not JSON
become a tool error result, and the run goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import openai

from agent.journal import JournalEntry, ToolCall, clip
from agent.knowledge import Knowledge
from agent.policies.base import ContextOverflow, Reply, ServerUnreachable, TurnInput, Usage
from agent.tools import tool_schemas

COMPACT_WINDOW = 16_384  # below this many tokens, identity and tool schemas go compact
MINIMAL_WINDOW = 4_096  # below this, minimal
SUMMARY_PROMPT = (
    "You maintain a scientist's lab book. Analyze the following turns. Update the 'Negative Knowledge' "
    "summary: a short list of the ideas the experiments falsified, with the counterexample that did it. "
    "Then list any laws that passed repeatedly but are not stored as theorems yet. Reply with the two "
    "lists only.")
RETRIES_429 = 3


@dataclass
class LLMConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str | None = None
    model: str | None = None  # None: the server's first model
    max_tokens: int | None = None  # None: 512, or a twelfth of a small window
    temperature: float = 0.7
    tool_choice: str = "auto"  # "required" makes a small model emit a call every turn
    parallel_tool_calls: bool = False
    logit_bias: dict[str, int] | None = None
    seed: int = 0
    timeout: float = 300.0
    summary_tokens: int | None = None  # None: 256, or a sixteenth of a small window


@dataclass
class LLMPolicy:
    config: LLMConfig
    name: str = "llm"
    context_window: int | None = None
    prompt_size: str = "full"
    last_submitted: list[str] | None = None
    client: Any = field(default=None, repr=False)
    _tools: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def connect(self) -> None:
        """Find the model and its window; fail with ServerUnreachable when there is no server."""
        self.client = openai.OpenAI(base_url=self.config.base_url, api_key=self.config.api_key or "none",
                                    max_retries=0, timeout=self.config.timeout)
        try:
            models = self.client.models.list().data
        except openai.APIConnectionError as exc:
            raise ServerUnreachable(f"no model server at {self.config.base_url} ({exc})") from None
        except openai.APIStatusError as exc:
            raise ServerUnreachable(
                f"{self.config.base_url}/models answered {exc.status_code}: {exc.message}") from None
        if not models:
            raise ServerUnreachable(f"the server at {self.config.base_url} serves no model")
        card = next((m for m in models if m.id == self.config.model), None) if self.config.model else models[0]
        if card is None:
            raise ServerUnreachable(f"the server serves no model {self.config.model!r} "
                                    f"(it has {', '.join(m.id for m in models)})")
        self.config.model = card.id
        self.context_window = getattr(card, "max_model_len", None) or (card.model_extra or {}).get("max_model_len")
        window = self.context_window or COMPACT_WINDOW
        self.prompt_size = "minimal" if window < MINIMAL_WINDOW else "compact" if window < COMPACT_WINDOW else "full"
        if self.config.max_tokens is None:
            self.config.max_tokens = min(512, (self.context_window or 8192) // 12)
        if self.config.summary_tokens is None:
            self.config.summary_tokens = min(256, (self.context_window or 8192) // 16)
        self._tools = tool_schemas(self.prompt_size)

    @property
    def reply_tokens(self) -> int:
        return self.config.max_tokens or 0

    def attach(self, evidence: Any) -> None:
        """The model learns from the tool results in its context, not from the evidence tally."""

    def tools(self) -> list[dict[str, Any]]:
        return self._tools

    # ---- one turn --------------------------------------------------------------------------------
    def decide(self, turn: TurnInput) -> Reply:
        request = dict(model=self.config.model, messages=turn.messages, tools=self._tools,
                       tool_choice=self.config.tool_choice, max_tokens=self.config.max_tokens,
                       temperature=self.config.temperature, seed=self.config.seed * 100_003 + turn.turn,
                       extra_body={"context": turn.context},
                       # The session in the header too: what a router in front of several servers hashes.
                       extra_headers={"X-Session-ID": turn.context["session_id"]})
        if self.config.parallel_tool_calls is not None:
            request["parallel_tool_calls"] = self.config.parallel_tool_calls
        if self.config.logit_bias:
            request["logit_bias"] = self.config.logit_bias
        try:
            response = self._create(request)
        except openai.APIStatusError as exc:
            if exc.status_code == 400 and _is_overflow(exc):
                raise ContextOverflow(exc.message) from None
            return Reply(note="", error=f"the server refused the request ({exc.status_code}): {clip(exc.message, 300)}")
        return _reply_of(response)

    def _create(self, request: dict[str, Any]) -> Any:
        for attempt in range(RETRIES_429 + 1):
            try:
                return self.client.chat.completions.create(**request)
            except openai.APIConnectionError as exc:
                raise ServerUnreachable(f"lost the model server at {self.config.base_url} ({exc})") from None
            except openai.RateLimitError as exc:  # the VRAM governor's 429: wait as told, then retry
                if attempt == RETRIES_429:
                    raise
                time.sleep(min(float(exc.response.headers.get("retry-after", 1) or 1), 5.0))
        raise AssertionError("unreachable")

    def observe(self, entry: JournalEntry) -> None:
        for call, result in zip(entry.calls, entry.results):
            args = call.parsed()
            if call.name == "submit_theory" and isinstance(args, dict) and "error" not in result:
                self.last_submitted = args.get("table")

    def summarize(self, transcript: str, knowledge: Knowledge) -> str:
        """The compaction's hidden call: no session, so it never enters the agent's own State."""
        assert self.config.summary_tokens is not None  # connect() sets it
        budget = max(((self.context_window or 8192) - self.config.summary_tokens) * 3 // 2, 600)
        earlier = (f"Negative knowledge so far: {knowledge.negative_knowledge}\n\n"
                   if knowledge.negative_knowledge else "")
        candidates = knowledge.describe_candidates()
        passed = f"Laws passed repeatedly, not theorems: {candidates}\n\n" if candidates else ""
        body = f"{earlier}{passed}Turns:\n{transcript[-budget:]}"
        try:
            response = self._create(dict(model=self.config.model, max_tokens=self.config.summary_tokens,
                                         temperature=0.0, messages=[{"role": "system", "content": SUMMARY_PROMPT},
                                                                    {"role": "user", "content": body}]))
        except openai.APIStatusError as exc:
            return knowledge.negative_knowledge or f"(summary unavailable: {exc.status_code})"
        return (response.choices[0].message.content or "").strip()

    def theory(self) -> list[str] | None:
        return self.last_submitted

    def to_json(self) -> dict[str, Any]:
        return {"last_submitted": self.last_submitted}

    def load_json(self, data: dict[str, Any]) -> None:
        self.last_submitted = data.get("last_submitted")


def _reply_of(response: Any) -> Reply:
    choice = response.choices[0]
    message = choice.message
    note = message.content or ""
    calls = [ToolCall(c.id or f"call-{k}", c.function.name, c.function.arguments or "")
             for k, c in enumerate(message.tool_calls or [])]
    error = None
    if not calls:
        shape = "a <tool_call> block that is not valid JSON" if "<tool_call>" in note else "no tool call"
        error = f"your reply held {shape} (finish_reason {choice.finish_reason}); call exactly one tool"
    details = getattr(response.usage, "prompt_tokens_details", None)
    usage = Usage(prompt_tokens=response.usage.prompt_tokens,
                  cached_tokens=(getattr(details, "cached_tokens", None) or 0) if details else 0,
                  completion_tokens=response.usage.completion_tokens or 0)
    report = (response.model_extra or {}).get("context")
    return Reply(note=note, calls=calls, error=error, usage=usage, report=report)


def _is_overflow(exc: openai.APIStatusError) -> bool:
    text = (exc.message or "").lower()
    return any(k in text for k in ("context length", "maximum context", "too long", "max_model_len", "context window"))
