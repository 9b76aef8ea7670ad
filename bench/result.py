"""What every benchmark returns: our figures and the reference's, measured in the same run, and the
ratios between them (machines are noisy; the ratio is the figure that travels)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class BenchResult:
    bench: str
    figures: dict[str, float | int]
    ratios: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def save(self, results_dir: Path) -> Path:
        results_dir.mkdir(parents=True, exist_ok=True)
        path = results_dir / f"{self.bench}.json"
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path
