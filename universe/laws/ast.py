"""The law language's JSON AST: its schema, and a parser that type-checks it.

An expression is a JSON object `{"op": ..., ...}` (or a bare integer or boolean literal). Each has a
type (`int` or `bool`), a scope (`global`: one value per grid and time; `cell`: one per cell) and a
reach (how many steps past `t` it looks). A law is a JSON object `{"law": kind, ...}`; every kind means
"for every trajectory, every time t (and every cell, for cell-scoped ones)":

| law | meaning |
| --- | --- |
| `holds` `expr` | the boolean `expr` is true |
| `implication` `if`, `then` | `if` → `then` |
| `invariant` `expr` | the global integer `expr` is the same at t+1 as at t |
| `monotone` `expr`, `direction` | it never decreases (`nondecreasing`) / increases (`nonincreasing`) |
| `local_transition` `context`, `becomes`, [`period`, `class`] | see below |
| `symmetry` [`reflect`, `permute`, `shift`] | the dynamics commute with the transformation |

`local_transition`: a cell whose neighbourhood matches `context` (3 symbols, `.` = any) and whose
coordinate class (i mod period) is `class` is `becomes` at t+1. `symmetry`: transforming then stepping
equals stepping then transforming.

A malformed law raises ValueError naming the node by its JSON path, e.g. `$.expr.args[1]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from universe.symbols import CODES, SYMBOLS

MAX_REACH = 64  # steps a law may look ahead: bounds the trajectories the judge must simulate
WILDCARD = "."
INT, BOOL = "int", "bool"
GLOBAL, CELL = "global", "cell"


@dataclass(frozen=True)
class Expr:
    op: str
    args: tuple[Expr, ...] = ()
    value: int = 0                 # literal value, offset, period, dt or window
    pattern: tuple[int, ...] = ()  # symbol codes, -1 for the wildcard
    type: str = INT
    scope: str = GLOBAL
    reach: int = 0
    path: str = "$"


@dataclass(frozen=True)
class Law:
    kind: str
    expr: Expr | None              # the boolean (holds-like kinds) or the quantity (invariant, monotone)
    reach: int                     # steps one check needs: a violation at t is seen in rows t..t+reach
    name: str | None = None
    direction: str = ""            # monotone
    reflect: bool = False          # symmetry
    permute: tuple[int, ...] = (0, 1, 2, 3)
    shift: int = 0
    source: dict[str, Any] = field(default_factory=dict, compare=False)


class LawError(ValueError):
    """A malformed law; the message names the node."""


def _fail(path: str, node: Any, message: str) -> LawError:
    op = node.get("op") or node.get("law") if isinstance(node, dict) else None
    where = f"{path} ({op!r})" if op else path
    return LawError(f"{where}: {message}")


# ---- the expression ops -------------------------------------------------------------------------
# name → (fields the node may carry besides op/args/expr, number of children (min, max), result type)
_LEAVES = {
    "const": {"value"},
    "symbol": {"value"},
    "window": {"value"},
    "count": {"symbol"},
    "count_pattern": {"pattern"},
    "length": set(),
    "transition_indicator": set(),
    "cell": {"offset"},
    "neighbor_config": set(),
    "coordinate_class": {"period"},
    "changed": set(),
    "matches": {"pattern"},
}
_ARITH = {"add": (2, 16), "mul": (2, 16), "sub": (2, 2), "mod": (2, 2), "neg": (1, 1), "abs": (1, 1)}
_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
_LOGIC = {"and": (1, 16), "or": (1, 16), "not": (1, 1), "implies": (2, 2)}
_AGGREGATE = {"sum", "all_cells", "any_cells"}
_TIME = {"at": {"dt"}, "next": set(), "always": {"within"}, "eventually": {"within"}}
OPS = sorted([*_LEAVES, *_ARITH, *_COMPARE, *_LOGIC, *_AGGREGATE, *_TIME])


def _int_field(node: dict[str, Any], key: str, path: str, low: int, high: int, default: int | None = None) -> int:
    if key not in node:
        if default is None:
            raise _fail(path, node, f"missing field {key!r}")
        return default
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(path, node, f"field {key!r} must be an integer in {low}..{high}, got {value!r}")
    return value


def _symbols_field(node: dict[str, Any], key: str, path: str, wildcard: bool,
                   length: int | None = None) -> tuple[int, ...]:
    if key not in node:
        raise _fail(path, node, f"missing field {key!r}")
    value = node[key]
    allowed = SYMBOLS + (WILDCARD if wildcard else "")
    if not isinstance(value, str) or not value or (length is not None and len(value) != length):
        size = {None: "symbols", 1: "one symbol"}.get(length, f"{length} symbols")
        raise _fail(path, node, f"field {key!r} must be a string of {size} over {allowed}, got {value!r}")
    if len(value) > 32:
        raise _fail(path, node, f"field {key!r} is longer than 32 symbols")
    bad = next((ch for ch in value if ch not in allowed), None)
    if bad is not None:
        raise _fail(path, node, f"field {key!r} has {bad!r}, outside {allowed}")
    return tuple(-1 if ch == WILDCARD else CODES[ch] for ch in value)


def _children(node: dict[str, Any], path: str, low: int, high: int) -> list[tuple[Any, str]]:
    if "args" in node and "expr" in node:
        raise _fail(path, node, "give either 'args' or 'expr', not both")
    items: Any  # JSON: a list only once checked
    if "expr" in node:
        items, key = [node["expr"]], "expr"
    else:
        items, key = node.get("args"), "args"
        if not isinstance(items, list):
            raise _fail(path, node, f"needs 'args', a list of {low}..{high} expressions")
    if not low <= len(items) <= high:
        raise _fail(path, node, f"takes {low}..{high} arguments, got {len(items)}")
    return [(item, f"{path}.expr" if key == "expr" else f"{path}.args[{k}]") for k, item in enumerate(items)]


def _want(child: Expr, kind: str, parent: dict[str, Any], path: str) -> None:
    if child.type != kind:
        raise _fail(path, parent, f"expects {kind} arguments, got {child.type} at {child.path}")


def _join(args: list[Expr]) -> tuple[str, int]:
    scope = CELL if any(a.scope == CELL for a in args) else GLOBAL
    return scope, max(a.reach for a in args)


def _check_fields(node: dict[str, Any], path: str, allowed: set[str]) -> None:
    extra = set(node) - allowed - {"op"}
    if extra:
        raise _fail(path, node, f"unknown field {sorted(extra)[0]!r}")


def parse_expr(node: Any, path: str = "$") -> Expr:
    """JSON → a typed Expr, or LawError naming the node."""
    if isinstance(node, bool):
        return Expr("const", value=int(node), type=BOOL, path=path)
    if isinstance(node, int):
        return Expr("const", value=node, path=path)
    if isinstance(node, str):
        raise _fail(path, node, f"a bare string {node!r} is not an expression; use "
                    '{"op": "symbol", "value": "A"} or {"op": "window", "value": "A_B"}')
    if not isinstance(node, dict):
        raise _fail(path, node, f"an expression must be an object, integer or boolean, got {type(node).__name__}")
    op = node.get("op")
    if not isinstance(op, str):
        raise _fail(path, node, "missing 'op'")
    if op not in OPS:
        raise _fail(path, node, f"unknown op {op!r}; known: {', '.join(OPS)}")
    if op in _LEAVES:
        _check_fields(node, path, _LEAVES[op])
        return _parse_leaf(op, node, path)
    if op in _TIME:
        _check_fields(node, path, _TIME[op] | {"args", "expr"})
        (child_node, child_path), = _children(node, path, 1, 1)
        child = parse_expr(child_node, child_path)
        if op in ("at", "next"):
            dt = 1 if op == "next" else _int_field(node, "dt", path, 0, MAX_REACH)
            reach = child.reach + dt
            result = Expr(op, (child,), value=dt, type=child.type, scope=child.scope, reach=reach, path=path)
        else:
            within = _int_field(node, "within", path, 0, MAX_REACH)
            _want(child, BOOL, node, path)
            reach = child.reach + within
            result = Expr(op, (child,), value=within, type=BOOL, scope=child.scope, reach=reach, path=path)
        if reach > MAX_REACH:
            raise _fail(path, node, f"looks {reach} steps ahead; at most {MAX_REACH}")
        return result
    _check_fields(node, path, {"args", "expr"})
    if op in _ARITH:
        args = [parse_expr(n, p) for n, p in _children(node, path, *_ARITH[op])]
        for a in args:
            _want(a, INT, node, path)
        if op == "mod" and not (args[1].op == "const" and args[1].value > 0):
            raise _fail(path, node, "the divisor of 'mod' must be a positive integer literal")
        scope, reach = _join(args)
        return Expr(op, tuple(args), type=INT, scope=scope, reach=reach, path=path)
    if op in _COMPARE:
        args = [parse_expr(n, p) for n, p in _children(node, path, 2, 2)]
        if op in ("eq", "ne"):
            if args[0].type != args[1].type:
                raise _fail(path, node, f"compares {args[0].type} with {args[1].type}")
        else:
            for a in args:
                _want(a, INT, node, path)
        scope, reach = _join(args)
        return Expr(op, tuple(args), type=BOOL, scope=scope, reach=reach, path=path)
    if op in _LOGIC:
        args = [parse_expr(n, p) for n, p in _children(node, path, *_LOGIC[op])]
        for a in args:
            _want(a, BOOL, node, path)
        scope, reach = _join(args)
        return Expr(op, tuple(args), type=BOOL, scope=scope, reach=reach, path=path)
    if op in _AGGREGATE:
        (child_node, child_path), = _children(node, path, 1, 1)
        child = parse_expr(child_node, child_path)
        if child.scope != CELL:
            raise _fail(path, node, f"aggregates a cell expression, got a global one at {child.path}")
        if op != "sum":
            _want(child, BOOL, node, path)
        return Expr(op, (child,), type=INT if op == "sum" else BOOL, scope=GLOBAL, reach=child.reach, path=path)
    raise AssertionError(f"op {op!r} is listed but not parsed")


def _parse_leaf(op: str, node: dict[str, Any], path: str) -> Expr:
    if op == "const":
        value = node.get("value")
        if not isinstance(value, (bool, int)):
            raise _fail(path, node, f"field 'value' must be an integer or boolean, got {value!r}")
        return Expr(op, value=int(value), type=BOOL if isinstance(value, bool) else INT, path=path)
    if op == "symbol":
        return Expr("const", value=_symbols_field(node, "value", path, False, 1)[0], path=path)
    if op == "window":
        left, centre, right = _symbols_field(node, "value", path, False, 3)
        return Expr("const", value=16 * left + 4 * centre + right, path=path)
    if op == "count":
        return Expr(op, value=_symbols_field(node, "symbol", path, False, 1)[0], path=path)
    if op == "count_pattern":
        return Expr(op, pattern=_symbols_field(node, "pattern", path, True), path=path)
    if op == "matches":
        pattern = _symbols_field(node, "pattern", path, True)
        if len(pattern) % 2 == 0:
            raise _fail(path, node, "field 'pattern' must have odd length: it is centred on the cell")
        return Expr(op, pattern=pattern, type=BOOL, scope=CELL, path=path)
    if op == "length":
        return Expr(op, path=path)
    if op == "transition_indicator":
        return Expr(op, reach=1, path=path)
    if op == "cell":
        return Expr(op, value=_int_field(node, "offset", path, -32, 32, default=0), scope=CELL, path=path)
    if op == "neighbor_config":
        return Expr(op, scope=CELL, path=path)
    if op == "coordinate_class":
        return Expr(op, value=_int_field(node, "period", path, 1, 64), scope=CELL, path=path)
    return Expr("changed", type=BOOL, scope=CELL, reach=1, path=path)


# ---- laws ---------------------------------------------------------------------------------------
_LAW_FIELDS = {
    "holds": {"expr"},
    "implication": {"if", "then"},
    "invariant": {"expr"},
    "monotone": {"expr", "direction"},
    "local_transition": {"context", "becomes", "period", "class"},
    "symmetry": {"reflect", "permute", "shift"},
}
LAW_KINDS = sorted(_LAW_FIELDS)


def parse_law(node: Any, path: str = "$") -> Law:
    """JSON → a checked Law, or LawError naming the node."""
    if isinstance(node, Law):
        return node
    if not isinstance(node, dict):
        raise _fail(path, node, f"a law must be an object, got {type(node).__name__}")
    kind = node.get("law")
    if kind not in _LAW_FIELDS:
        raise _fail(path, node, f"unknown law kind {kind!r}; known: {', '.join(LAW_KINDS)}")
    extra = set(node) - _LAW_FIELDS[kind] - {"law", "name"}
    if extra:
        raise _fail(path, node, f"unknown field {sorted(extra)[0]!r}")
    name = node.get("name")
    if name is not None and not isinstance(name, str):
        raise _fail(path, node, "field 'name' must be a string")
    build = {"holds": _holds, "implication": _implication, "invariant": _quantity, "monotone": _quantity,
             "local_transition": _local_transition, "symmetry": _symmetry}[kind]
    return build(kind, node, path, name)


def _need(node: dict[str, Any], key: str, path: str) -> Any:
    if key not in node:
        raise _fail(path, node, f"missing field {key!r}")
    return node[key]


def _holds(kind: str, node: dict[str, Any], path: str, name: str | None) -> Law:
    expr = parse_expr(_need(node, "expr", path), f"{path}.expr")
    if expr.type != BOOL:
        raise _fail(path, node, f"'expr' must be boolean, got {expr.type}")
    return Law(kind, expr, expr.reach, name, source=node)


def _implication(kind: str, node: dict[str, Any], path: str, name: str | None) -> Law:
    premise = parse_expr(_need(node, "if", path), f"{path}.if")
    conclusion = parse_expr(_need(node, "then", path), f"{path}.then")
    for part in (premise, conclusion):
        if part.type != BOOL:
            raise _fail(path, node, f"{part.path} must be boolean, got {part.type}")
    scope, reach = _join([premise, conclusion])
    expr = Expr("implies", (premise, conclusion), type=BOOL, scope=scope, reach=reach, path=path)
    return Law(kind, expr, expr.reach, name, source=node)


def _quantity(kind: str, node: dict[str, Any], path: str, name: str | None) -> Law:
    expr = parse_expr(_need(node, "expr", path), f"{path}.expr")
    if expr.type != INT or expr.scope != GLOBAL:
        raise _fail(path, node, f"'expr' must be a global integer (e.g. a count, or a 'sum' over cells), "
                    f"got a {expr.scope} {expr.type}")
    direction: Any = ""  # JSON until checked
    if kind == "monotone":
        direction = node.get("direction")
        if direction not in ("nondecreasing", "nonincreasing"):
            raise _fail(path, node, "field 'direction' must be 'nondecreasing' or 'nonincreasing', "
                        f"got {direction!r}")
    if expr.reach + 1 > MAX_REACH:
        raise _fail(path, node, f"looks {expr.reach + 1} steps ahead; at most {MAX_REACH}")
    return Law(kind, expr, expr.reach + 1, name, direction=direction, source=node)


def _local_transition(kind: str, node: dict[str, Any], path: str, name: str | None) -> Law:
    context = _symbols_field(node, "context", path, True, 3)
    becomes = _symbols_field(node, "becomes", path, False, 1)[0]
    period = _int_field(node, "period", path, 1, 64, default=1)
    cls = _int_field(node, "class", path, 0, period - 1, default=0)
    premise = [Expr("matches", pattern=context, type=BOOL, scope=CELL, path=f"{path}.context")]
    if period > 1:
        in_class = Expr("eq", (Expr("coordinate_class", value=period, scope=CELL, path=f"{path}.period"),
                               Expr("const", value=cls, path=f"{path}.class")), type=BOOL, scope=CELL, path=path)
        premise.append(in_class)
    after = Expr("at", (Expr("cell", scope=CELL, path=path),), value=1, scope=CELL, reach=1, path=path)
    conclusion = Expr("eq", (after, Expr("const", value=becomes, path=f"{path}.becomes")), type=BOOL,
                      scope=CELL, reach=1, path=path)
    expr = Expr("implies", (Expr("and", tuple(premise), type=BOOL, scope=CELL, path=path), conclusion),
                type=BOOL, scope=CELL, reach=1, path=path)
    return Law(kind, expr, 1, name, source=node)


def _symmetry(kind: str, node: dict[str, Any], path: str, name: str | None) -> Law:
    reflect = node.get("reflect", False)
    if not isinstance(reflect, bool):
        raise _fail(path, node, "field 'reflect' must be a boolean")
    mapping = node.get("permute", {})
    if not isinstance(mapping, dict) or any(k not in CODES or v not in CODES for k, v in mapping.items()):
        raise _fail(path, node, f"field 'permute' must map symbols of {SYMBOLS} to symbols, got {mapping!r}")
    permute = tuple(CODES[mapping.get(s, s)] for s in SYMBOLS)
    if len(set(permute)) != len(SYMBOLS):
        raise _fail(path, node, f"field 'permute' is not a permutation of {SYMBOLS}: {mapping!r}")
    shift = _int_field(node, "shift", path, -1024, 1024, default=0)
    if not reflect and shift == 0 and permute == (0, 1, 2, 3):
        raise _fail(path, node, "the identity is no symmetry: give 'reflect', 'permute' or 'shift'")
    return Law(kind, None, 1, name, reflect=reflect, permute=permute, shift=shift, source=node)
