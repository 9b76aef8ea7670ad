"""XDB's memory verbs as tools the served model may call: `recall`, `tag`, `comment`, `pin` and
`request_compaction`, offered when a request's `context.memory_tools` names them.

As with `query_archive`, a call comes back to the client (finish_reason "tool_calls"), which runs it at
`POST /v1/context/memory` (or through `ahc mcp`) and sends the result back as a `tool` message: the call
and its result are in the client's transcript and recorded like any tool call, and the verbs act on the
session's rows alone, under the caller's key. Ticks are the session's positions, as recall returns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

MemoryToolName = Literal["recall", "tag", "comment", "pin", "request_compaction"]
MEMORY_TOOL_NAMES: tuple[str, ...] = get_args(MemoryToolName)
RECALL_MAX_LIMIT = 20
TEXT_MAX_CHARS = 2_000

_TICK = {"type": "integer", "minimum": 0, "description": "A position in this session, as recall returns it."}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


MEMORY_TOOLS: dict[str, dict[str, Any]] = {
    "recall": _tool(
        "recall", "Search your own memory of this session (everything said and done in it, including what "
                  "no longer fits the prompt) and return the matching moments, oldest first, each with its tick.",
        {"text": {"type": "string", "minLength": 1, "maxLength": TEXT_MAX_CHARS,
                  "description": "Words the moment contains."},
         "tag": {"type": "string", "minLength": 1, "description": "Only moments carrying this tag."},
         "tick_from": _TICK, "tick_to": _TICK,
         "limit": {"type": "integer", "minimum": 1, "maximum": RECALL_MAX_LIMIT, "default": 5}},
        []),
    "tag": _tool(
        "tag", "Label moments of this session (ticks tick_from..tick_to) so that they can be recalled by it.",
        {"tag": {"type": "string", "minLength": 1, "maxLength": 128}, "tick_from": _TICK, "tick_to": _TICK,
         "note": {"type": "string", "maxLength": TEXT_MAX_CHARS}},
        ["tag", "tick_from"]),
    "comment": _tool(
        "comment", "Attach a note to one moment of this session.",
        {"tick": _TICK, "content": {"type": "string", "minLength": 1, "maxLength": TEXT_MAX_CHARS}},
        ["tick", "content"]),
    "pin": _tool(
        "pin", "Keep moments of this session (ticks tick_from..tick_to) verbatim: never compressed or deleted by "
               "retention.",
        {"tick_from": _TICK, "tick_to": _TICK, "reason": {"type": "string", "maxLength": TEXT_MAX_CHARS}},
        ["tick_from", "tick_to"]),
    "request_compaction": _tool(
        "request_compaction", "Ask for this session's history to be condensed into a summary before the next "
                              "turn, freeing room in the prompt.",
        {}, []),
}


def offered(names: Sequence[str]) -> list[dict[str, Any]]:
    """The tool definitions for `names`, in the order they are named."""
    return [MEMORY_TOOLS[name] for name in names]
