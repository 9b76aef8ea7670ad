"""The CTC governor: a character cap and a message-depth cap on the assembled prompt.

What goes first when over the cap: filler turns (small talk), then the oldest turns, then
non-verbatim karma, oldest first. Verbatim karma, the Identity and the Query are never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.assembler import AssemblyInput
from orchestrator.turn import Turn


@dataclass(frozen=True)
class CTCLimits:
    max_chars: int | None = None
    max_turns: int | None = None


def turn_groups(state: tuple[Turn, ...]) -> list[tuple[Turn, ...]]:
    """State split into turns: a user message with the replies and tool traffic that follow it."""
    groups: list[list[Turn]] = []
    for turn in state:
        if turn.role == "user" or not groups:
            groups.append([turn])
        else:
            groups[-1].append(turn)
    return [tuple(group) for group in groups]


def govern(inp: AssemblyInput, limits: CTCLimits,
           chars_of: Callable[[AssemblyInput], int]) -> tuple[AssemblyInput, list[str]]:
    """Apply the caps; returns the governed input and the actions taken (for the report and metric)."""
    actions: list[str] = []
    if limits.max_turns is not None:
        groups = turn_groups(inp.state)
        if len(groups) > limits.max_turns:
            kept = groups[len(groups) - limits.max_turns:]
            inp = replace(inp, state=tuple(t for group in kept for t in group))
            actions.append(f"ctc_depth:{len(groups) - limits.max_turns}")
    if limits.max_chars is None or chars_of(inp) <= limits.max_chars:
        return inp, actions

    dropped = 0
    for turn in [t for t in inp.state if t.is_filler]:
        if chars_of(inp) <= limits.max_chars:
            break
        inp = replace(inp, state=tuple(t for t in inp.state if t is not turn))
        dropped += 1
    if dropped:
        actions.append(f"ctc_prune_filler:{dropped}")

    dropped = 0
    while chars_of(inp) > limits.max_chars and len(turn_groups(inp.state)) > 1:
        inp = replace(inp, state=tuple(t for group in turn_groups(inp.state)[1:] for t in group))
        dropped += 1
    if dropped:
        actions.append(f"ctc_prune_turns:{dropped}")

    dropped = 0
    for entry in [k for k in inp.karma if not k.verbatim]:
        if chars_of(inp) <= limits.max_chars:
            break
        inp = replace(inp, karma=tuple(k for k in inp.karma if k is not entry))
        dropped += 1
    if dropped:
        actions.append(f"ctc_prune_karma:{dropped}")
    if chars_of(inp) > limits.max_chars:
        actions.append("ctc_over_cap")  # only verbatim facts, identity and query remain
    return inp, actions
