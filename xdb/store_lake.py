"""XDB's methods on the shared lake (`xdb.backend: ducklake`; xdb/lake/lake.py): every replica's rows, concepts,
tags and audit chains, and shipping this replica's now. `XDB` (xdb/store.py) holds these methods with the
rest of its interface. Without a lake (the duckdb backend, or opened read-only) `has_lake` is False,
`lake_status` None, and the others raise ValueError.
"""

from __future__ import annotations

from typing import Any

from xdb.audit.verify import AuditReport
from xdb.interface import service, service_after_flush
from xdb.lake.lake import Lake
from xdb.recall.recall import RecallFilters
from xdb.writer import Writer


class LakeMethods:
    """What these methods use of the XDB they are part of (set in XDB.__init__ and XDB.open)."""

    lake: Lake | None
    writer: Writer | None

    @property
    def has_lake(self) -> bool:
        """Whether this XDB ships to a shared lake (`xdb.backend: ducklake`, opened for writing)."""
        return self.lake is not None

    def _need_lake(self) -> Lake:
        if self.lake is None:
            raise ValueError("no lake: this XDB's backend is duckdb (set xdb.backend: ducklake), or it was "
                             "opened read-only")
        return self.lake

    @service
    def lake_recall(self, filters: RecallFilters | dict[str, Any] | None = None, *, owner: str,
                    **kwargs: Any) -> list[dict[str, Any]]:
        """Every replica's timesteps matching the filters (as `recall`, less after_id), each with `replica`."""
        return self._need_lake().recall(filters, owner=owner, **kwargs)

    @service
    def lake_concepts(self, query: str | None = None) -> list[dict[str, Any]]:
        return self._need_lake().concepts(query)

    @service
    def lake_tags(self, tag_type: str | None = None) -> list[dict[str, Any]]:
        return self._need_lake().tags(tag_type)

    @service_after_flush
    def lake_ship_now(self) -> dict[str, int]:
        """Commit what the writer holds, then ship everything to the lake; the rows shipped per table."""
        if self.writer is not None:
            self.writer.flush()
        return self._need_lake().ship_now()

    @service
    def lake_status(self) -> dict[str, Any] | None:
        return self.lake.status() if self.lake is not None else None

    @service_after_flush
    def verify_lake_audit(self) -> dict[str, AuditReport]:
        """Every replica's audit chain in the lake (this one's shipped up to now first)."""
        lake = self._need_lake()
        if self.writer is not None:
            self.lake_ship_now()
        return lake.verify_audit()
