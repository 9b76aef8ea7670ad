"""Factories that make no formatter: one raises, one returns something else."""

from __future__ import annotations


def raising() -> object:
    raise RuntimeError("the formatter's template is missing")


def not_a_formatter() -> object:
    return {"name": "not_a_formatter"}
