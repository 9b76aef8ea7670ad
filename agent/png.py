"""A small line chart written as PNG with numpy and zlib alone (matplotlib is not a dependency).

`chart(series, bars, ...)` draws values in [0, 1] over turns: lines with markers for some series,
thin bars for others, grid lines, axis labels and a legend in a 3x5 pixel font.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

Color = tuple[int, int, int]
WHITE, GREY, DARK = (255, 255, 255), (225, 225, 225), (60, 60, 60)

_FONT = {
    "0": "###|#.#|#.#|#.#|###", "1": ".#.|##.|.#.|.#.|###", "2": "###|..#|###|#..|###", "3": "###|..#|###|..#|###",
    "4": "#.#|#.#|###|..#|..#", "5": "###|#..|###|..#|###", "6": "###|#..|###|#.#|###", "7": "###|..#|..#|..#|..#",
    "8": "###|#.#|###|#.#|###", "9": "###|#.#|###|..#|###", ".": "...|...|...|...|.#.", "%": "#.#|..#|.#.|#..|#.#",
    "A": ".#.|#.#|###|#.#|#.#", "C": "###|#..|#..|#..|###", "D": "##.|#.#|#.#|#.#|##.", "E": "###|#..|##.|#..|###",
    "G": "###|#..|#.#|#.#|###", "H": "#.#|#.#|###|#.#|#.#", "I": "###|.#.|.#.|.#.|###", "K": "#.#|#.#|##.|#.#|#.#",
    "L": "#..|#..|#..|#..|###", "M": "#.#|###|###|#.#|#.#", "N": "##.|#.#|#.#|#.#|#.#", "O": "###|#.#|#.#|#.#|###",
    "P": "###|#.#|###|#..|#..", "R": "##.|#.#|##.|#.#|#.#", "S": "###|#..|###|..#|###", "T": "###|.#.|.#.|.#.|.#.",
    "U": "#.#|#.#|#.#|#.#|###", "V": "#.#|#.#|#.#|#.#|.#.", "Y": "#.#|#.#|.#.|.#.|.#.", " ": "...|...|...|...|...",
}


def write_png(path: Path, pixels: np.ndarray) -> None:
    """`uint8 [height, width, 3]` -> an RGB PNG file."""
    height, width, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # filter type 0 per scanline

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
                           + chunk(b"IEND", b""))


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.pixels = np.full((height, width, 3), WHITE, dtype=np.uint8)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        h, w, _ = self.pixels.shape
        x0, x1 = sorted((max(0, min(w, x0)), max(0, min(w, x1))))
        y0, y1 = sorted((max(0, min(h, y0)), max(0, min(h, y1))))
        self.pixels[y0:y1, x0:x1] = color

    def line(self, x0: float, y0: float, x1: float, y1: float, color: Color, width: int = 2) -> None:
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for t in np.linspace(0.0, 1.0, steps + 1):
            x, y = round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t)
            self.rect(x - width // 2, y - width // 2, x - width // 2 + width, y - width // 2 + width, color)

    def text(self, x: int, y: int, text: str, color: Color = DARK, scale: int = 2) -> None:
        for k, ch in enumerate(text.upper()):
            rows = _FONT.get(ch, _FONT[" "]).split("|")
            for r, row in enumerate(rows):
                for c, on in enumerate(row):
                    if on == "#":
                        px, py = x + (4 * k + c) * scale, y + r * scale
                        self.rect(px, py, px + scale, py + scale, color)


def chart(path: Path, turns: list[int], lines: dict[str, tuple[list[float], Color]],
          bars: dict[str, tuple[list[float | None], Color]], width: int = 760, height: int = 420) -> None:
    """Values in [0, 1] against turn numbers; `bars` are drawn first, `lines` over them."""
    canvas = Canvas(width, height)
    left, right, top, bottom = 60, width - 20, 50, height - 50
    n = max(len(turns), 1)

    def x_of(k: int) -> float:
        return left + (right - left) * (k + 0.5) / n

    def y_of(v: float) -> float:
        return bottom - (bottom - top) * min(max(v, 0.0), 1.0)

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        canvas.rect(left, int(y_of(tick)), right, int(y_of(tick)) + 1, GREY)
        canvas.text(8, int(y_of(tick)) - 5, f"{int(tick * 100)}%")
    canvas.rect(left, top, left + 1, bottom, DARK)
    canvas.rect(left, bottom, right, bottom + 1, DARK)
    bar_width = max(2, int((right - left) / n / (2 * max(len(bars), 1))))
    for b, (values, color) in enumerate(bars.values()):
        for k, v in enumerate(values):
            if v is not None:
                x = int(x_of(k)) - bar_width * len(bars) // 2 + b * bar_width
                canvas.rect(x, int(y_of(v)), x + bar_width, bottom, color)
    for k, (values, color) in enumerate(lines.values()):
        # Earlier lines are drawn wider, so a later one running on top leaves them visible.
        width, mark = 2 + 3 * (len(lines) - 1 - k), 3 + 2 * (len(lines) - 1 - k)
        points = [(x_of(i), y_of(v)) for i, v in enumerate(values)]
        for (xa, ya), (xb, yb) in zip(points, points[1:]):
            canvas.line(xa, ya, xb, yb, color, width)
        for x, y in points:
            canvas.rect(int(x) - mark, int(y) - mark, int(x) + mark + 1, int(y) + mark + 1, color)
    every = max(1, n // 12)
    for k, turn in enumerate(turns):
        if k % every == 0 or k == n - 1:
            label = str(turn)
            canvas.text(int(x_of(k)) - 4 * len(label), bottom + 10, label)
    canvas.text(right - 4 * 2 * 4, bottom + 30, "TURN")
    x = left
    for name, (_, color) in [*lines.items(), *bars.items()]:
        canvas.rect(x, 18, x + 14, 30, color)
        canvas.text(x + 20, 19, name)
        x += 20 + 8 * len(name) + 30
    write_png(path, canvas.pixels)
