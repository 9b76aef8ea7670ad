"""bench/load.py, the one way every bench's load is chosen: a preset by name, fields changed as text read
as their types, and a bad name, field or value refused naming the environment variable."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bench.load import DEFAULT, SMOKE, Loads, env_name
from bench.registry import BENCHES


@dataclass(frozen=True)
class Shape:
    count: int = 8
    share: float = 0.5
    name: str = "big"
    on: bool = False
    cap: int | None = None
    streams: tuple[int, ...] = (1, 2)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("count must be at least 1")


LOADS = Loads("long-thing", {DEFAULT: Shape(), SMOKE: Shape(count=1, name="small"), "wide": Shape(count=64)})


def test_the_variable_is_named_for_the_bench() -> None:
    assert LOADS.env == env_name("long-thing") == "BENCH_LONG_THING_LOAD"
    assert env_name("agents") == "BENCH_AGENTS_LOAD"


def test_a_preset_fields_or_both() -> None:
    assert LOADS.parse(None) == LOADS.parse("") == Shape()
    assert LOADS.parse("smoke") == Shape(count=1, name="small")
    assert LOADS.parse("count=3, share=0.25,on=true,cap=7,streams=64+128") == \
        Shape(count=3, share=0.25, on=True, cap=7, streams=(64, 128))
    assert LOADS.parse("smoke,name=x") == Shape(count=1, name="x")
    assert LOADS.parse("cap=none,on=0") == Shape()
    assert LOADS.parse("share=2", preset="wide") == Shape(count=64, share=2.0)
    assert LOADS.from_env(environ={"BENCH_LONG_THING_LOAD": "wide"}) == Shape(count=64)


@pytest.mark.parametrize(("spec", "preset", "error"), [
    ("huge", None, "unknown load 'huge'; choose from default, smoke, wide"),
    ("counts=3", None, "unknown field 'counts'; choose from count, share"),
    ("count=0.5", None, "count: '0.5' is not a int"),
    ("on=maybe", None, "on: 'maybe' is not a bool"),
    ("count=0", None, "count must be at least 1"),
    ("smoke", "wide", "names the load 'smoke', the command line chose 'wide'"),
    ("count=3,smoke", None, "'smoke' is not FIELD=VALUE"),
])
def test_a_bad_load_is_refused_naming_the_variable(spec: str, preset: str | None, error: str) -> None:
    with pytest.raises(ValueError, match=f"^BENCH_LONG_THING_LOAD: .*{error}"):
        LOADS.parse(spec, preset)


def test_a_bench_without_a_smoke_load_is_refused() -> None:
    with pytest.raises(ValueError, match="no preset smoke"):
        Loads("x", {DEFAULT: Shape()})


@pytest.mark.parametrize("name", list(BENCHES))
def test_every_bench_has_its_loads_under_its_own_variable(name: str) -> None:
    loads = BENCHES[name].loads()
    assert loads.bench == name and loads.env == env_name(name)
    assert loads.parse(SMOKE) == loads.presets[SMOKE] != loads.parse(None)
