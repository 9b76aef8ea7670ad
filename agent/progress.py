"""The live progress display on stderr: turn, experiments, table coverage, accuracy, compactions and
the cache hit ratio from the server's reports. Off when stderr is not a terminal, so piped output
and `--json` stay clean."""

from __future__ import annotations

import sys
from typing import Any

from agent.turn_metrics import TurnMetrics

SHOWN_TURNS = 12


class Progress:
    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.rows: list[TurnMetrics] = []
        self.title = ""
        self.live: Any = None

    def start(self, run_id: str, policy: str, rule: str, max_turns: int, resumed_from: int | None) -> None:
        if not self.enabled:
            return
        from rich.console import Console
        from rich.live import Live

        resumed = f", resumed after turn {resumed_from}" if resumed_from is not None else ""
        self.title = f"ahc discover {run_id}: policy {policy}, rule {rule}, at most {max_turns} turns{resumed}"
        self.live = Live(self._table(), console=Console(stderr=True), refresh_per_second=4, transient=False)
        self.live.start()

    def update(self, metrics: TurnMetrics) -> None:
        self.rows.append(metrics)
        if self.live is not None:
            self.live.update(self._table())

    def finish(self, summary: dict[str, Any]) -> None:
        if self.live is not None:
            self.live.update(self._table(caption=f"solved: {summary['solved']}, accuracy {summary['accuracy']:.4f}"))
            self.live.stop()
            self.live = None

    def _table(self, caption: str | None = None) -> Any:
        from rich.table import Table

        table = Table(title=self.title, caption=caption)
        for column in ("turn", "experiments", "coverage", "accuracy", "compactions", "cache hit", "tools"):
            table.add_column(column, justify="left" if column == "tools" else "right")
        for m in self.rows[-SHOWN_TURNS:]:
            hit = f"{m.hit_ratio:.0%}" if m.hit_ratio is not None else "-"
            table.add_row(str(m.turn), str(m.experiments), f"{m.coverage:.0%}", f"{m.accuracy:.1%}",
                          str(m.compactions), hit, ", ".join(m.tools) or "(none)")
        return table
