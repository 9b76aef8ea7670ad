"""The agent's tools: the universe harness's four, plus memory over its own history in XDB.

store_theorem / retrieve_theorems / edit_theorem keep the theory (each change is a meta_knowledge
snapshot), query_log searches the run's interaction_log so old trajectories are recalled, not carried
in the prompt. Every call returns a JSON object; anything wrong with a call (unknown tool, arguments
that are not a JSON object, a missing or mistyped argument, an unknown law id) is an `{"error": ...}`
result the agent reads next turn, never an exception.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.journal import clip
from agent.knowledge import THEOREM_STATUSES, Knowledge, Theorem, theorems_from_json
from agent.run_store import RunStore
from universe.harness import Harness
from universe.laws.json_schema import bounded_law_schema
from universe.tools import TOOLS as HARNESS_TOOLS
from universe.tools import check_arguments

HARNESS_NAMES = tuple(t["function"]["name"] for t in HARNESS_TOOLS)
QUERY_LOG_HITS = 5


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str],
          strict: bool = True) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": description,
                                "parameters": {"type": "object", "properties": properties, "required": required,
                                               "additionalProperties": False}}
    if strict:  # vLLM then constrains the arguments to the schema (structured outputs)
        function["strict"] = True
    return {"type": "function", "function": function}


MEMORY_TOOLS = [
    _tool("store_theorem", "Store laws that passed evaluate_laws repeatedly as a theorem (by law ids).",
          {"name": {"type": "string", "maxLength": 80},
           "law_ids": {"type": "array", "items": {"type": "string", "pattern": "^L[0-9]+$"}, "minItems": 1,
                       "maxItems": 32},
           "description": {"type": "string", "maxLength": 400}},
          ["name", "law_ids", "description"]),
    _tool("retrieve_theorems", "List stored theorems whose name, description or laws contain filter ('' = all).",
          {"filter": {"type": "string", "maxLength": 80}}, ["filter"]),
    _tool("edit_theorem", "Change a theorem: updates may set name, description, law_ids or status "
          "(established, restricted, retracted), and say why (reason); every version is kept.",
          {"theorem_id": {"type": "string", "pattern": "^T[0-9]+$"},
           "updates": {"type": "object", "properties": {
               "name": {"type": "string", "maxLength": 80}, "description": {"type": "string", "maxLength": 400},
               "law_ids": {"type": "array", "items": {"type": "string"}},
               "status": {"type": "string", "enum": list(THEOREM_STATUSES)},
               "reason": {"type": "string", "maxLength": 400}}, "additionalProperties": False}},
          ["theorem_id", "updates"]),
    _tool("query_log", "Search your own earlier turns (calls, results, notes) for a pattern such as 'AA_B' "
          "or for words; returns the matching turns.",
          {"query": {"type": "string", "minLength": 1, "maxLength": 80}}, ["query"]),
]

def _bounded_laws(tool: dict[str, Any]) -> dict[str, Any]:
    """Laws with expressions one level deep: the grammar then ends every call (a free `object`, or the
    recursive language, let a small model nest until its token budget ran out, the call cut mid-JSON)."""
    tool["function"]["parameters"]["$defs"] = bounded_law_schema(depth=1)["$defs"]
    return tool


# Small windows: the same tools with one-line descriptions and no law grammar (evaluate_laws' own
# schema carries all of it, ~3k tokens); the harness still checks every argument.
_STATE = {"type": "string", "pattern": "^[_ABK]+$", "maxLength": 64}
_TEXT = {"type": "string", "maxLength": 80}
COMPACT_TOOLS = [
    _bounded_laws(_tool("evaluate_laws", "Judge laws: PASS or FAIL.", {
        "laws": {"type": "array", "items": {"$ref": "#/$defs/law"}, "minItems": 1, "maxItems": 4}}, ["laws"])),
    _tool("run_prediction", "Predict the next state.", {"state_t0": _STATE, "predicted_t1": _STATE},
          ["state_t0", "predicted_t1"]),
    _tool("request_samples", "Sample rings holding a pattern.",
          {"pattern": {"type": "string", "pattern": "^[_ABK.]+$", "maxLength": 16},
           "count": {"type": "integer", "maximum": 8}, "steps": {"type": "integer", "maximum": 4}},
          ["pattern", "count", "steps"]),
    _tool("submit_theory", "Submit the full table.",
          {"table": {"type": "array", "items": {"type": "string", "pattern": "^[_ABK]{64}$"}, "maxItems": 8}},
          ["table"]),
    _tool("store_theorem", "Store passed laws as a theorem.",
          {"name": _TEXT, "law_ids": {"type": "array", "items": {"type": "string"}}, "description": _TEXT},
          ["name", "law_ids", "description"]),
    _tool("retrieve_theorems", "List theorems.", {"filter": _TEXT}, ["filter"]),
    _tool("edit_theorem", "Change a theorem.", {"theorem_id": _TEXT, "updates": {"type": "object"}},
          ["theorem_id", "updates"]),
    _tool("query_log", "Search your past turns.", {"query": _TEXT}, ["query"]),
]
# Under 4k tokens even those do not leave room for a journal: theorem upkeep goes (Karma shows them),
# and laws are free objects (the bounded grammar alone is ~1.4k tokens; the harness still checks them).
MINIMAL_LEFT_OUT = ("retrieve_theorems", "edit_theorem")
MINIMAL_EVALUATE_LAWS = _tool("evaluate_laws", "Judge laws: PASS or FAIL.", {
    "laws": {"type": "array", "items": {"type": "object"}, "maxItems": 8}}, ["laws"])


def tool_schemas(size: str = "full") -> list[dict[str, Any]]:
    """The OpenAI tools offered to a model: `full` (the harness's own schemas), `compact` or `minimal`
    for small context windows."""
    if size == "full":
        return copy.deepcopy(HARNESS_TOOLS + MEMORY_TOOLS)
    tools = copy.deepcopy(COMPACT_TOOLS)
    if size == "minimal":
        tools = [copy.deepcopy(MINIMAL_EVALUATE_LAWS) if t["function"]["name"] == "evaluate_laws" else t
                 for t in tools if t["function"]["name"] not in MINIMAL_LEFT_OUT]
    return tools


TOOL_NAMES = (*HARNESS_NAMES, *(t["function"]["name"] for t in MEMORY_TOOLS))


@dataclass
class Toolbox:
    harness: Harness
    store: RunStore
    run_id: str
    knowledge: Knowledge
    rule: str  # the rule's label (the run id's part): what the run's attempts are filed under
    turn: int = 0
    # Rows of turns cut off by a kill are not part of the run: (turn, attempt) must match a completed turn.
    valid_row: Callable[[dict[str, Any]], bool] = lambda row: True
    submissions: list[dict[str, Any]] = field(default_factory=list)

    def call(self, name: str, arguments: str | dict[str, Any] | None) -> dict[str, Any]:
        if name in HARNESS_NAMES:
            result = self.harness.call_tool(name, arguments)
            if name == "evaluate_laws" and "results" in result:
                self._register_laws(_as_object(arguments) or {}, result)
            if name == "submit_theory" and "error" not in result:
                self.submissions.append({"turn": self.turn, "table": (_as_object(arguments) or {}).get("table"),
                                         **{k: result.get(k) for k in ("solved", "complete", "accuracy")}})
                self.store.record_attempt(self.run_id, rule=self.rule, turn=self.turn, kind="submission",
                                          subject=f"submission {len(self.submissions)}",
                                          verdict="PASS" if result.get("solved") else "FAIL",
                                          detail=f"accuracy {result.get('accuracy')}")
            return result
        handler = getattr(self, f"_{name}", None) if name in TOOL_NAMES else None
        if handler is None:
            return {"error": f"unknown tool {name!r}; known: {', '.join(TOOL_NAMES)}"}
        args = _as_object(arguments)
        if args is None:
            return {"error": f"{name}: arguments must be a JSON object, got {clip(str(arguments), 80)!r}"}
        spec = next(t["function"]["parameters"] for t in MEMORY_TOOLS if t["function"]["name"] == name)
        problem = check_arguments(spec, args)
        return {"error": f"{name}: {problem}"} if problem else handler(**args)

    # ---- evaluate_laws: give every law an id the agent can cite -------------------------------------
    def _register_laws(self, arguments: dict[str, Any], result: dict[str, Any]) -> None:
        laws = arguments.get("laws") or []
        for verdict in result["results"]:
            k = verdict.get("law")
            if isinstance(k, int) and 0 <= k < len(laws) and verdict.get("status") in ("PASS", "FAIL"):
                law_id = self.knowledge.law_id(laws[k])
                self.knowledge.judge(law_id, verdict["status"], self.turn)
                verdict["law_id"] = law_id
                detail = verdict.get("counterexample")
                self.store.record_attempt(self.run_id, rule=self.rule, turn=self.turn, kind="law", subject=law_id,
                                          verdict=verdict["status"], law_json=json.dumps(laws[k]),
                                          detail=clip(json.dumps(detail), 600) if detail else None)

    # ---- memory tools ---------------------------------------------------------------------------
    def _store_theorem(self, name: str, law_ids: list[str], description: str) -> dict[str, Any]:
        problem = self._check_laws(law_ids)
        if problem:
            return {"error": f"store_theorem: {problem}"}
        theorem = Theorem(theorem_id=f"T{len(self.knowledge.theorems) + 1}", name=name, law_ids=list(law_ids),
                          description=description, laws=[self.knowledge.laws[i].law for i in law_ids],
                          turn=self.turn)
        self.knowledge.theorems.append(theorem)
        version = self.snapshot()
        self.store.record_theorem_version(self.run_id, theorem_id=theorem.theorem_id, change="stored", turn=self.turn,
                                          theorem_json=json.dumps(asdict(theorem), sort_keys=True), reason=description)
        return {"stored": theorem.theorem_id, "version": version}

    def _retrieve_theorems(self, filter: str) -> dict[str, Any]:  # noqa: A002 (the tool's argument name)
        latest = self.store.meta_knowledge(self.run_id)
        theorems = theorems_from_json(latest["theorems_json"]) if latest else []
        needle = filter.lower()
        found = [asdict(t) for t in theorems
                 if not needle or needle in f"{t.name} {t.description} {json.dumps(t.laws)}".lower()]
        return {"theorems": found, "count": len(found)}

    def _edit_theorem(self, theorem_id: str, updates: dict[str, Any]) -> dict[str, Any]:
        theorem = self.knowledge.theorem(theorem_id)
        if theorem is None:
            known = ", ".join(t.theorem_id for t in self.knowledge.theorems) or "none yet"
            return {"error": f"edit_theorem: no theorem {theorem_id!r} (stored: {known})"}
        problem = _check_updates(updates)
        if problem:
            return {"error": f"edit_theorem: {problem}"}
        updates = dict(updates)
        reason = updates.pop("reason", None)
        if not updates:
            return {"error": "edit_theorem: updates holds only a reason: nothing to change"}
        before = asdict(theorem)
        if "law_ids" in updates:
            problem = self._check_laws(updates["law_ids"])
            if problem:
                return {"error": f"edit_theorem: {problem}"}
            theorem.laws = [self.knowledge.laws[i].law for i in updates["law_ids"]]
        for key in ("name", "description", "law_ids", "status"):
            if key in updates:
                setattr(theorem, key, updates[key])
        version = self.snapshot()
        # The theorem stays current in place (Karma, retrieve_theorems); every version before it is kept
        # in theorem_versions, linked to its parent.
        change = _change(before, asdict(theorem))
        lineage = self.store.record_theorem_version(
            self.run_id, theorem_id=theorem_id, change=change, turn=self.turn,
            theorem_json=json.dumps(asdict(theorem), sort_keys=True), reason=reason or _what_changed(before, theorem))
        return {"edited": theorem_id, "change": change, "theorem": asdict(theorem), "version": version,
                "theorem_version": lineage}

    def _query_log(self, query: str) -> dict[str, Any]:
        """Substring search first (a state pattern such as 'AA_B': the latest matches, in order); if
        that finds nothing, the turns sharing the most words with the query, best first."""
        rows = [r for r in self.store.interactions(self.run_id, pattern=query) if self.valid_row(r)]
        words = [w for w in query.split() if len(w) > 1]
        if not rows and len(words) > 1:
            scored: dict[int, tuple[int, dict[str, Any]]] = {}
            for word in words:
                for r in self.store.interactions(self.run_id, pattern=word):
                    if self.valid_row(r):
                        hits = scored.get(r["turn_id"], (0, r))[0] + 1
                        scored[r["turn_id"]] = (hits, r)
            ranked = [r for _, r in sorted(scored.values(), key=lambda hr: (-hr[0], -hr[1]["turn_id"]))]
            return {"query": query, "matches": len(ranked), "turns": [_hit(r) for r in ranked[:QUERY_LOG_HITS]]}
        return {"query": query, "matches": len(rows), "turns": [_hit(r) for r in rows[-QUERY_LOG_HITS:]]}

    def _check_laws(self, law_ids: list[str]) -> str | None:
        for law_id in law_ids:
            if not isinstance(law_id, str):
                return "argument 'law_ids' must be a list of strings"
            record = self.knowledge.laws.get(law_id)
            if record is None:
                return f"unknown law id {law_id!r}: ids come from evaluate_laws results"
            if record.passes == 0 or record.fails:
                return f"law {law_id} has {record.passes} PASS and {record.fails} FAIL: only laws that passed qualify"
        return None

    def snapshot(self) -> int:
        """Write the theory's current state to meta_knowledge."""
        k = self.knowledge
        return self.store.save_meta_knowledge(self.run_id, theorems_json=k.theorems_json(),
                                              negative_knowledge=k.negative_knowledge or None,
                                              last_compacted_turn=k.last_compacted_turn)


def _change(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What kind of version an edit makes: a status change names it, else a new name alone is a rename."""
    if before["status"] != after["status"]:
        return "reinstated" if after["status"] == "established" else str(after["status"])
    changed = {k for k in after if after[k] != before[k]}
    return "renamed" if changed == {"name"} else "edited"


def _what_changed(before: dict[str, Any], theorem: Theorem) -> str:
    after = asdict(theorem)
    return "; ".join(f"{k}: {clip(str(before[k]), 80)} -> {clip(str(after[k]), 80)}"
                     for k in ("name", "status", "law_ids", "description") if before[k] != after[k]) or "unchanged"


def _check_updates(updates: dict[str, Any]) -> str | None:
    if not updates:
        return "updates is empty"
    for key, value in updates.items():
        if key not in ("name", "description", "law_ids", "status", "reason"):
            return f"unknown update {key!r}; expected name, description, law_ids, status or reason"
        if key == "law_ids":
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                return "law_ids must be a non-empty list of law ids"
        elif not isinstance(value, str):
            return f"{key} must be a string"
    if "status" in updates and updates["status"] not in THEOREM_STATUSES:
        return f"status must be one of {', '.join(THEOREM_STATUSES)}"
    return None


def _hit(row: dict[str, Any]) -> dict[str, Any]:
    call = _as_object(row.get("tool_call_json")) or {}
    return {"turn": call.get("turn"), "tool": call.get("name"), "arguments": clip(str(call.get("arguments")), 300),
            "result": clip(row.get("tool_result_json") or "", 600), "note": clip(row.get("journal_entry") or "", 200)}


def _as_object(arguments: Any) -> dict[str, Any] | None:
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or arguments == "":
        return {}
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return None
    return value if isinstance(value, dict) else None
