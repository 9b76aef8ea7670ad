"""What bringing a prefix back from vLLM's CPU tier costs, in seconds per byte, as its offloading
connector measured its loads: the price session-aware admission puts on a miss the tier can serve.

The connector reports each step's load bytes and seconds in the scheduler's stats
(`SchedulerStats.kv_connector_stats`, the counters vLLM exports as `vllm:kv_offload_load_bytes` and
`vllm:kv_offload_load_time`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOAD_BYTES = "vllm:kv_offload_load_bytes"
LOAD_TIME = "vllm:kv_offload_load_time"
WEIGHT = 0.2  # of the newest measurement in the running estimate


@dataclass
class HostLoadCost:
    s_per_byte: float | None = None  # None until a load was measured

    def observe(self, connector_stats: dict[str, Any] | None) -> None:
        """One step's connector stats payload (OffloadingConnectorStats.to_dict(); None or another
        connector's: nothing to learn)."""
        values = (connector_stats or {}).get("data")
        if not isinstance(values, dict):
            return
        loaded = sum(values.get(LOAD_BYTES, {}).values())
        seconds = sum(values.get(LOAD_TIME, {}).values())
        if loaded <= 0 or seconds <= 0:
            return
        rate = seconds / loaded
        self.s_per_byte = rate if self.s_per_byte is None else WEIGHT * rate + (1 - WEIGHT) * self.s_per_byte

    def s_per_block(self, bytes_per_block: int) -> float | None:
        return None if self.s_per_byte is None or bytes_per_block <= 0 else self.s_per_byte * bytes_per_block
