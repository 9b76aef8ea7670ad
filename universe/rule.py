"""A rule: `period` coordinate classes, each a 64-entry table from window to next symbol.

File form: `{"name": str, "period": int, "table": [str, ...]}` with `period` strings of 64
symbols; `table[c][16*left + 4*centre + right]` is the next symbol of a cell `i` with `i mod period == c`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import numpy as np

from universe.symbols import CODES, SYMBOLS, WINDOWS

DEFAULT_RULE = "kinetic"


def bundled_dir() -> Traversable:
    """The rules shipped with the package (a checkout shows them as configs/universes/)."""
    return resources.files("universe").joinpath("rules")
@dataclass(frozen=True)
class Rule:
    name: str
    period: int
    table: tuple[str, ...]
    # [period, 64] uint8, derived once: every backend indexes this instead of the strings.
    lut: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a rule needs a non-empty string name")
        if isinstance(self.period, bool) or not isinstance(self.period, int) or self.period < 1:
            raise ValueError(f"rule period must be a positive integer, got {self.period!r}")
        table = tuple(self.table) if isinstance(self.table, (list, tuple)) else None
        if table is None or len(table) != self.period:
            raise ValueError(f"rule table must be a list of {self.period} strings (one per class), "
                             f"got {self.table!r:.80}")
        for c, row in enumerate(table):
            if not isinstance(row, str) or len(row) != WINDOWS:
                size = len(row) if isinstance(row, str) else type(row).__name__
                raise ValueError(f"rule table[{c}] must be a string of {WINDOWS} symbols, got {size}")
            bad = next((j for j, ch in enumerate(row) if ch not in CODES), None)
            if bad is not None:
                raise ValueError(f"rule table[{c}][{bad}] is {row[bad]!r}, outside {SYMBOLS}")
        lut = np.array([[CODES[ch] for ch in row] for row in table], dtype=np.uint8)
        lut.flags.writeable = False
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "lut", lut)

    @classmethod
    def from_lut(cls, name: str, lut: np.ndarray) -> Rule:
        lut = np.asarray(lut)
        if lut.ndim != 2 or lut.shape[1] != WINDOWS:
            raise ValueError(f"a rule lut must have shape [period, {WINDOWS}], got {lut.shape}")
        return cls(name, lut.shape[0], tuple("".join(SYMBOLS[int(v)] for v in row) for row in lut))

    @classmethod
    def from_dict(cls, data: Any) -> Rule:
        if not isinstance(data, dict):
            raise ValueError(f"a rule must be a JSON object, got {type(data).__name__}")
        missing = {"name", "period", "table"} - data.keys()
        if missing:
            raise ValueError(f"rule is missing {', '.join(sorted(missing))}")
        return cls(data["name"], data["period"], data["table"])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "period": self.period, "table": list(self.table)}

    def next_symbol(self, window: int, cls: int) -> int:
        return int(self.lut[cls % self.period, window])


def bundled_rules() -> list[str]:
    """Names of the rules shipped with the package."""
    return sorted(entry.name.removesuffix(".json") for entry in bundled_dir().iterdir() if entry.name.endswith(".json"))


def load_rule(path_or_name: str | Path | Rule | dict[str, Any] = DEFAULT_RULE) -> Rule:
    """A rule file's path, the name of a bundled rule (e.g. 'kinetic'), or a rule's JSON as a dict."""
    if isinstance(path_or_name, Rule):
        return path_or_name
    if isinstance(path_or_name, dict):
        return Rule.from_dict(path_or_name)
    if not isinstance(path_or_name, (str, Path)):
        raise ValueError(f"a rule is a file path, a bundled name or a dict, got {type(path_or_name).__name__}")
    path: Path | Traversable = Path(path_or_name)
    if not path.is_file():
        bundled = bundled_dir().joinpath(f"{path_or_name}.json")
        if "/" in str(path_or_name) or str(path_or_name).endswith(".json") or not bundled.is_file():
            raise ValueError(f"no rule file or bundled rule named {str(path_or_name)!r} "
                             f"(bundled: {', '.join(bundled_rules())})")
        path = bundled
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"rule file {path} is not valid JSON: {exc}") from None
    return Rule.from_dict(data)


def random_rule(period: int, rng: np.random.Generator, name: str | None = None) -> Rule:
    """A uniformly random table, for tests and benchmarks."""
    lut = rng.integers(0, len(SYMBOLS), size=(period, WINDOWS), dtype=np.uint8)
    return Rule.from_lut(name or f"random-p{period}", lut)
