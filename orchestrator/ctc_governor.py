"""The CTC governor: a character cap and a message-depth cap on the assembled prompt.

What goes first when over the cap: filler messages (small talk), then the oldest turns, then
non-verbatim karma, oldest first. Verbatim karma, the Identity and the Query are never touched.

The caps are a safety net behind compaction, not a second compaction: dropping the oldest turns moves
the start of the State block, so every token after it is prefilled again. A cap that bit on every turn
would break the prefix cache on every turn. So the caps a config leaves unset follow the window from
above what compaction keeps, and the oldest turns are dropped in steps, so the State's start moves
once per step rather than on every turn.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from core.config import OrchestratorConfig
from orchestrator.assembler import AssemblyInput
from orchestrator.message import Message

# A BPE tokenizer's characters per token on English prose and code (3.5 to 4.5): the character cap is
# a share of the window in characters at this rate. Text denser in tokens meets the token budget (and
# compaction) long before the cap; the cap catches text that is long in characters but short in tokens.
CHARS_PER_TOKEN = 4
# That share is 90%, so the cap bites a little before the token window would, and at least HEADROOM
# of the window above the compaction threshold (0.5 + 0.4 by default): the State grows to the threshold
# with the Identity, Karma, Codex or excerpts and the new turn on top of it and still stays under the
# cap, so compaction, which keeps the facts in its summary, acts first.
WINDOW_SHARE = 0.9
HEADROOM = 0.4
# Turn groups (a user message and what follows it) kept at most: far more than a window of real turns
# holds, so the cap acts only on floods of tiny messages, and never below four times what compaction
# keeps verbatim, or every turn after a compaction would be cut again.
DEPTH = 512
# Oldest turns go in steps of an eighth of the cap (turns, or characters of State), so the cut, and
# with it the cache break, moves only once the State has grown by a step.
STEPS = 8


@dataclass(frozen=True)
class CTCLimits:
    """None leaves that cap off."""

    max_chars: int | None = None
    max_turns: int | None = None


def ctc_limits(config: OrchestratorConfig, max_model_len: int) -> CTCLimits:
    """The caps for a window: the config's where it sets them (0: off), else derived from the window."""
    max_chars, max_turns = config.max_chars, config.max_turns
    if max_chars is None:
        tokens = max(WINDOW_SHARE * max_model_len, config.compaction_tokens(max_model_len) + HEADROOM * max_model_len)
        max_chars = math.ceil(tokens * CHARS_PER_TOKEN)
    if max_turns is None:
        max_turns = max(DEPTH, 4 * config.compaction_keep_turns)
    return CTCLimits(max_chars or None, max_turns or None)


def turn_groups(state: tuple[Message, ...]) -> list[tuple[Message, ...]]:
    """State split into turns: a user message with the replies and tool traffic that follow it."""
    groups: list[list[Message]] = []
    for message in state:
        if message.role == "user" or not groups:
            groups.append([message])
        else:
            groups[-1].append(message)
    return [tuple(group) for group in groups]


def govern(inp: AssemblyInput, limits: CTCLimits,
           chars_of: Callable[[AssemblyInput], int]) -> tuple[AssemblyInput, list[str]]:
    """Apply the caps; returns the governed input and the actions taken (for the report and metric)."""
    actions: list[str] = []
    if limits.max_turns is not None:
        groups = turn_groups(inp.state)
        if len(groups) > limits.max_turns:
            step = max(limits.max_turns // STEPS, 1)
            cut = min(math.ceil((len(groups) - limits.max_turns) / step) * step, len(groups) - 1)
            inp = _without_oldest(inp, groups, cut)
            actions.append(f"ctc_depth:{cut}")
    if limits.max_chars is None or chars_of(inp) <= limits.max_chars:
        return inp, actions

    dropped = 0
    for filler in [m for m in inp.state if m.is_filler]:
        if chars_of(inp) <= limits.max_chars:
            break
        inp = replace(inp, state=tuple(m for m in inp.state if m is not filler))
        dropped += 1
    if dropped:
        actions.append(f"ctc_prune_filler:{dropped}")

    if chars_of(inp) > limits.max_chars:
        groups = turn_groups(inp.state)
        cut = _stable_cut(groups, _least_cut(inp, groups, limits.max_chars, chars_of),
                          max(limits.max_chars // STEPS, 1))
        if cut:
            inp = _without_oldest(inp, groups, cut)
            actions.append(f"ctc_prune_turns:{cut}")

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


def _without_oldest(inp: AssemblyInput, groups: list[tuple[Message, ...]], cut: int) -> AssemblyInput:
    return replace(inp, state=tuple(t for group in groups[cut:] for t in group))


def _least_cut(inp: AssemblyInput, groups: list[tuple[Message, ...]], max_chars: int,
               chars_of: Callable[[AssemblyInput], int]) -> int:
    """The fewest oldest groups to drop for the cap (the last group always stays): a binary search, as
    each try assembles the prompt."""
    low, high = 0, len(groups) - 1
    while low < high:
        mid = (low + high) // 2
        if chars_of(_without_oldest(inp, groups, mid)) <= max_chars:
            high = mid
        else:
            low = mid + 1
    return low


def _stable_cut(groups: list[tuple[Message, ...]], least: int, step: int) -> int:
    """`least` moved on to where the State's characters up to it reach a multiple of `step`. Those
    points depend only on the State's oldest turns, which do not change as it grows, so the cut stays
    put until the State has grown by about a step."""
    done = sum(t.chars for group in groups[:least] for t in group)
    target = math.ceil(done / step) * step
    cut = least
    while cut < len(groups) - 1 and done < target:
        done += sum(t.chars for t in groups[cut])
        cut += 1
    return cut
