"""What the emulated engine cannot serve: a reply held to a grammar. Its tokens are drawn without the
model, so a grammar (a forced tool call, a JSON schema, a regex or choice) has nothing to mask; such a
request is refused as the API's own 400 before it becomes a turn, rather than failing in the engine."""

from __future__ import annotations

from typing import Any

from core.errors import InvalidRequest

FREE_CHOICES = (None, "auto", "none")


def refuse_grammar(emulate: str | None, *, tool_choice: Any, has_tools: bool, format_type: str | None,
                   structured: bool) -> None:
    """Raise InvalidRequest naming the parameter that asks for a grammar, when the engine is emulated."""
    if emulate is None:
        return
    if has_tools and tool_choice not in FREE_CHOICES:
        param, asked = "tool_choice", f"tool_choice {tool_choice if isinstance(tool_choice, str) else 'naming a tool'}"
    elif format_type in ("json_schema", "json_object", "structural_tag"):
        param, asked = "response_format", f"a {format_type} format"
    elif structured:
        param, asked = "structured_outputs", "structured outputs"
    else:
        return
    raise InvalidRequest(f"{asked} needs a grammar, which the emulated engine ({emulate}) cannot apply: its "
                         "tokens are drawn without a model (use tool_choice auto, or serve a real model)",
                         param=param)


def refuse_chat_grammar(emulate: str | None, request: Any) -> None:
    """A chat completions request (a Messages request as vLLM converts it, too)."""
    format_type = getattr(getattr(request, "response_format", None), "type", None)
    refuse_grammar(emulate, tool_choice=request.tool_choice, has_tools=bool(request.tools), format_type=format_type,
                   structured=request.structured_outputs is not None)


def refuse_responses_grammar(emulate: str | None, request: Any) -> None:
    """A Responses request: its tool choice, and `text.format`."""
    text_format = getattr(getattr(request, "text", None), "format", None)
    refuse_grammar(emulate, tool_choice=request.tool_choice, has_tools=bool(request.tools),
                   format_type=getattr(text_format, "type", None), structured=False)
