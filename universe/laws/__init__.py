"""The law language: a JSON AST for candidate laws (ast.py, json_schema.py) and a batched judge (evaluate.py)."""

from universe.laws.ast import Expr, Law, LawError, parse_law
from universe.laws.evaluate import evaluate_laws
from universe.laws.json_schema import LAW_SCHEMA

__all__ = ["LAW_SCHEMA", "Expr", "Law", "LawError", "parse_law", "evaluate_laws"]
