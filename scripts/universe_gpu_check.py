"""The universe step of scripts/gpu_check.sh on a machine with torch, Triton and numpy but nothing else of
AHC's set-up (no .venv, no vLLM, no package registry): run from the checkout, it imports `universe`,
`kernels` and `bench` from there.

    python3 scripts/universe_gpu_check.py bench            # one JSON line: `ahc universe bench`'s result
    python3 scripts/universe_gpu_check.py exact CASES.TSV  # Triton against numpy, byte for byte

`exact` writes one row a case (rule, state number, length, steps, verdict) as gpu_check.sh's own
check does, over every bundled rule and random rules of periods 1 to 3, ring lengths across the tile
edges and step counts across launches (`UNIVERSE_CHECK_LENGTHS="1,5,33"` names other lengths: Triton's
CPU interpreter, where there is no GPU, takes ~0.3 s a case); it exits 1 unless every case is equal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LENGTHS = (1, 2, 3, 5, 8, 33, 255, 256, 257, 447, 448, 449, 959, 960, 961, 4099)
STEPS = (1, 31, 32, 33, 129)


def bench() -> int:
    from bench.universe import LOADS, run

    print(run(LOADS.from_env(), ["triton", "numpy"]).to_json())
    return 0


def exact(cases: Path) -> int:
    import numpy as np

    from universe.rule import bundled_rules, load_rule, random_rule
    from universe.simulate import simulate

    rng = np.random.default_rng(7)
    rules = [load_rule(name) for name in bundled_rules()] + [random_rule(p, rng) for p in (1, 2, 3)]
    cases.parent.mkdir(parents=True, exist_ok=True)
    failed = 0
    with cases.open("w") as out:
        for rule in rules:
            lengths = os.environ.get("UNIVERSE_CHECK_LENGTHS")
            for n, length in enumerate(tuple(map(int, lengths.split(","))) if lengths else LENGTHS):
                steps = STEPS[n % len(STEPS)]
                states = rng.integers(0, 4, size=(3, length), dtype=np.uint8)
                try:
                    reference = simulate(states, rule, steps, "numpy")
                    same = np.array_equal(reference, simulate(states, rule, steps, "triton"))
                    verdict = "equal" if same else "differ"
                except Exception as exc:  # a case that fails is a verdict of its own, and the others still run
                    verdict = f"error: {type(exc).__name__}: {exc}".replace("\t", " ").replace("\n", " ")
                failed += verdict != "equal"
                out.write(f"{rule.name}\t{n}\t{length}\t{steps}\t{verdict}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "bench":
        sys.exit(bench())
    if len(sys.argv) == 3 and sys.argv[1] == "exact":
        sys.exit(exact(Path(sys.argv[2])))
    sys.exit("usage: universe_gpu_check.py bench | exact CASES.TSV")
