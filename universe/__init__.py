"""universe — the discovery agent's world: a ring of cells over `_ABK`, a radius-1 rule with
`period` coordinate classes, simulators (numpy reference, numba CPU, Triton GPU), the law language
and the harness tools the agent experiments through."""

from universe.harness import Harness
from universe.instruments import coordinate_class, neighbor_config, transition_indicator, windows
from universe.laws import evaluate_laws
from universe.rule import DEFAULT_RULE, Rule, bundled_rules, load_rule, random_rule
from universe.simulate import BACKENDS, simulate
from universe.symbols import SYMBOLS, decode, encode
from universe.tools import TOOLS

__all__ = [
    "SYMBOLS", "encode", "decode", "Rule", "load_rule", "bundled_rules", "random_rule", "DEFAULT_RULE",
    "simulate", "BACKENDS", "neighbor_config", "coordinate_class", "transition_indicator", "windows",
    "evaluate_laws", "Harness", "TOOLS",
]
