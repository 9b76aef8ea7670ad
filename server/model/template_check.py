"""Is the served model's chat template prefix-stable?

The orchestrator keeps every prompt a prefix of the next, but the chat template has the last word:
some re-render earlier turns differently once a turn is added (Qwen3-style templates drop an earlier
reply's reasoning, others move the tool list or re-date the system prompt), and then the prefix cache
breaks on every turn whatever the blocks do. At start-up the server renders a probe conversation one
turn at a time and checks each prompt is a prefix of the next, and says where it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]

TOOL: dict[str, Any] = {
    "type": "function", "function": {"name": "probe", "description": "Measure the ring.",
                                     "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
PLAIN: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful physicist."},
    {"role": "user", "content": "What moves right?"},
    {"role": "assistant", "content": "Particle A moves right by one cell each step."},
    {"role": "user", "content": "And B?"},
    {"role": "assistant", "content": "B moves left."},
    {"role": "user", "content": "Thanks."},
]
WITH_TOOLS: list[dict[str, Any]] = [
    *PLAIN[:4],
    {"role": "assistant", "content": "Let me measure.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "probe", "arguments": '{"x": 1}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "B moved left by one cell."},
    {"role": "assistant", "content": "B moves left."},
    {"role": "user", "content": "Thanks."},
]


@dataclass(frozen=True)
class TemplateCheck:
    stable: bool | None  # None: the template could not render the probe
    detail: str


def check_chat_template(render: Render) -> TemplateCheck:
    """`render(messages, tools)` is the chat template with the generation prompt added."""
    try:
        found = _first_divergence(render, WITH_TOOLS, [TOOL])
    except Exception as exc:  # templates raise anything (jinja errors, their own raise_exception)
        try:
            found = _first_divergence(render, PLAIN, None)
        except Exception:
            return TemplateCheck(None, f"the chat template cannot render a plain conversation: {exc}")
    if found is None:
        return TemplateCheck(True, "each prompt is a prefix of the next")
    return TemplateCheck(False, found)


def _first_divergence(render: Render, conversation: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None) -> str | None:
    # A request ends where the model is asked to speak: after a user or a tool message.
    ends = [i + 1 for i, m in enumerate(conversation) if m["role"] in ("user", "tool")]
    prompts = [(n, render(conversation[:n], tools)) for n in ends]
    for (n, before), (_, after) in zip(prompts, prompts[1:]):
        if not after.startswith(before):
            at = next(i for i, (a, b) in enumerate(zip(before, after + "\0" * len(before))) if a != b)
            return (f"adding turns after message {n} re-renders the earlier prompt at character {at}: "
                    f"{before[at:at + 40]!r} became {after[at:at + 40]!r}")
    return None
