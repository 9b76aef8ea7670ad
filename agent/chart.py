"""The end-of-run chart: values in [0, 1] (coverage, accuracy, cache hit ratio) over turns, as a PNG.

matplotlib's object API on its Agg canvas (no pyplot, so no global figure state and no display): bars
first, lines with markers over them, a percent axis, the turn numbers thinned to about a dozen labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

Color = tuple[int, int, int]  # 0-255 per channel
MAX_TURN_LABELS = 12


def _rgb(color: Color) -> tuple[float, float, float]:
    return color[0] / 255, color[1] / 255, color[2] / 255


def chart(path: Path, turns: list[int], lines: Mapping[str, tuple[Sequence[float], Color]],
          bars: Mapping[str, tuple[Sequence[float | None], Color]], width: int = 760, height: int = 420) -> None:
    """Values in [0, 1] against turn numbers, `width` x `height` pixels; a missing bar value is no bar."""
    fig = Figure(figsize=(width / 100, height / 100), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(turns))
    bar_width = 0.8 / max(len(bars), 1)
    for b, (name, (values, color)) in enumerate(bars.items()):
        heights = np.array([np.nan if v is None else v for v in values], dtype=float)
        ax.bar(x - 0.4 + bar_width * (b + 0.5), heights, bar_width, color=_rgb(color), alpha=0.7, label=name)
    for k, (name, (values, color)) in enumerate(lines.items()):
        # Earlier lines are drawn wider, so a later one running on top leaves them visible.
        wide = len(lines) - 1 - k
        ax.plot(x, np.asarray(values, dtype=float), color=_rgb(color), linewidth=1.5 + 2 * wide, marker="o",
                markersize=4 + 2 * wide, label=name)
    every = max(1, -(-len(turns) // MAX_TURN_LABELS))
    ax.set_xticks(x[::every], [str(t) for t in turns[::every]])
    ax.set_xlim(-0.6, max(len(turns), 1) - 0.4)
    ax.set_ylim(0.0, 1.0)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(axis="y", color="0.88")
    ax.set_xlabel("turn")
    ax.legend(loc="upper left", ncols=len(lines) + len(bars), frameon=False, bbox_to_anchor=(0, 1.12))
    fig.savefig(path, format="png")
