"""The timestep row and its conversion, a whole batch at a time, into one Arrow table.

Row-at-a-time inserts run at ~200 rows/s here; one Arrow batch per transaction runs at hundreds of
thousands. The conversion is column-wise (one list comprehension per field, numpy for the activation
arrays) because per-row Python work is what bounds the writer.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from xdb.concepts import ConceptIndex
from xdb.schema import TOP_K

EVENT_TYPES = ("input", "output", "tool_call", "tool_result", "system", "steering")
ACTIVATION_SOURCES = (None, "hidden_state", "logit_lens")

# Column order of `timesteps`; the audit table has these plus seq, steering and the hashes.
TIMESTEP_COLUMNS = ("id", "session_id", "tick", "event_type", "role", "content", "token_id", "request_id",
                    "concept_ids", "concept_values", "activation_source", "created_at", "metadata")


@dataclass(slots=True)
class TimestepRow:
    """One timestep: a generated token (event_type "output", content = the token's text) or a
    message-level event (input, tool_call, tool_result, system). `concept_activations` holds at most
    k concept→value pairs and is empty when nothing measured them. `created_at` is epoch seconds.
    `steering` goes to the audit log only."""

    session_id: str
    tick: int
    event_type: str
    role: str | None = None
    content: str = ""
    token_id: int | None = None
    request_id: str | None = None
    concept_activations: dict[str, float] = field(default_factory=dict)
    activation_source: str | None = None
    created_at: float = field(default_factory=time.time)
    metadata: dict[str, Any] | None = None
    steering: list[dict[str, Any]] | None = None


def check_rows(rows: list[TimestepRow], k: int = TOP_K) -> None:
    """Cheap checks at submit time, so a bad row fails its caller instead of the writer thread."""
    for r in rows:
        if not isinstance(r, TimestepRow):
            raise TypeError(f"expected TimestepRow, got {type(r).__name__}")
    if rows and max(map(len, (r.concept_activations for r in rows))) > k:
        raise ValueError(f"concept_activations holds more than k={k} entries")
    bad = next((r for r in rows if not r.session_id or not isinstance(r.tick, int) or r.tick < 0
                or not r.event_type), None)
    if bad is not None:
        raise ValueError(f"bad timestep row (session_id, tick >= 0 and event_type are required): {bad!r}")


def _json_or_none(values: list[Any]) -> list[str | None]:
    return [v if v is None or isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"))
            for v in values]


def fixed_arrays(lens: np.ndarray, ids: np.ndarray, vals: np.ndarray, k: int) -> tuple[pa.Array, pa.Array]:
    """Ragged activations → two FixedSizeList(k) arrays; missing slots are NULL (never invented),
    a row without activations is a NULL array."""
    n = len(lens)
    row_null = lens == 0
    if len(ids) == n * k:  # every row full: the flat arrays are already the layout
        child_ids, child_vals = pa.array(ids), pa.array(vals)
    else:
        rows = np.repeat(np.arange(n), lens)
        cols = np.arange(len(ids)) - np.repeat(np.cumsum(lens) - lens, lens)
        grid_ids = np.zeros((n, k), dtype=np.int32)
        grid_vals = np.zeros((n, k), dtype=np.float32)
        empty = np.ones((n, k), dtype=bool)
        grid_ids[rows, cols] = ids
        grid_vals[rows, cols] = vals
        empty[rows, cols] = False
        child_ids = pa.array(grid_ids.ravel(), mask=empty.ravel())
        child_vals = pa.array(grid_vals.ravel(), mask=empty.ravel())
    mask = pa.array(row_null) if row_null.any() else None
    return (pa.FixedSizeListArray.from_arrays(child_ids, k, mask=mask),
            pa.FixedSizeListArray.from_arrays(child_vals, k, mask=mask))


def rows_to_arrow(rows: list[TimestepRow], first_id: int, concepts: ConceptIndex,
                  k: int = TOP_K) -> tuple[pa.Table, list[tuple[int, str]]]:
    """One Arrow table for a batch (timestep columns + steering); also the concepts first seen here."""
    n = len(rows)
    acts = [r.concept_activations for r in rows]
    lens = np.fromiter(map(len, acts), dtype=np.int32, count=n)
    total = int(lens.sum())
    ids, added = concepts.ids_for(list(chain.from_iterable(acts)), total)
    vals = np.fromiter(chain.from_iterable(map(dict.values, acts)), dtype=np.float32, count=total)
    concept_ids, concept_values = fixed_arrays(lens, ids, vals, k)
    created = np.fromiter((r.created_at for r in rows), dtype=np.float64, count=n)
    table = pa.table({
        "id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
        "session_id": pa.array([r.session_id for r in rows], pa.string()),
        "tick": pa.array([r.tick for r in rows], pa.int64()),
        "event_type": pa.array([r.event_type for r in rows], pa.string()),
        "role": pa.array([r.role for r in rows], pa.string()),
        "content": pa.array([r.content for r in rows], pa.string()),
        "token_id": pa.array([r.token_id for r in rows], pa.int32()),
        "request_id": pa.array([r.request_id for r in rows], pa.string()),
        "concept_ids": concept_ids,
        "concept_values": concept_values,
        "activation_source": pa.array([r.activation_source for r in rows], pa.string()),
        "created_at": pa.array((created * 1e6).astype(np.int64), pa.timestamp("us")),
        "metadata": pa.array(_json_or_none([r.metadata for r in rows]), pa.string()),
        "steering": pa.array(_json_or_none([r.steering for r in rows]), pa.string()),
    })
    return table, added
