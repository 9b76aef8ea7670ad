"""The harness tools as OpenAI function tools: their JSON-schema descriptions and a dispatcher.

The dispatcher calls the method named like the tool on whatever it is given (a Harness), so this module
sits below harness.py and needs nothing from it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from universe.laws.json_schema import law_defs

_WORLD = ("The universe is a ring of cells, each one of the symbols _ A B K; cell i's left neighbour is "
          "cell (i-1) mod L. Every step each cell's next symbol depends only on its (left, centre, right) "
          "symbols and its coordinate class i mod P, for an unknown period P.")


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str],
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required,
                  "additionalProperties": False, **(extra or {})}
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}


TOOLS: list[dict[str, Any]] = [
    _tool("evaluate_laws",
          f"{_WORLD} Judge candidate laws on fresh random trajectories (ring lengths 1-64, every "
          "(window, class) pair included). Returns per law PASS, FAIL with a small counterexample "
          "trajectory (shrunk in cells and steps; 't' and 'cell' say where it breaks), or ERROR naming "
          "the malformed node.",
          {"laws": {"type": "array", "items": {"$ref": "#/$defs/law"}, "minItems": 1, "maxItems": 32}},
          ["laws"], {"$defs": law_defs()}),
    _tool("run_prediction",
          f"{_WORLD} Predict the state one step after state_t0. Returns PASS, or FAIL with the true "
          "trajectory [state_t0, true_t1] and the cells you got wrong.",
          {"state_t0": {"type": "string", "pattern": "^[_ABK]+$", "maxLength": 4096},
           "predicted_t1": {"type": "string", "pattern": "^[_ABK]+$", "maxLength": 4096}},
          ["state_t0", "predicted_t1"]),
    _tool("request_samples",
          f"{_WORLD} Get random rings (4-16 cells) containing a pattern ('.' = any symbol), each "
          "simulated a few steps. Returns samples of {trajectory: [states], matches: [start cells]}.",
          {"pattern": {"type": "string", "pattern": "^[_ABK.]+$", "minLength": 1, "maxLength": 16},
           "count": {"type": "integer", "minimum": 1, "maximum": 32, "default": 4},
           "steps": {"type": "integer", "minimum": 1, "maximum": 8, "default": 1}},
          ["pattern"]),
    _tool("submit_theory",
          f"{_WORLD} Submit your complete theory to end the experiment: table[c][16*left + 4*centre + "
          "right] is the next symbol of a cell of class c (one 64-symbol string per class; symbol codes "
          "_=0 A=1 B=2 K=3). Every entry must be given. It is checked on 5,000 random states; returns "
          "solved, accuracy and, if wrong, one counterexample.",
          {"table": {"type": "array", "items": {"type": "string", "pattern": "^[_ABK]{64}$"},
                     "minItems": 1, "maxItems": 64}},
          ["table"]),
]

TOOL_NAMES = [tool["function"]["name"] for tool in TOOLS]
_JSON_TYPES = {"string": str, "integer": int, "array": list, "object": dict}


def call_tool(harness: object, name: str, arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """Run one tool call: `harness`'s method of that name. Anything wrong with it comes back as
    `{"error": message}`, so a model's malformed call becomes feedback instead of an exception."""
    spec = next((tool["function"] for tool in TOOLS if tool["function"]["name"] == name), None)
    if spec is None:
        return {"error": f"unknown tool {name!r}; known: {', '.join(TOOL_NAMES)}"}
    if arguments is None or arguments == "":
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return {"error": f"{name}: arguments are not valid JSON: {exc}"}
    if not isinstance(arguments, dict):
        return {"error": f"{name}: arguments must be a JSON object"}
    problem = check_arguments(spec["parameters"], arguments)
    if problem:
        return {"error": f"{name}: {problem}"}
    method: Callable[..., dict[str, Any]] = getattr(harness, name)
    try:
        return method(**arguments)
    except ValueError as exc:
        return {"error": f"{name}: {exc}"}


def check_arguments(parameters: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """The top level of the schema: required, unknown and wrongly typed arguments (the tools check
    values themselves)."""
    properties = parameters["properties"]
    for key in parameters["required"]:
        if key not in arguments:
            return f"missing argument {key!r}"
    for key, value in arguments.items():
        if key not in properties:
            return f"unknown argument {key!r}; expected {', '.join(properties)}"
        expected = _JSON_TYPES[properties[key]["type"]]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            return f"argument {key!r} must be of JSON type {properties[key]['type']}"
    return None
