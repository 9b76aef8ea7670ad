"""numpy, numba and Triton (in its CPU interpreter) give identical trajectories on every rule, period
and ring length; bad input is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import universe
from universe import load_rule, random_rule, simulate
from universe.device import gpu_available
from universe.simulate import resolve_backend

LENGTHS = (1, 2, 3, 4, 5, 7, 8, 9, 31, 63, 64, 65, 127, 128, 129, 200)


@pytest.mark.parametrize("period", [1, 2, 3, 5])
def test_numba_matches_numpy_on_random_rules(period: int) -> None:
    rng = np.random.default_rng(period)
    for length in LENGTHS:
        rule = random_rule(period, rng)
        grids = int(rng.choice([1, 3, 17, 130]))
        states = rng.integers(0, 4, size=(grids, length), dtype=np.uint8)
        for steps in (0, 1, 6):
            expected = simulate(states, rule, steps, backend="numpy")
            got = simulate(states, rule, steps, backend="numba")
            assert got.shape == (steps + 1, grids, length) and got.dtype == np.uint8
            assert np.array_equal(got, expected), (period, length, steps)


def test_numba_matches_numpy_on_bundled_rules() -> None:
    states = np.random.default_rng(0).integers(0, 4, size=(40, 97), dtype=np.uint8)
    for name in universe.bundled_rules():
        assert np.array_equal(simulate(states, name, 20, "numba"), simulate(states, name, 20, "numpy")), name


@pytest.mark.parametrize("period", [1, 2, 3])
def test_triton_kernel_in_the_interpreter_matches_numpy(period: int) -> None:
    rng = np.random.default_rng(10 + period)
    rule = random_rule(period, rng)
    for length in (1, 2, 3, 5, 8, 33, 70):
        states = rng.integers(0, 4, size=(2, length), dtype=np.uint8)
        for steps in (0, 3):
            assert np.array_equal(simulate(states, rule, steps, "triton"),
                                  simulate(states, rule, steps, "numpy")), (length, steps)


def test_triton_runs_several_launches() -> None:
    # 40 steps > the 32 steps one launch advances: the second launch starts from the first's last row.
    rng = np.random.default_rng(5)
    rule = random_rule(3, rng)
    states = rng.integers(0, 4, size=(2, 21), dtype=np.uint8)
    assert np.array_equal(simulate(states, rule, 40, "triton"), simulate(states, rule, 40, "numpy"))


@pytest.mark.process
def test_triton_under_the_interpret_env_var() -> None:
    # The kernel as written for the GPU, run on CPU tensors with TRITON_INTERPRET=1 set before import.
    script = textwrap.dedent("""
        import numpy as np, torch
        from triton.runtime.interpreter import InterpretedFunction
        from kernels.universe_step import universe_steps
        from universe import random_rule, simulate
        assert isinstance(universe_steps, InterpretedFunction)
        rng = np.random.default_rng(0)
        rule = random_rule(2, rng)
        states = rng.integers(0, 4, size=(3, 11), dtype=np.uint8)
        expected = simulate(states, rule, 5, "numpy")
        out = torch.empty((6, 3, 11), dtype=torch.uint8)
        out[0] = torch.from_numpy(states)
        universe_steps[(3, 1)](out[0], out[0], torch.from_numpy(rule.lut.copy()), 11, 2, 11, 5, 33,
                               BLOCK=64, HALO=5)
        assert np.array_equal(out.numpy(), expected)
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_auto_picks_triton_on_a_gpu_else_numba() -> None:
    assert resolve_backend("auto") == ("triton" if gpu_available() else "numba")
    rule = load_rule("turnstile3")
    assert np.array_equal(simulate("A_B_KK_A", rule, 4), simulate("A_B_KK_A", rule, 4, "numpy"))


def test_one_string_gives_one_grid_and_row_zero_is_the_input() -> None:
    trajectory = simulate("A__B", "kinetic", 3)
    assert trajectory.shape == (4, 1, 4) and trajectory.dtype == np.uint8
    assert universe.decode(trajectory[0, 0]) == "A__B"
    assert simulate(["A_", "_B"], "kinetic", 1, "numpy").shape == (2, 2, 2)


@pytest.mark.parametrize("states, steps, backend, words", [
    ("A_X", 1, "numpy", "'X' at cell 2"),
    ("", 1, "numpy", "empty grid"),
    (np.zeros((2, 0), np.uint8), 1, "numba", "empty grid"),
    (np.array([[0, 4]], np.uint8), 1, "numba", "code 4"),
    (np.array([[0, -1]]), 1, "numba", "code -1"),
    (np.zeros((2, 2, 2), np.uint8), 1, "numpy", "shape"),
    (["A_", "A"], 1, "numpy", "same length"),
    ("A_B", -1, "numpy", "steps must be >= 0"),
    ("A_B", 1.5, "numpy", "steps must be an integer"),
    ("A_B", 1, "cuda", "unknown backend 'cuda'"),
])
def test_bad_input_raises_value_error_naming_it(states, steps, backend: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        simulate(states, "kinetic", steps, backend)


def test_input_is_not_modified_and_not_aliased() -> None:
    states = np.array([[1, 0, 2, 0]], dtype=np.uint8)
    for backend in ("numpy", "numba"):
        trajectory = simulate(states, "kinetic", 2, backend)
        trajectory[0, 0, 0] = 3
        assert states[0, 0] == 1
