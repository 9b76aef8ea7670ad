"""What the writer takes — TimestepRow lists, or TokenBatch columns — and their conversion, a whole
batch at a time, into one Arrow table.

Row-at-a-time inserts run at ~200 rows/s here; one Arrow batch per transaction runs at hundreds of
thousands. The conversion is column-wise (one list comprehension per field, numpy for the activation
arrays) because per-row Python work is what bounds the writer. A TokenBatch skips even that: a
reply's generated tokens arrive as arrays and become Arrow columns without a Python object a token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from core.errors import InvalidRequest
from xdb.concepts import ConceptIndex
from xdb.schema import TOP_K

# The writer's column of a token's hidden activations (lens.hidden): the audit log's alone (xdb/audit/hidden.py).
HIDDEN_COLUMN = "hidden_activations"

# How many of a reply's ids before a TokenBatch it carries to decode its texts after: a character is at
# most four byte tokens, and the decoder comes in step with the reply once one completes among them.
DECODE_CONTEXT = 8
# Column order of `timesteps`; the audit table has these plus seq, steering and the hashes.
TIMESTEP_COLUMNS = ("id", "session_id", "tick", "event_type", "role", "content", "token_id", "request_id",
                    "concept_ids", "concept_values", "activation_source", "created_at", "metadata")


@dataclass(slots=True)
class TimestepRow:
    """One timestep: a generated token (event_type "output", content = the token's text) or a
    message-level event (input, tool_call, tool_result, system). `concept_activations` holds at most
    k concept→value pairs and is empty when nothing measured them; `activation_source` says what
    measured them: "hidden_state", "logit_lens", or "emulated" (drawn by the emulated engine).
    `created_at` is epoch seconds. `steering` goes to the audit log only."""

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


def utf8(text: str) -> str:
    """`text` as UTF-8 can store it: a lone surrogate (half an emoji, cut off, escaped in JSON as
    `\\ud83d`) becomes U+FFFD. Such a row once killed the writer, and every restart resent it first."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def encoded(text: str | None, field: str) -> bytes:
    """`text` as UTF-8; a client's text that UTF-8 cannot hold (a lone surrogate) is a 400 naming its field."""
    if text is None:
        return b""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{field}: not valid Unicode text (a lone surrogate at character {exc.start})",
                             param=field) from None


def _utf8_json(value: Any) -> Any:
    if isinstance(value, str):
        return utf8(value)
    if isinstance(value, dict):
        return {utf8(str(k)): _utf8_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8_json(v) for v in value]
    return value


def storable(part: list[TimestepRow] | TokenBatch) -> list[TimestepRow] | TokenBatch:
    """The part with every text UTF-8 can store (the writer's check where it accepts rows). Texts the
    writer decodes from token ids are UTF-8 already."""
    if isinstance(part, TokenBatch):
        joined = "".join(part.contents or ())
        if not joined.isascii() and utf8(joined) is not joined:
            part.contents = [utf8(text) for text in part.contents or ()]
        part.session_id = utf8(part.session_id)
        part.request_id = part.request_id and utf8(part.request_id)
        return part
    for row in part:
        row.content = utf8(row.content)
        row.session_id = utf8(row.session_id)
        row.request_id = row.request_id and utf8(row.request_id)
        if row.metadata is not None:
            row.metadata = _utf8_json(row.metadata)
    return part


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


def _json(value: Any) -> str | None:
    return _json_or_none([value])[0]


def _ticks_ok(ticks: Sequence[int] | np.ndarray, n: int) -> bool:
    """n ticks, integers >= 0; a range (what XDB.next_ticks hands out) is checked without a scan."""
    if isinstance(ticks, range):
        return len(ticks) == n and (n == 0 or (ticks.step > 0 and ticks.start >= 0))
    array = np.asarray(ticks)
    return bool(array.shape == (n,) and (not n or (array.dtype.kind in "iu" and array.min() >= 0)))


def _check_index(index: np.ndarray, names: int) -> None:
    """Each slot -1 or a concept, no concept twice in a row. A few rows (a decoding step's) in plain
    Python, where numpy's per-call cost would dominate; more rows vectorised."""
    if index.shape[0] <= 8:
        for row in index.tolist():
            if any(i < -1 or i >= names for i in row):
                raise ValueError("TokenBatch concept_index must be -1 or an index into concept_names")
            used = [i for i in row if i != -1]
            if len(set(used)) != len(used):
                raise ValueError("a TokenBatch row names the same concept twice")
        return
    if index.min() < -1 or index.max() >= names:
        raise ValueError("TokenBatch concept_index must be -1 or an index into concept_names")
    ordered = np.sort(index, axis=1)
    if ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any():
        raise ValueError("a TokenBatch row names the same concept twice")


@lru_cache(maxsize=16)
def _check_names(names: tuple[str, ...]) -> None:
    """A lens pack's concept names: checked once per distinct tuple (the pack's are the same every step)."""
    if any(not isinstance(c, str) or not c for c in names):
        raise ValueError("concept names must be non-empty strings")
    if len(set(names)) != len(names):
        raise ValueError("TokenBatch concept_names must be distinct")


@dataclass(slots=True)
class TokenBatch:
    """n generated tokens of one session, column-wise: the fast path for the server's token recorder
    (no TimestepRow a token). Every row shares session_id, request_id, event_type, role,
    activation_source, metadata and steering; the rest are per row.

    Activations: `concept_index` [n, k'] (k' <= k) indexes `concept_names`, -1 marks an empty slot;
    `concept_values` [n, k'] holds the values. None means no activations were measured. A row whose
    slots are all empty is stored like a TimestepRow with no activations.

    Or the writer joins them (xdb/activation_join.py): `activation_key` names the engine request whose
    output tokens these are, from output position `first_position` on, and the writer fills in the
    activations the engine sent for them, waiting for late ones until `join_by` (monotonic seconds; set
    by the writer that accepts the batch).

    Texts: `contents`, stored as given; or None, and the writer decodes them from `token_ids` with the
    tokenizer it was given (XDB.decode_tokens_with, xdb/token_decoder.py), after `context_ids`: the
    reply's last ids before this batch (up to DECODE_CONTEXT), so that the batch decodes on its own."""

    session_id: str
    ticks: Sequence[int] | np.ndarray           # n ticks, e.g. xdb.next_ticks(session_id, n)
    contents: Sequence[str] | None              # each token's text; None: decoded from token_ids
    token_ids: Sequence[int] | np.ndarray | None = None
    request_id: str | None = None
    event_type: str = "output"
    role: str | None = "assistant"
    concept_names: Sequence[str] = ()
    concept_index: np.ndarray | None = None
    concept_values: np.ndarray | None = None
    activation_source: str | None = None
    created_at: float | np.ndarray | None = None  # epoch seconds: one for all rows, or n; default now
    metadata: dict[str, Any] | None = None
    steering: list[dict[str, Any]] | None = None
    activation_key: str | None = None
    first_position: int = 0
    join_by: float | None = None
    context_ids: Sequence[int] = ()
    hidden_names: Sequence[str] = ()  # the pack's hidden concepts (lens.hidden): for the audit log alone
    hidden_index: np.ndarray | None = None  # [n, k'] indexes hidden_names, -1 marks an empty slot
    hidden_values: np.ndarray | None = None

    def __len__(self) -> int:
        rows = self.contents if self.contents is not None else self.token_ids
        return 0 if rows is None else len(rows)

    def check(self, k: int = TOP_K) -> None:
        """Shapes and values, at submit time, so a bad batch fails its caller, not the writer. Runs on
        the event loop once per recorded step, so the common shapes (a range of ticks, a one-row
        batch, the pack's same names each time) take the cheap paths."""
        if self.contents is None and self.token_ids is None:
            raise ValueError("TokenBatch needs contents, or token_ids to decode them from")
        n = len(self)
        if not self.session_id or not self.event_type:
            raise ValueError("TokenBatch needs a session_id and an event_type")
        if not _ticks_ok(self.ticks, n):
            raise ValueError(f"TokenBatch ticks must be {n} integers >= 0")
        if self.token_ids is not None and len(self.token_ids) != n:
            raise ValueError(f"TokenBatch token_ids must hold {n} values")
        if self.created_at is not None and np.ndim(self.created_at) and np.shape(self.created_at) != (n,):
            raise ValueError(f"TokenBatch created_at must be one value or {n}")
        if (self.concept_index is None) != (self.concept_values is None):
            raise ValueError("TokenBatch concept_index and concept_values come together")
        if self.activation_key is not None:
            if self.concept_index is not None:
                raise ValueError("TokenBatch: activations are given or joined by activation_key, not both")
            if self.first_position < 0:
                raise ValueError("TokenBatch first_position must be >= 0")
            _check_names(tuple(self.concept_names))
        if self.hidden_index is not None or self.hidden_values is not None:
            self._check_hidden(n, k)
        if self.concept_index is None:
            return
        index, values = np.asarray(self.concept_index), np.asarray(self.concept_values)
        if index.ndim != 2 or index.shape[0] != n or values.shape != index.shape or index.dtype.kind not in "iu":
            raise ValueError(f"TokenBatch concept_index and concept_values must both be [{n}, k'] (integer index)")
        if index.shape[1] > k:
            raise ValueError(f"TokenBatch holds {index.shape[1]} activation slots, more than k={k}")
        _check_names(tuple(self.concept_names))
        if index.size:
            _check_index(index, len(self.concept_names))

    def _check_hidden(self, n: int, k: int) -> None:
        index, values = np.asarray(self.hidden_index), np.asarray(self.hidden_values)
        if self.hidden_index is None or self.hidden_values is None or index.ndim != 2 or index.shape[0] != n \
                or values.shape != index.shape or index.dtype.kind not in "iu" or index.shape[1] > k:
            raise ValueError(f"TokenBatch hidden_index and hidden_values come together, both [{n}, k'] (k' <= {k})")
        _check_names(tuple(self.hidden_names))
        if set(self.hidden_names) & set(self.concept_names):
            raise ValueError("a concept is either hidden or not: hidden_names and concept_names overlap")
        if index.size:
            _check_index(index, len(self.hidden_names))

    def slice(self, start: int, stop: int) -> TokenBatch:
        """Rows [start, stop) as a TokenBatch of their own (the writer splits at batch boundaries)."""
        def cut(value: Any) -> Any:
            return value if value is None or (isinstance(value, (int, float)) or np.ndim(value) == 0) \
                else value[start:stop]
        contents = None if self.contents is None else self.contents[start:stop]
        return TokenBatch(self.session_id, self.ticks[start:stop], contents,
                          cut(self.token_ids), self.request_id, self.event_type, self.role, self.concept_names,
                          cut(self.concept_index), cut(self.concept_values), self.activation_source,
                          cut(self.created_at), self.metadata, self.steering, self.activation_key,
                          self.first_position + start, self.join_by, self._context_at(start), self.hidden_names,
                          cut(self.hidden_index), cut(self.hidden_values))

    def _context_at(self, start: int) -> Sequence[int]:
        """The ids before row `start` that its texts decode after (none needed once texts are given)."""
        if self.contents is not None or self.token_ids is None or not start:
            return self.context_ids
        before = self.token_ids[max(start - DECODE_CONTEXT, 0):start]
        return [*self.context_ids, *np.asarray(before).tolist()][-DECODE_CONTEXT:]


def batch_to_arrow(batch: TokenBatch, first_id: int, concepts: ConceptIndex,
                   k: int = TOP_K) -> tuple[pa.Table, list[tuple[int, str]]]:
    """A TokenBatch as the same Arrow table rows_to_arrow makes (plus the concepts first seen)."""
    return batches_to_arrow([batch], first_id, concepts, k)


def _concept_columns(batches: list[TokenBatch], sizes: list[int], concepts: ConceptIndex,
                     k: int) -> tuple[pa.Array, pa.Array, list[tuple[int, str]]]:
    """The `concept_ids` and `concept_values` columns of the batches' rows (null where a row has no
    activations), and the concepts first seen."""
    n = sum(sizes)
    added: list[tuple[int, str]] = []
    ids = np.zeros((n, k), dtype=np.int32)
    vals = np.zeros((n, k), dtype=np.float32)
    empty = np.ones((n, k), dtype=bool)
    # The batches with activations, by concept-name list (a pack's is the same object every step),
    # each group's rows mapped to concept ids in one vectorised pass.
    groups: dict[int, tuple[Sequence[str], list[int], list[np.ndarray], list[np.ndarray]]] = {}
    starts = np.cumsum([0, *sizes])
    for i, batch in enumerate(batches):
        if batch.concept_index is not None and sizes[i]:
            group = groups.setdefault(id(batch.concept_names), (batch.concept_names, [], [], []))
            group[1].append(i)
            group[2].append(np.asarray(batch.concept_index))
            group[3].append(np.asarray(batch.concept_values, dtype=np.float32))
    for names, members, indexes, values in groups.values():
        lookup, new = concepts.ids_for(list(names), len(names))
        added += new
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in members])
        width = max(x.shape[1] for x in indexes)
        index = np.concatenate([_pad(x, width, -1) for x in indexes]).astype(np.int64)
        value = np.concatenate([_pad(x, width, 0) for x in values])
        present = index >= 0
        ids[rows, :width] = np.where(present, lookup[np.where(present, index, 0)] if len(lookup) else 0, 0)
        vals[rows, :width] = np.where(present, value, 0)
        empty[rows, :width] = ~present
    row_null = empty.all(axis=1)
    if row_null.all():
        return pa.nulls(n, pa.list_(pa.int32(), k)), pa.nulls(n, pa.list_(pa.float32(), k)), added
    mask = pa.array(row_null) if row_null.any() else None
    return (pa.FixedSizeListArray.from_arrays(pa.array(ids.ravel(), mask=empty.ravel()), k, mask=mask),
            pa.FixedSizeListArray.from_arrays(pa.array(vals.ravel(), mask=empty.ravel()), k, mask=mask), added)


def batches_to_arrow(batches: list[TokenBatch], first_id: int, concepts: ConceptIndex,
                     k: int = TOP_K) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Several TokenBatches (many sessions' streams) as one Arrow table, rows in order. Built column
    by column over all of them: Arrow's set-up is paid once per writer batch, not once per stream."""
    sizes = [len(b) for b in batches]
    n = sum(sizes)
    concept_ids, concept_values, added = _concept_columns(batches, sizes, concepts, k)
    now = time.time()
    stamps = [now if b.created_at is None else b.created_at for b in batches]
    if all(np.ndim(t) == 0 for t in stamps):  # one stamp a batch: the recorder's way
        created = np.repeat(np.asarray(stamps, dtype=np.float64), sizes)
    else:
        created = np.concatenate([np.broadcast_to(np.asarray(t, dtype=np.float64), (size,))
                                  for t, size in zip(stamps, sizes)])
    token_ids = pa.array([t for b, size in zip(batches, sizes)
                          for t in (b.token_ids if b.token_ids is not None else [None] * size)], pa.int32())

    def shared(field: str, encode: Any = None) -> pa.Array:
        values = [getattr(b, field) for b in batches]
        if all(v is None for v in values):
            return pa.nulls(n, pa.string())
        if encode is not None:
            values = [encode(v) for v in values]
        return pa.array([v for v, size in zip(values, sizes) for _ in range(size)], pa.string())

    table = pa.table({
        "id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
        "session_id": shared("session_id"),
        "tick": pa.array(np.concatenate([np.asarray(b.ticks, dtype=np.int64) for b in batches])
                         if batches else np.zeros(0, np.int64)),
        "event_type": shared("event_type"),
        "role": shared("role"),
        "content": pa.array([c for b in batches for c in _texts(b)], pa.string()),
        "token_id": token_ids,
        "request_id": shared("request_id"),
        "concept_ids": concept_ids,
        "concept_values": concept_values,
        "activation_source": shared("activation_source"),
        "created_at": pa.array(np.asarray(created * 1e6, dtype=np.int64), pa.timestamp("us")),
        "metadata": shared("metadata", _json),
        "steering": shared("steering", _json),
    })
    if any(b.hidden_index is not None for b in batches):
        table = table.append_column(HIDDEN_COLUMN, _hidden_column(batches, sizes))
    return table, added


def hidden_json(names: list[str], values: list[float]) -> str:
    """A token's hidden activations as the audit log stores them: JSON {name: value}, largest first."""
    pairs = sorted(zip(names, values), key=lambda p: -p[1])
    return json.dumps({name: float(value) for name, value in pairs}, separators=(",", ":"))


def _hidden_column(batches: list[TokenBatch], sizes: list[int]) -> pa.Array:
    """Each row's hidden activations as the audit log takes them (xdb/audit/hidden.py): JSON {name: value},
    null where a row has none. Only the audit log reads this column; the experience file never stores it."""
    texts: list[str | None] = []
    for batch, size in zip(batches, sizes):
        if batch.hidden_index is None or batch.hidden_values is None:
            texts += [None] * size
            continue
        names = batch.hidden_names
        for idx, val in zip(np.asarray(batch.hidden_index).tolist(),
                            np.asarray(batch.hidden_values, dtype=np.float32).tolist()):
            kept = [(names[i], v) for i, v in zip(idx, val) if i >= 0]
            texts.append(hidden_json([n for n, _ in kept], [v for _, v in kept]) if kept else None)
    return pa.array(texts, pa.string())


def _texts(batch: TokenBatch) -> Sequence[str]:
    if batch.contents is None:
        raise ValueError("a TokenBatch of token ids reached the conversion undecoded")
    return batch.contents


def _pad(array: np.ndarray, width: int, fill: float) -> np.ndarray:
    if array.shape[1] == width:
        return array
    return np.concatenate([array, np.full((array.shape[0], width - array.shape[1]), fill, dtype=array.dtype)], axis=1)


def _runs(parts: list[list[TimestepRow] | TokenBatch]) -> list[list[TimestepRow] | list[TokenBatch]]:
    """Consecutive row lists joined into one, consecutive TokenBatches gathered into one run; an empty
    row list separates nothing."""
    out: list[list[TimestepRow] | list[TokenBatch]] = []
    rows: list[TimestepRow] = []
    batches: list[TokenBatch] = []
    for part in parts:  # at most one of rows / batches is non-empty: each flushes the other
        if isinstance(part, TokenBatch):
            if rows:
                out.append(rows)
                rows = []
            batches.append(part)
        elif part:
            if batches:
                out.append(batches)
                batches = []
            rows = rows + part
    if batches:
        out.append(batches)
    if rows:
        out.append(rows)
    return out


def to_arrow(parts: list[list[TimestepRow] | TokenBatch], first_id: int, concepts: ConceptIndex,
             k: int = TOP_K) -> tuple[pa.Table, list[tuple[int, str]]]:
    """One Arrow table for a writer batch made of TimestepRow lists and TokenBatches; ids follow the
    parts' order. A run of TokenBatches (many streams' tokens, a step at a time) converts as one."""
    tables, added = [], []
    for run in _runs(parts):
        if isinstance(run[0], TokenBatch):
            table, new = batches_to_arrow(run, first_id, concepts, k)
        else:
            table, new = rows_to_arrow(run, first_id, concepts, k)
        first_id += table.num_rows
        tables.append(table)
        added += new
    if any(HIDDEN_COLUMN in t.column_names for t in tables):  # every table with the column, or none
        tables = [t if HIDDEN_COLUMN in t.column_names else
                  t.append_column(HIDDEN_COLUMN, pa.nulls(t.num_rows, pa.string())) for t in tables]
    # One chunk per column: DuckDB scans a many-chunked table in parallel pieces and inserts it
    # at ~1.5x the CPU (measured), far more than this copy costs.
    return (tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()), added
