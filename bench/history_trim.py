"""An ordinary agent client's answer to a full window: drop the oldest turns, as few as make it fit.

What LangChain's `trim_messages(strategy="last", include_system=True, start_on="human")` does, counted
in whole turn groups: the system prompt stays, and a group (a user message with the replies and tool
traffic that follow it, up to the next user message) goes whole, so a tool result never loses the call
it answers and the history still starts on a user message. Only when the newest group alone is too
large are its oldest tool exchanges (a call with its results) dropped, after its user message, and
last that user message too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
Count = Callable[[list[Message]], int]  # a whole prompt's tokens, as the server will count them


@dataclass(frozen=True)
class Trimmed:
    """The history that fits, and what was dropped to get there."""

    history: list[Message]
    dropped_groups: int = 0
    dropped_messages: int = 0


def turn_groups(history: Sequence[Message]) -> list[list[Message]]:
    """The history split at each user message (what comes before the first one is a group too)."""
    groups: list[list[Message]] = []
    for message in history:
        if message.get("role") == "user" or not groups:
            groups.append([message])
        else:
            groups[-1].append(message)
    return groups


def exchanges(group: Sequence[Message]) -> list[list[Message]]:
    """A group split into its leading user message and each assistant message with the tool results
    that answer it."""
    parts: list[list[Message]] = []
    for message in group:
        if message.get("role") == "tool" and parts:
            parts[-1].append(message)
        else:
            parts.append([message])
    return parts


def flat(parts: Sequence[Sequence[Message]]) -> list[Message]:
    return [m for part in parts for m in part]


def trim(system: Sequence[Message], history: Sequence[Message], count: Count, budget: int) -> Trimmed:
    """`history` less the fewest oldest groups that bring the prompt (`system` + history) to at most
    `budget` tokens; a ValueError when even the system prompt and the newest message do not fit."""
    groups = turn_groups(history)
    for dropped in range(len(groups)):
        kept = flat(groups[dropped:])
        if count([*system, *kept]) <= budget:
            return Trimmed(kept, dropped, len(history) - len(kept))
    return trim_newest(system, history, groups[-1], count, budget)


def trim_newest(system: Sequence[Message], history: Sequence[Message], group: list[Message], count: Count,
                budget: int) -> Trimmed:
    """The newest group alone is too large: keep its user message (when it starts with one) and drop
    its oldest exchanges after it, as few as fit; failing that, the newest exchange alone."""
    parts = exchanges(group)
    head = parts[:1] if group[0].get("role") == "user" else []
    body = parts[len(head):]
    candidates = [[*head, *body[dropped:]] for dropped in range(1, len(body))] + ([body[-1:]] if body else [])
    for parts_kept in candidates:
        kept = flat(parts_kept)
        if count([*system, *kept]) <= budget:
            return Trimmed(kept, len(turn_groups(history)) - 1, len(history) - len(kept))
    raise ValueError(f"the system prompt and the newest message need more than {budget} tokens: "
                     "shorten the script or widen the window")
