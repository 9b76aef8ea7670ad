"""Measure servers side by side: machines drift more than the effects the benchmarks measure."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def alternating_rounds(measure_on: list[Callable[[], T]], rounds: int, warmup: bool = True) -> list[list[T]]:
    """A warm-up on each server (unless `warmup` is off: a smoke run, whose figures only have to exist),
    then `rounds` measured rounds of each, the order alternating round by round: servers measured in one
    run share the machine's drift, which is larger here than the effects measured."""
    if warmup:
        for measure in measure_on:
            measure()
    results: list[list[T]] = [[] for _ in measure_on]
    order = list(range(len(measure_on)))
    for r in range(rounds):
        for side in (order if r % 2 == 0 else order[::-1]):
            results[side].append(measure_on[side]())
    return results
