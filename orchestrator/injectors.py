"""Artifact injectors: plug-ins (Python entry points in the group `ahc.injectors`, each a zero-argument factory
returning an `Injector` whose `name` is the entry point's) through which a deployment adds artifacts to a
request's context before assembly: the current text of the files an agent edits, a tool's latest output.

Only the injectors `orchestrator.injectors` names run, in that order. What they return joins the request's own
Codex documents and Karma entries after them, in the order returned, so the blocks before stay as they were and
an unchanged artifact renders the same text: the prefix cache holds."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from core.errors import InvalidRequest
from orchestrator.context_spec import CodexDoc, ContextSpec, KarmaEntry
from orchestrator.plugins import check_methods, load_group

ENTRY_POINT_GROUP = "ahc.injectors"


@dataclass(frozen=True)
class InjectionRequest:
    """What an injector is told of one request. `session_id`: the session it continues, as stored (with the
    tenant's prefix), None for a request that names none; `tenant`: the tenant's id prefix ("" on a server
    with one key or none); `context`: the request's `context` as the client sent it (references resolved)."""

    session_id: str | None
    tenant: str
    context: ContextSpec


class Injector(Protocol):
    name: str

    # Pure in its inputs and the artifacts it reads: the same artifacts must give the same items.
    def inject(self, request: InjectionRequest) -> Sequence[CodexDoc | KarmaEntry]: ...


def _injector(name: str, made: object) -> Injector:
    check_methods("Injector", name, made, ("inject",))
    return cast(Injector, made)


class Injectors:
    """The injectors a configuration enables, loaded when the orchestrator is built: a name that is not
    installed, or whose plug-in failed to load, stops the server there with a ValueError naming it."""

    def __init__(self, names: Sequence[str]) -> None:
        self.chosen: list[Injector] = []
        if not names:
            return  # nothing enabled: no plug-in is even imported
        loaded = load_group(ENTRY_POINT_GROUP, _injector)
        for name in names:
            if name in loaded.broken:
                raise ValueError(f"orchestrator.injectors: plug-in {name!r} failed to load ({loaded.broken[name]})")
            if name not in loaded.plugins:
                known = ", ".join(sorted(loaded.plugins)) or "none installed"
                raise ValueError(f"orchestrator.injectors: no injector {name!r} in the {ENTRY_POINT_GROUP!r} entry "
                                 f"points (known: {known})")
            self.chosen.append(loaded.plugins[name])

    async def apply(self, spec: ContextSpec, session_id: str | None, tenant: str) -> ContextSpec:
        """`spec` with every enabled injector's items after its own Codex documents and Karma entries."""
        if not self.chosen:
            return spec
        request = InjectionRequest(session_id, tenant, spec)
        codex, karma = list(spec.codex), list(spec.karma)
        ids: dict[str, set[str | None]] = {"context.codex": {getattr(e, "id", None) for e in codex},
                                           "context.karma": {e.id for e in karma}}
        for injector in self.chosen:
            # An injector may read files or ask a tool: off the event loop.
            for item in await asyncio.to_thread(injector.inject, request):
                if isinstance(item, CodexDoc):
                    param, into = "context.codex", cast(list[object], codex)
                elif isinstance(item, KarmaEntry):
                    param, into = "context.karma", cast(list[object], karma)
                else:
                    raise TypeError(f"injector {injector.name!r} returned {type(item).__name__}, "
                                    "not a CodexDoc or KarmaEntry")
                if item.id in ids[param]:
                    raise InvalidRequest(f"{param}: id {item.id!r} is also injected by {injector.name!r}",
                                         param=param)
                ids[param].add(item.id)
                into.append(item)
        return spec.model_copy(update={"codex": codex, "karma": karma})
