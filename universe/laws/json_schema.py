"""The law language as JSON Schema, for tool descriptions (the parser in ast.py is the authority)."""

from __future__ import annotations

import copy
import json
from typing import Any

from universe.laws.ast import MAX_REACH, OPS

_EXPR_REF = {"$ref": "#/$defs/expr"}

OP_HELP = (
    "Expression ops. Observables: count{symbol} (global int: cells holding it), "
    "count_pattern{pattern} (global int: ring positions where the pattern starts; '.' matches any), "
    "length (global int), transition_indicator (global int: cells that change from t to t+1), "
    "cell{offset} (cell int: symbol code of cell i+offset; _=0 A=1 B=2 K=3), "
    "neighbor_config (cell int: 16*left+4*centre+right), coordinate_class{period} (cell int: i mod period), "
    "changed (cell bool: cell i changes from t to t+1), matches{pattern} (cell bool: odd-length pattern "
    "centred on cell i). Literals: integers, booleans, symbol{value:'A'}, window{value:'A_B'}. "
    "Arithmetic: add, sub, mul, mod (divisor a positive literal), neg, abs. Comparisons: eq, ne, lt, le, "
    "gt, ge. Logic: and, or, not, implies. Over cells: sum, all_cells, any_cells. Time: at{dt} "
    "(value at t+dt), next (at t+1), always{within: T} (at every t..t+T), eventually{within: T} "
    "(at some t..t+T). Children go in 'args' (a list) or, for one child, 'expr'."
)


def law_defs() -> dict[str, Any]:
    """`$defs` for `expr` and `law`; refs are `#/$defs/...`, so put this at the schema's root."""
    symbols = {"type": "string", "pattern": "^[_ABK.]+$", "maxLength": 32}
    expr_object = {
        "type": "object",
        "description": OP_HELP,
        "required": ["op"],
        "properties": {
            "op": {"type": "string", "enum": OPS},
            "args": {"type": "array", "items": _EXPR_REF, "minItems": 1, "maxItems": 16},
            "expr": _EXPR_REF,
            "value": {"type": ["integer", "boolean", "string"]},
            "symbol": {"type": "string", "enum": list("_ABK")},
            "pattern": symbols,
            "offset": {"type": "integer", "minimum": -32, "maximum": 32},
            "period": {"type": "integer", "minimum": 1, "maximum": 64},
            "dt": {"type": "integer", "minimum": 0, "maximum": MAX_REACH},
            "within": {"type": "integer", "minimum": 0, "maximum": MAX_REACH},
        },
        "additionalProperties": False,
    }
    name = {"type": "string", "description": "Your label for the law, echoed back."}

    def law(kind: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {"type": "object", "description": description,
                "properties": {"law": {"const": kind}, "name": name, **properties},
                "required": ["law", *required], "additionalProperties": False}

    return {
        "expr": {"oneOf": [{"type": "integer"}, {"type": "boolean"}, expr_object]},
        "law": {"oneOf": [
            law("holds", "The boolean expr is true at every time t (and cell i, if it is per cell).",
                {"expr": _EXPR_REF}, ["expr"]),
            law("implication", "Wherever 'if' holds, 'then' holds.", {"if": _EXPR_REF, "then": _EXPR_REF},
                ["if", "then"]),
            law("invariant", "The global integer expr never changes from t to t+1.", {"expr": _EXPR_REF},
                ["expr"]),
            law("monotone", "The global integer expr never decreases (nondecreasing) or never increases.",
                {"expr": _EXPR_REF, "direction": {"enum": ["nondecreasing", "nonincreasing"]}},
                ["expr", "direction"]),
            law("local_transition",
                "A cell whose (left, centre, right) match 'context' ('.' = any) and whose coordinate class "
                "i mod period equals 'class' becomes 'becomes' at t+1.",
                {"context": {"type": "string", "pattern": "^[_ABK.]{3}$"},
                 "becomes": {"type": "string", "enum": list("_ABK")},
                 "period": {"type": "integer", "minimum": 1, "maximum": 64},
                 "class": {"type": "integer", "minimum": 0, "maximum": 63}},
                ["context", "becomes"]),
            law("symmetry",
                "Stepping commutes with the transformation: relabel symbols by 'permute', then mirror the "
                "ring if 'reflect', then rotate it by 'shift' cells.",
                {"reflect": {"type": "boolean"},
                 "permute": {"type": "object", "additionalProperties": {"enum": list("_ABK")}},
                 "shift": {"type": "integer"}}, []),
        ]},
    }


LAW_SCHEMA: dict[str, Any] = {"$defs": law_defs(), "$ref": "#/$defs/law"}


def bounded_law_schema(depth: int = 2, max_args: int = 3) -> dict[str, Any]:
    """The law language with expressions nested at most `depth` deep, `max_args` children each, and no
    descriptions: for small windows and small models. A recursive `expr` lets a grammar-constrained
    model nest `and` inside `and` until its token budget runs out (measured on a 135M model: every call
    cut off mid-JSON); unrolled, every law the grammar allows ends within a few hundred tokens."""
    if depth < 0 or max_args < 1:
        raise ValueError(f"depth must be ≥ 0 and max_args ≥ 1, got {depth} and {max_args}")
    defs = _strip_descriptions(law_defs())
    defs["expr"]["oneOf"][2]["properties"]["op"] = {"$ref": "#/$defs/op"}  # the long enum once, not per level
    leaf_object = copy.deepcopy(defs["expr"]["oneOf"][2])
    del leaf_object["properties"]["args"], leaf_object["properties"]["expr"]
    levels: dict[str, Any] = {"expr0": {"oneOf": [{"type": "integer"}, {"type": "boolean"}, leaf_object]}}
    for level in range(1, depth + 1):
        node = copy.deepcopy(defs["expr"]["oneOf"][2])
        child = {"$ref": f"#/$defs/expr{level - 1}"}
        node["properties"]["args"] = {"type": "array", "items": child, "minItems": 1, "maxItems": max_args}
        node["properties"]["expr"] = child
        levels[f"expr{level}"] = {"oneOf": [*levels["expr0"]["oneOf"], node]}
    law = json.loads(json.dumps(defs["law"]).replace('"#/$defs/expr"', f'"#/$defs/expr{depth}"'))
    op = {"type": "string", "enum": OPS}
    return {"$defs": {"op": op, **levels, "law": law}, "$ref": "#/$defs/law"}


def _strip_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_descriptions(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [_strip_descriptions(v) for v in schema]
    return schema
