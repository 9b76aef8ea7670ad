"""A steering hook as a third party would ship one (registered as entry point `ahc.steering:example` by
its dist-info beside it): it asks to damp any concept measured above 0.5 at a step, and, on a reply with
no activations, names the reply's first token, so each test sees directives either way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from server.recording.steering import SteeringDirective, SteeringInput

THRESHOLD = 0.5
CALLS: list[SteeringInput] = []  # what the hook was called with, for the tests to read


def example(reply: SteeringInput) -> Iterator[SteeringDirective | dict[str, Any]]:
    CALLS.append(reply)
    strong = [(step, name, value) for step in reply.steps for name, value in step.concepts.items()
              if value > THRESHOLD]
    for step, name, value in strong:
        yield SteeringDirective(f"damp {name}", f"{name} measured {value:.2f} > {THRESHOLD} at token {step.token!r}",
                                tick=step.tick, details={"concept": name, "value": value})
    if not strong and reply.steps:
        first = reply.steps[0]
        yield {"directive": "observe", "rationale": f"no concept above {THRESHOLD}; first token {first.token!r}",
               "tick": first.tick}
    yield {"directive": "", "rationale": "a malformed directive, logged and not recorded"}


def broken(reply: SteeringInput) -> list[SteeringDirective]:
    raise RuntimeError("this hook always fails")
