"""The tags a batch's activations earn as it is written, computed in numpy from a cached map.

A token whose activation of a concept reaches the concept's threshold (concept_hierarchy.threshold,
from the lens pack) gets the concept's tag (source `auto`, on the timestep), and the concept's parent
gets an `inherited` range tag over the span of each reply in which any of its children fired. This
was one SQL statement joining the batch's fired pairs with `concepts`, `concept_hierarchy` and `tags`
on every batch (~4 ms of the writer's CPU a batch, the planning of a four-way join); the join's
right side changes only when concepts, the hierarchy or tags do, so it is read once into
`AutoTagMap` (its rows: concept id, threshold, tag id, parent tag id) and the join runs in numpy.
The writer reloads the map when it is told they changed (`Writer.invalidate_auto_tags`) and when a
batch registers new concepts.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The join the SQL made, one row a (concept, tag, parent tag) match; several concept tags may name one
# concept, and each match tags the token (as the join did).
MAP_QUERY = """SELECT c.id, h.threshold, g.id, coalesce(pg.id, -1)
    FROM concepts c
    JOIN concept_hierarchy h ON h.concept = c.name AND h.threshold IS NOT NULL
    JOIN tags g ON g.tag_type = 'concept' AND g.concept_id = h.concept
    LEFT JOIN tags pg ON pg.tag_type = 'concept' AND pg.concept_id = h.parent
    ORDER BY 1, 3, 4"""

# `tag_applications`' columns in its order, from SCHEMA's: ids from its sequence (as its DEFAULT
# would), the transaction's time.
COLUMNS = ("nextval('tag_application_ids') AS id, tag_id, session_id, target_type, timestep_id, "
           "NULL::VARCHAR AS event_id, range_start, range_end, confidence, source, now() AS created_at, "
           "NULL::VARCHAR AS note")

SCHEMA = pa.schema([("tag_id", pa.int64()), ("session_id", pa.string()), ("target_type", pa.string()),
                    ("timestep_id", pa.int64()), ("range_start", pa.int64()), ("range_end", pa.int64()),
                    ("confidence", pa.float64()), ("source", pa.string())])


def over_threshold(table: pa.Table, thresholds: np.ndarray) -> pa.Table | None:
    """The batch's (token, concept) pairs whose activation reaches the concept's threshold
    (`thresholds[concept id]`, NaN: none), as `id, session_id, tick, request_id, cid, v`; None if
    there are none. A superset by a hair: the SQL compares again, as the values are stored."""
    ids_col, values_col = table.column("concept_ids"), table.column("concept_values")
    if ids_col.null_count == len(ids_col):
        return None
    ids = ids_col.combine_chunks() if isinstance(ids_col, pa.ChunkedArray) else ids_col
    cids = pc.list_flatten(ids).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(values_col).to_numpy(zero_copy_only=False).astype(np.float64)
    known = (cids >= 0) & (cids < len(thresholds))  # NaN in `cids` (a null slot) compares False
    limit = np.full(len(cids), np.nan)
    limit[known] = thresholds[cids[known].astype(np.int64)]
    hit = np.flatnonzero(values >= limit - 1e-6)
    if not len(hit):
        return None
    rows = pc.list_parent_indices(ids).to_numpy()[hit]
    picked = table.select(["id", "session_id", "tick", "request_id"]).take(pa.array(rows))
    return picked.append_column("cid", pa.array(cids[hit].astype(np.int32))).append_column(
        "v", pa.array(values[hit].astype(np.float32)))


@dataclass(frozen=True)
class AutoTagMap:
    """The (concept id, threshold, tag id, parent tag id or -1) rows, sorted by concept id."""

    cids: np.ndarray
    thresholds: np.ndarray
    tag_ids: np.ndarray
    parent_tag_ids: np.ndarray

    @classmethod
    def load(cls, conn: duckdb.DuckDBPyConnection) -> AutoTagMap:
        rows = conn.execute(MAP_QUERY).fetchall()
        cols = list(zip(*rows)) if rows else [(), (), (), ()]
        return cls(np.array(cols[0], np.int64), np.array(cols[1], np.float64), np.array(cols[2], np.int64),
                   np.array(cols[3], np.int64))

    def matches(self, cids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For fired pairs (concept id, float32 value): (pair index, map row) of every map row of the
        pair's concept whose threshold the value reaches (compared as DOUBLE, as the SQL did)."""
        first = np.searchsorted(self.cids, cids, side="left")
        counts = np.searchsorted(self.cids, cids, side="right") - first
        pair = np.repeat(np.arange(len(cids)), counts)
        row = np.repeat(first, counts) + np.arange(len(pair)) - np.repeat(np.cumsum(counts) - counts, counts)
        keep = values.astype(np.float64)[pair] >= self.thresholds[row]
        return pair[keep], row[keep]

    def applications(self, fired: pa.Table) -> pa.Table | None:
        """The tag applications (SCHEMA) of `fired` (`id, session_id, tick, request_id, cid, v`, the
        batch's pairs over a threshold): AUTO rows, then INHERITED ranges; None if there are none."""
        values = fired.column("v").to_numpy()
        pair, row = self.matches(fired.column("cid").to_numpy().astype(np.int64), values)
        if not len(pair):
            return None
        sessions = fired.column("session_id").combine_chunks()
        v = values[pair]
        auto = _rows(self.tag_ids[row], sessions.take(pa.array(pair)), "timestep",
                     fired.column("id").to_numpy()[pair], None, None, v, "auto")
        parents = self.parent_tag_ids[row] >= 0
        if not parents.any():
            return auto
        under = pair[parents]
        parent = self.parent_tag_ids[row][parents]
        first, lo, hi, top = spans(parent, sessions, fired.column("request_id").combine_chunks(), under,
                                   fired.column("tick").to_numpy()[under], v[parents])
        inherited = _rows(parent[first], sessions.take(pa.array(under[first])), "range", None, lo, hi, top,
                          "inherited")
        return pa.concat_tables([auto, inherited])


def spans(parent: np.ndarray, sessions: pa.Array, requests: pa.Array, under: np.ndarray, ticks: np.ndarray,
          values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The INHERITED groups, one a (parent tag, session, request) of the pairs `under` (indexes into
    `sessions` and `requests`; a null request is a group of its own, as in SQL's GROUP BY): each
    group's first pair, its first and last tick and its highest value. In numpy: an Arrow group-by
    costs ~0.7 ms a call whatever its size."""
    keys = np.stack([parent, _codes(sessions)[under], _codes(requests)[under]], axis=1)
    _, first, group = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    lo = np.full(len(first), np.iinfo(np.int64).max, np.int64)
    hi = np.full(len(first), np.iinfo(np.int64).min, np.int64)
    top = np.full(len(first), -np.inf, values.dtype)
    np.minimum.at(lo, group, ticks)
    np.maximum.at(hi, group, ticks)
    np.maximum.at(top, group, values)
    return first, lo, hi, top


def _codes(arr: pa.Array) -> np.ndarray:
    """Each value's index among the distinct values (-1: null)."""
    indices = pc.dictionary_encode(arr).indices
    codes: np.ndarray = _filled_codes(indices).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes


def _filled_codes(indices: pa.Array) -> pa.Array:
    return indices if indices.null_count == 0 else pc.fill_null(indices, -1)


def _rows(tag_ids: np.ndarray, sessions: pa.Array, target: str, timesteps: np.ndarray | None,
          starts: np.ndarray | None, ends: np.ndarray | None, values: np.ndarray, source: str) -> pa.Table:
    """Tag applications in SCHEMA; confidence is the value clipped to [0, 1] (exact: float32 in double)."""
    n = len(tag_ids)
    nulls = pa.nulls(n, pa.int64())

    def ints(a: np.ndarray | None) -> pa.Array:
        return nulls if a is None else pa.array(a, pa.int64())

    return pa.Table.from_arrays([
        pa.array(tag_ids, pa.int64()), pc.cast(sessions, pa.string()), pa.array([target] * n, pa.string()),
        ints(timesteps), ints(starts), ints(ends), pa.array(np.clip(values.astype(np.float64), 0.0, 1.0)),
        pa.array([source] * n, pa.string())], schema=SCHEMA)


def insert_applications(conn: duckdb.DuckDBPyConnection, made: pa.Table) -> int:
    """Within the batch's transaction: insert the applications, through a relation over them rather
    than a registered view (a view's creation and drop are catalog changes); returns how many."""
    conn.from_arrow(made).project(COLUMNS).insert_into("tag_applications")
    return int(made.num_rows)


def insert(conn: duckdb.DuckDBPyConnection, fired: pa.Table) -> int:
    """Within the batch's transaction: the AUTO and INHERITED tags of `fired` (`over_threshold`), joined
    to their tags in numpy, in one insert or none; returns how many tag applications were made."""
    made = tag_map(conn).applications(fired)
    return 0 if made is None else insert_applications(conn, made)


class _Cached:
    """A connection's map, the generation it is current for, and the generation when the connection's
    transaction began (what a map loaded in it can see)."""

    def __init__(self) -> None:
        self.generation = 0
        self.began = 0
        self.loaded: tuple[int, AutoTagMap] | None = None


_maps: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, _Cached] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def beginning(conn: duckdb.DuckDBPyConnection) -> None:
    """Called just before `conn` begins the transaction in which `tag_map` may load: every change
    forgotten so far was committed before it, so its snapshot sees them."""
    with _lock:
        cached = _maps.setdefault(conn, _Cached())
        cached.began = cached.generation


def tag_map(conn: duckdb.DuckDBPyConnection) -> AutoTagMap:
    """The map as `conn`'s transaction sees it, loaded once until `forget`."""
    with _lock:
        cached = _maps.setdefault(conn, _Cached())
        began, loaded = cached.began, cached.loaded
        if loaded is not None and loaded[0] == cached.generation:
            return loaded[1]
    fresh = AutoTagMap.load(conn)
    with _lock:
        # Current only as of the transaction's start: a change committed since (forgotten after
        # `beginning`) is not in this snapshot, and the next transaction loads again.
        cached.loaded = (began, fresh)
    return fresh


def forget(conn: duckdb.DuckDBPyConnection) -> None:
    """Concepts, the hierarchy or tags changed (committed, or inserted by `conn`'s own open
    transaction): the map is loaded again."""
    with _lock:
        _maps.setdefault(conn, _Cached()).generation += 1
