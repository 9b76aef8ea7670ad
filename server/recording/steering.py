"""The steering hook: a plug-in (an entry point of group `ahc.steering`, named by `lens.steering_hook`)
called after each completed reply with the reply's generated steps and the concept activations the lens
measured at each; it answers steering directives, what to change and why, and the server records each
as a `steering` timestep of the session (content: the directive; metadata: it, its rationale, the hook
and the step it answers). The rows go through the writer like every other, so the audit log chains them;
an operator reads them back with recall's `event_types=steering`.

Directives are recorded, not applied: vLLM offers no seam to change a request's hidden state between
steps from outside the model runner, so a directive is evidence of what the hook decided and why.

The hook runs once the reply is committed (its activations joined by the XDB writer), off the event
loop; a hook that raises or answers a malformed directive costs the reply nothing: it is logged, and
what was well formed is recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

from xdb import XDBClient
from xdb.owner import EVERY
from xdb.recall.recall import MAX_LIMIT
from xdb.rows import TimestepRow

log = logging.getLogger("ahc.steering")

ENTRY_POINT_GROUP = "ahc.steering"
EVENT_TYPE = "steering"
# A directive's text and rationale are stored in full in a timestep's content: bounded as a message's.
DIRECTIVE_MAX_CHARS = 4_000


@dataclass(frozen=True)
class SteeringStep:
    """One generated token of the reply: its tick, text and the concepts the lens measured (top k)."""

    tick: int
    token: str
    concepts: dict[str, float]


@dataclass(frozen=True)
class SteeringInput:
    """What a hook is called with: the reply's session, request and steps, in order."""

    session_id: str
    request_id: str
    steps: list[SteeringStep]


@dataclass(frozen=True)
class SteeringDirective:
    """What to change (`directive`, e.g. "suppress deception"), why (`rationale`), at which step (`tick`,
    None: the reply as a whole), and anything else the hook wants kept with it (`details`)."""

    directive: str
    rationale: str
    tick: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("directive", "rationale"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"a steering directive needs a non-empty {name}")
            if len(value) > DIRECTIVE_MAX_CHARS:
                raise ValueError(f"a steering directive's {name} is over {DIRECTIVE_MAX_CHARS} characters")


SteeringHook = Callable[[SteeringInput], Iterable[SteeringDirective | dict[str, Any]]]


class Recorder(Protocol):
    """What steering uses of server/recording/recorder.py's Recorder."""

    async def aflush(self, timeout: float = 10.0, session_id: str | None = None) -> None: ...

    def rows(self, session_id: str, events: list[tuple[str, str | None, str, dict[str, Any] | None]],
             request_id: str | None = None) -> list[TimestepRow]: ...

    def submit(self, rows: list[TimestepRow]) -> None: ...


def load_hook(name: str) -> SteeringHook:
    """The installed hook `name` (its entry point's object, called per reply); a ValueError naming the
    installed ones when none has that name."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        known = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise ValueError(f"lens.steering_hook: no steering hook {name!r} is installed (entry point group "
                         f"{ENTRY_POINT_GROUP!r}); installed: {', '.join(known) or 'none'}")
    hook = found[0].load()
    if not callable(hook):
        raise ValueError(f"lens.steering_hook: {name!r} ({found[0].value}) is not callable")
    return hook  # type: ignore[no-any-return]


class Steering:
    """Calls the hook after each reply and records its directives through the recorder."""

    def __init__(self, name: str, hook: SteeringHook, xdb: XDBClient) -> None:
        self.name = name
        self.hook = hook
        self.xdb = xdb
        self._tasks: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak references

    def after_reply(self, recorder: Recorder, session_id: str, request_id: str, ticks: list[tuple[int, int]]) -> None:
        """Schedule the hook for a completed reply whose tokens took the tick ranges `ticks`."""
        if not ticks:
            return
        task = asyncio.get_running_loop().create_task(self.steer(recorder, session_id, request_id, ticks))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def steer(self, recorder: Recorder, session_id: str, request_id: str, ticks: list[tuple[int, int]]) -> None:
        try:
            await recorder.aflush(session_id=session_id)  # the reply's rows, with their activations
            directives = await asyncio.to_thread(self.decide, session_id, request_id, ticks)
        except Exception:  # a hook's failure must not touch the reply; it is logged loudly
            log.exception("steering hook %r failed on request %s", self.name, request_id)
            return
        recorder.submit(recorder.rows(session_id, [self.event(d) for d in directives], request_id))

    def event(self, d: SteeringDirective) -> tuple[str, str | None, str, dict[str, Any] | None]:
        """A directive's row: the directive as JSON for its content, its parts in the metadata."""
        meta: dict[str, Any] = {"directive": d.directive, "rationale": d.rationale, "hook": self.name,
                                "step_tick": d.tick}
        if d.details:
            meta["details"] = d.details
        return EVENT_TYPE, None, json.dumps(asdict(d), sort_keys=True), meta

    def decide(self, session_id: str, request_id: str, ticks: list[tuple[int, int]]) -> list[SteeringDirective]:
        """The reply's steps read back from XDB, the hook's answer checked (what is malformed is logged)."""
        steps = [SteeringStep(int(r["tick"]), r.get("content") or "", dict(r.get("concept_activations") or {}))
                 for lo, hi in ticks
                 for r in self.xdb.recall({"session_id": session_id, "event_types": ["output"], "tick_from": lo,
                                           "tick_to": hi, "limit": MAX_LIMIT}, owner=EVERY)
                 if r.get("request_id") == request_id]
        kept: list[SteeringDirective] = []
        for answer in self.hook(SteeringInput(session_id, request_id, steps)):
            try:
                kept.append(answer if isinstance(answer, SteeringDirective) else SteeringDirective(**answer))
            except (TypeError, ValueError) as exc:
                log.warning("steering hook %r answered a malformed directive %r: %s", self.name, answer, exc)
        return kept
