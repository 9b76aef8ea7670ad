"""The prompt budget: how many tokens a request's prompt may take, and what a prompt really costs.

vLLM refuses (400) a request whose prompt plus completion budget exceeds `max_model_len`, so the
orchestrator keeps every prompt it assembles within `max_model_len - completion tokens`. Block token
counts miss what the chat template adds around them (role markers, the generation prompt, the JSON of
offered tools — ~300 tokens for `query_archive` with the tiny model), so the chat template's cost is
measured once, on empty messages, and added to the blocks' tokens. Measuring the whole rendered
prompt instead would re-tokenize the full history on every request (100k tokens at a large window).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.assembler import AssembledPrompt
from orchestrator.token_counter import TokenCounter

# (messages, tools or None) -> the prompt text the chat template renders, generation prompt included.
RenderChat = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]

# Tokens may merge across the boundary between a marker and a message's text, and a template may add a
# role-dependent header: each message gets this much slack on top of the measured cost.
BOUNDARY_SLACK = 2


@dataclass(frozen=True)
class TemplateCost:
    """Tokens the chat template adds: once per prompt, per message, per tool call (beyond its name and
    arguments). The defaults are a generous guess for when no template is known."""

    base: int = 16
    per_message: int = 8
    per_tool_call: int = 16


class PromptMeter:
    """Prompt tokens as the engine will count them: the blocks plus the chat template's own."""

    def __init__(self, counter: TokenCounter, render: RenderChat | None = None) -> None:
        self.counter = counter
        self.render = render
        self._cost: TemplateCost | None = None
        self._tools: dict[str, int] = {}

    @property
    def cost(self) -> TemplateCost:
        if self._cost is None:
            self._cost = self._measure() if self.render is not None else TemplateCost()
        return self._cost

    def tokens(self, prompt: AssembledPrompt, tools: Sequence[dict[str, Any]] = ()) -> int:
        cost = self.cost
        calls = [call for m in prompt.messages for call in m.get("tool_calls") or ()]
        names = sum(self.counter.count(str(call.get("function", {}).get("name", ""))) for call in calls)
        return (prompt.tokens + cost.base + (cost.per_message + BOUNDARY_SLACK) * len(prompt.messages)
                + cost.per_tool_call * len(calls) + names + self.tools_tokens(tools))

    def overhead(self, prompt: AssembledPrompt, tools: Sequence[dict[str, Any]] = ()) -> int:
        """What the template and tools add to the blocks' tokens."""
        return self.tokens(prompt, tools) - prompt.tokens

    def tools_tokens(self, tools: Sequence[dict[str, Any]]) -> int:
        if not tools:
            return 0
        key = json.dumps(list(tools), sort_keys=True, default=str)
        if key not in self._tools:
            if self.render is not None:
                one = [{"role": "user", "content": ""}]
                self._tools[key] = max(self._count(one, list(tools)) - self._count(one), 0) + BOUNDARY_SLACK
            else:
                self._tools[key] = self.counter.count(key) + 16 * len(tools)
        return self._tools[key]

    def _count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        assert self.render is not None
        text = self.render(messages, tools)
        return len(self.counter.encode(text)) if text else 0

    def _measure(self) -> TemplateCost:
        """The template's cost from a few empty conversations; a template that refuses one of them
        (strict role alternation, no tool role) keeps the default guess for that part."""
        default = TemplateCost()
        user = {"role": "user", "content": ""}
        assistant = {"role": "assistant", "content": ""}
        try:
            one = self._count([user])
        except Exception:  # any template error: keep the guess
            return default
        per_message = 0
        calling: dict[str, Any] = {**assistant, "tool_calls": [_CALL]}
        tool = {"role": "tool", "tool_call_id": "c", "content": ""}
        probes: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
            ([{"role": "system", "content": ""}, user], [user]), ([user, assistant], [user]),
            ([user, assistant, user], [user, assistant]), ([user, calling, tool], [user, calling])]
        for longer, shorter in probes:
            try:
                per_message = max(per_message, self._count(longer) - self._count(shorter))
            except Exception:
                per_message = max(per_message, default.per_message)
        try:
            call = self._count([user, calling]) - self._count([user, assistant])
            per_tool_call = max(call - self.counter.count("f") - self.counter.count("{}"), 0)
        except Exception:
            per_tool_call = default.per_tool_call
        return TemplateCost(base=max(one - per_message, 0), per_message=per_message, per_tool_call=per_tool_call)


_CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
