"""Recall: the timestep filters (session, event types, tags, text, ticks, concept), validated,
turned into DuckDB queries over `timesteps`; with a deadline, scanned in id windows that stop there."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from core.errors import InvalidRequest
from xdb.concepts import ConceptIndex
from xdb.owner import owned
from xdb.recall.tag_cache import TagCache
from xdb.schema import INT64_MAX
from xdb.sql import Row
from xdb.storage import segments
from xdb.tables import HOT_TIMESTEPS

MAX_LIMIT = 10_000


class RecallFilterError(InvalidRequest):
    """A bad recall filter, named by `param`."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"bad recall filter {param!r}: {message}", param=param)


class RecallFilters(BaseModel):
    """Every filter is optional and they AND together; `tags` matches any of the tags given."""

    model_config = ConfigDict(extra="forbid")
    session_id: str | None = None
    event_types: list[str] | None = None
    tags: list[str] | None = None
    text: str | None = None
    # tick_to comes before tick_from: the range check runs on tick_from, and names it
    tick_to: int | None = Field(None, ge=0, le=INT64_MAX)
    tick_from: int | None = Field(None, ge=0, le=INT64_MAX)
    # Rows created in [time_from, time_to] (UTC when no offset is given).
    time_to: dt.datetime | None = None
    time_from: dt.datetime | None = None
    concept: str | None = None
    # With `concept`: that concept's activation; without: the row's top activation.
    min_activation: float | None = None
    max_activation: float | None = None
    limit: int = Field(100, ge=1, le=MAX_LIMIT)
    # Paging: rows after the one with this id (the cursor a page hands back), and/or skip `offset` rows.
    after_id: int | None = Field(None, ge=-1, le=INT64_MAX)
    offset: int = Field(0, ge=0, le=1_000_000)

    @field_validator("event_types", "tags", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        # Query strings carry lists as "a,b" or as repeated keys; accept both.
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)):
            value = [part.strip() for item in value for part in str(item).split(",") if part.strip()]
            if not value:
                raise ValueError("must name at least one value")
        return value

    @field_validator("session_id", "text", "concept")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("min_activation", "max_activation")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and value != value:
            raise ValueError("must be a number")
        return value

    @field_validator("time_to", "time_from")
    @classmethod
    def _utc(cls, value: dt.datetime | None) -> dt.datetime | None:
        if value is None or value.tzinfo is None:
            return value
        try:
            return value.astimezone(dt.UTC).replace(tzinfo=None)
        except OverflowError:
            raise ValueError("is outside the years 1 to 9999 once moved to UTC") from None

    @field_validator("time_from")
    @classmethod
    def _time_range(cls, value: dt.datetime | None, info: ValidationInfo) -> dt.datetime | None:
        time_to = info.data.get("time_to")
        if value is not None and time_to is not None and value > time_to:
            raise ValueError("time_from must not be after time_to")
        return value

    @field_validator("tick_from")
    @classmethod
    def _range(cls, value: int | None, info: ValidationInfo) -> int | None:
        tick_to = info.data.get("tick_to")
        if value is not None and tick_to is not None and value > tick_to:
            raise ValueError("tick_from must not exceed tick_to")
        return value

    @classmethod
    def parse(cls, values: dict[str, Any] | RecallFilters | None = None, **kwargs: Any) -> RecallFilters:
        """Build from loose values; a bad one raises RecallFilterError naming the filter."""
        if isinstance(values, RecallFilters) and not kwargs:
            return values
        data = {**(values.model_dump(exclude_unset=True) if isinstance(values, RecallFilters) else values or {}),
                **kwargs}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            param = str(err["loc"][0]) if err["loc"] else "filters"
            raise RecallFilterError(param, str(err["msg"]).removeprefix("Value error, ")) from None


COLUMNS = ("id", "session_id", "tick", "event_type", "role", "content", "token_id", "request_id",
           "concept_ids", "concept_values", "activation_source", "created_at", "metadata")
ROW_COLUMNS = ", ".join(f"t.{c}" for c in COLUMNS)

# The three ways a tag reaches a timestep (xdb/tags.py, TAG_MATCH), each as a join DuckDB can hash (an OR
# of them is a nested loop, and an OR across columns is never pushed into a scan):
# (columns of tag_applications, join condition).
TAG_JOINS = {
    "timestep": ("timestep_id", "t.id = a.timestep_id"),
    "event": ("session_id, event_id", "t.request_id = a.event_id AND t.session_id = a.session_id"),
    "range": ("session_id, range_start, range_end",
              "t.session_id = a.session_id AND t.tick BETWEEN a.range_start AND a.range_end"),
}

# DuckDB's Python client binds each parameter in ~0.2 ms and a list parameter at ~0.1 ms an element,
# which would dwarf the queries themselves. So numbers are written into the SQL (formatted here from
# validated ints and floats), a single string is one parameter, and a list of strings travels as one
# JSON parameter.


def _ints(values: list[int]) -> str:
    return ", ".join(str(int(v)) for v in values) or "NULL"


def _double(value: float) -> str:
    return f"CAST('{float(value)!r}' AS DOUBLE)"


def _strings(values: list[str], params: list[Any]) -> str:
    """An IN-list operand for strings, as one JSON parameter appended to `params`."""
    params.append(json.dumps(list(values)))
    return """SELECT unnest(from_json(?, '["VARCHAR"]'))"""


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def conditions(f: RecallFilters, concepts: ConceptIndex, owner: str,
               until_id: int | None = None) -> tuple[list[str], list[Any]] | None:
    """WHERE terms over `timesteps t` for every filter but tags; None when they can match nothing.
    `owner`: only one tenant's sessions (xdb/owner.py; "": every session). `until_id`: rows with an
    id up to it only (a window of a bounded recall)."""
    where: list[str] = []
    params: list[Any] = []
    if owner:
        condition, params = owned("t.session_id", owner)
        where.append(condition)
    if f.session_id is not None:
        where.append("t.session_id = ?")
        params.append(f.session_id)
    if f.event_types:
        where.append(f"t.event_type IN ({_strings(f.event_types, params)})")
    if f.tick_from is not None:
        where.append(f"t.tick >= {int(f.tick_from)}")
    if f.tick_to is not None:
        where.append(f"t.tick <= {int(f.tick_to)}")
    if f.time_from is not None:
        where.append("t.created_at >= ?")
        params.append(f.time_from)
    if f.time_to is not None:
        where.append("t.created_at <= ?")
        params.append(f.time_to)
    if f.after_id is not None:
        where.append(f"t.id > {int(f.after_id)}")
    if until_id is not None:
        where.append(f"t.id <= {int(until_id)}")
    if f.text is not None:
        where.append("t.content ILIKE ? ESCAPE '\\'")
        params.append(f"%{_escape_like(f.text)}%")
    if f.concept is not None:
        cid = concepts.id_of(f.concept)
        if cid is None:
            return None
        value = f"array_extract(t.concept_values, array_position(t.concept_ids, {int(cid)}))"
        if f.min_activation is None and f.max_activation is None:
            # Alone, array_contains is the cheap test (~2x faster than finding the value's slot). With a
            # bound, the slot's value is NULL where the concept is absent, so the bound alone filters,
            # and DuckDB then tests the session first (measured ~3x faster with a session and a band).
            where.append(f"array_contains(t.concept_ids, {int(cid)})")
    else:
        value = "list_max(t.concept_values)"
    if f.min_activation is not None:
        where.append(f"{value} >= {_double(f.min_activation)}")
    if f.max_activation is not None:
        where.append(f"{value} <= {_double(f.max_activation)}")
    return where, params


def build_query(f: RecallFilters, concepts: ConceptIndex, tag_ids: list[int] | None,
                tag_kinds: list[str] | None = None, *, owner: str,
                until_id: int | None = None, source: str = "timesteps") -> tuple[str, list[Any]] | None:
    """SQL and parameters for the rows of the first `limit` matches, oldest first; None when the filters
    can match nothing (unknown concept or tags). DuckDB's top-N pushes a growing `id` bound into the scan,
    so row groups past the first matches are skipped by their zone maps. Without tags the rows come
    straight from the filtered top-N: fetching them by id afterwards read every column of the id range
    the matches span (2x slower at 10M rows when they are sparse); with tags, the ids come first.
    `source`: what the rows are read from (one segment's, in a window of `_bounded`)."""
    found = conditions(f, concepts, owner, until_id)
    if found is None:
        return None
    where, params = found
    sql_where = (" WHERE " + " AND ".join(where)) if where else ""
    page = f"LIMIT {f.limit}" + (f" OFFSET {int(f.offset)}" if f.offset else "")
    if tag_ids is None:
        return f"SELECT {ROW_COLUMNS} FROM {source} t{sql_where} ORDER BY t.id {page}", params
    kinds = [k for k in TAG_JOINS if tag_kinds is None or k in tag_kinds]
    if not tag_ids or not kinds:
        return None
    # One semi-join per way the tags reach timesteps, each with its own top-N, then merged.
    branches = [f"""SELECT * FROM (SELECT t.id FROM {source} t SEMI JOIN (
                        SELECT {TAG_JOINS[k][0]} FROM tag_applications
                        WHERE target_type = '{k}' AND tag_id IN ({_ints(tag_ids)})) a ON {TAG_JOINS[k][1]}
                    {sql_where} ORDER BY t.id LIMIT {f.limit + f.offset})""" for k in kinds]
    sql = f"SELECT DISTINCT id FROM ({' UNION ALL '.join(branches)}) ORDER BY id {page}"
    return rows_query(sql, source), params * len(kinds)


def rows_query(ids_sql: str, source: str = "timesteps") -> str:
    """The matched rows themselves, oldest first. The semi-join pushes the matched ids' min and max
    into the scan, so zone maps skip every row group outside them."""
    return f"SELECT {', '.join(COLUMNS)} FROM {source} WHERE id IN ({ids_sql}) ORDER BY id"


def tags_for(cur: duckdb.DuckDBPyConnection, rows: list[Row], tag_cache: TagCache) -> dict[int, list[str]]:
    """Tag names (sorted) per recalled row. An application carries the session of the timesteps it
    reaches (tags.resolve_target sets it), so only the recalled sessions' applications are read
    (and any without a session), bounded by the rows' ids and ticks, and matched to the rows here."""
    if not rows:
        return {}
    sessions = sorted({r[1] for r in rows})
    params: list[Any] = []
    where = "session_id = ?" if len(sessions) == 1 else f"session_id IN ({_strings(sessions, params)})"
    if len(sessions) == 1:
        params.append(sessions[0])
    ids, ticks = [r[0] for r in rows], [r[2] for r in rows]
    apps = cur.execute(f"""
        SELECT target_type, timestep_id, event_id, session_id, range_start, range_end, tag_id
        FROM tag_applications WHERE ({where} OR session_id IS NULL)
        AND (target_type = 'event' OR timestep_id BETWEEN {min(ids)} AND {max(ids)}
             OR (range_end >= {min(ticks)} AND range_start <= {max(ticks)}))""", params).fetchall()
    if not apps:
        return {}
    names = tag_cache.names(cur, {app[6] for app in apps})
    by_id: dict[int, set[str]] = {}
    by_request: dict[tuple[str, str], set[str]] = {}
    by_session: dict[str, list[tuple[int, int, str]]] = {}
    for kind, timestep_id, event_id, session_id, start, end, tag_id in apps:
        name = names.get(tag_id)
        if name is None:
            continue
        if kind == "timestep":
            by_id.setdefault(timestep_id, set()).add(name)
        elif kind == "event":
            by_request.setdefault((session_id, event_id), set()).add(name)
        else:
            by_session.setdefault(session_id, []).append((start, end, name))
    out: dict[int, list[str]] = {}
    for tid, session_id, tick, *_, request_id in (r[:8] for r in rows):
        found = by_id.get(tid, set()) | by_request.get((session_id, request_id), set())
        found.update(name for start, end, name in by_session.get(session_id, ()) if start <= tick <= end)
        if found:
            out[tid] = sorted(found)
    return out


def comments_for(cur: duckdb.DuckDBPyConnection, rows: list[Row]) -> dict[int, list[dict[str, Any]]]:
    """The comments on each recalled row (on it, its reply or a tick range holding it), oldest first:
    only the recalled sessions' comments are read."""
    if not rows:
        return {}
    params: list[Any] = []
    sessions = _strings(sorted({r[1] for r in rows}), params)
    found = cur.execute(f"""SELECT id, target_type, timestep_id, event_id, session_id, range_start, range_end,
                                   content, created_at FROM comments WHERE session_id IN ({sessions})
                            ORDER BY id""", params).fetchall()
    out: dict[int, list[dict[str, Any]]] = {}
    for cid, kind, timestep_id, event_id, session_id, start, end, content, at in found:
        note = {"id": cid, "content": content, "created_at": at.isoformat() + "Z"}
        for tid, row_session, tick, *_, request_id in (r[:8] for r in rows):
            if ((kind == "timestep" and timestep_id == tid)
                    or (kind == "event" and event_id == request_id and session_id == row_session)
                    or (kind == "range" and session_id == row_session and start <= tick <= end)):
                out.setdefault(tid, []).append(note)
    return out


def to_record(row: Row, concepts: ConceptIndex, tags: list[str],
              comments: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rec = dict(zip(COLUMNS, row))
    ids, values = rec.pop("concept_ids"), rec.pop("concept_values")
    rec["concept_activations"] = {concepts.name_of(c): v for c, v in zip(ids or (), values or ()) if c is not None}
    rec["created_at"] = rec["created_at"].isoformat() + "Z"
    rec["metadata"] = json.loads(rec["metadata"]) if rec["metadata"] else None
    rec["tags"] = tags
    rec["comments"] = comments or []
    return rec


def recall(cur: duckdb.DuckDBPyConnection, filters: RecallFilters, concepts: ConceptIndex,
           tag_cache: TagCache | None = None, *, owner: str) -> list[dict[str, Any]]:
    """The matching rows in one query (`build_query`), with no time bound; then their tags and comments."""
    return recall_within(cur, filters, concepts, tag_cache, owner=owner, deadline_s=None).rows


@dataclass(frozen=True)
class Recalled:
    """What a recall found. `partial`: its deadline came before `limit` rows were; then `rows` are the
    matches among the ids up to `scanned_to`, every one of them, oldest first, and a recall with
    `after_id = scanned_to` continues where it stopped (None: the deadline came while `offset` rows
    were still being skipped, so there is no id to continue from)."""

    rows: list[dict[str, Any]]
    partial: bool = False
    scanned_to: int | None = None


# A bounded recall first runs the single query (`build_query`) for FIRST_TRY_SHARE of its deadline:
# most recalls end there, at no cost over an unbounded one. One still running is interrupted, and the
# rest of the deadline scans ids in windows, each twice the last: a filter whose first `limit` matches lie
# early costs one or two small queries, a sparse one about log2(rows / FIRST_WINDOW) more (zone maps
# skipping what the other filters rule out) for at most twice the rows one query reads; and what the
# windows finished before the deadline is the partial answer. One row group's ids to start.
FIRST_TRY_SHARE = 0.5
# The scan stops this share of the deadline early: the rows' tags, comments and records are made after
# it (~3-12 ms for a page of 100 at 10M rows on 2 busy cores), and an interrupt takes a few ms to land.
FINISH_SHARE = 0.1
FIRST_WINDOW = 122_880
# While a query runs past its time it is interrupted again this often: an interrupt that lands just
# before DuckDB starts the query is cleared by the start.
INTERRUPT_EVERY_S = 0.005


class _Deadline:
    """Runs queries on `cur` until `seconds` from now (`at`, time.monotonic()); a query still running
    then, or at the earlier `until` given to `fetch`, is interrupted (it raises duckdb.InterruptException),
    and one started past the deadline raises it at once. Only `fetch`'s queries are ever interrupted:
    the watcher interrupts under the lock `fetch` holds while it marks a query running or done."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self._cur, self._cond = cur, threading.Condition()
        self._until: float | None = None  # while a query runs: when it is interrupted
        self._closed = False
        threading.Thread(target=self._watch, name="recall-deadline", daemon=True).start()

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._until is None:
                    self._cond.wait()
                    continue
                left = self._until - time.monotonic()
                if left <= 0:
                    self._cur.interrupt()
                    left = INTERRUPT_EVERY_S
                self._cond.wait(left)

    def fetch(self, sql: str, params: list[Any], until: float | None = None) -> list[Row]:
        until = self.at if until is None else min(until, self.at)
        with self._cond:
            if time.monotonic() >= until:
                raise duckdb.InterruptException("recall deadline")
            self._until = until
            self._cond.notify()
        try:
            return self._cur.execute(sql, params).fetchall()
        finally:
            with self._cond:
                self._until = None
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


def _bounded(cur: duckdb.DuckDBPyConnection, guard: _Deadline, first_try_until: float, f: RecallFilters,
             concepts: ConceptIndex, tag_ids: list[int] | None, kinds: list[str] | None,
             owner: str) -> tuple[list[Row], bool, int | None]:
    """The first `f.limit` matches after `f.offset` ones: the single query until `first_try_until`,
    then growing id windows until they are found, the ids run out or the deadline comes:
    (rows, partial, the last id every match up to which is in rows: None unless partial)."""
    query = build_query(f, concepts, tag_ids, kinds, owner=owner)
    if query is None:
        return [], False, None
    sealed = segments.windows(cur)
    if not sealed:
        try:
            return guard.fetch(*query, until=first_try_until), False, None
        except duckdb.InterruptException:
            pass
    # The ids' bounds: with segments, from the manifest and the hot table (over the union, min and max
    # scan every segment: ~24 ms at 10M rows).
    source = f"(SELECT {sealed[0].first_id} AS id UNION ALL SELECT {sealed[-1].last_id} UNION ALL " \
             f"SELECT id FROM {HOT_TIMESTEPS})" if sealed else "timesteps"
    first, last = cur.execute(f"SELECT min(id), max(id) FROM {source}").fetchone() or (None, None)
    if first is None or last is None:
        return [], False, None
    start = max(int(first) - 1, -1 if f.after_id is None else f.after_id)
    found: list[Row] = []
    skip = f.offset
    for lo, hi, source in _windows(sealed, start, int(last)):
        if len(found) >= f.limit:
            break
        window = f.model_copy(update={"after_id": lo, "limit": f.limit - len(found), "offset": 0})
        try:
            if skip:
                counted = build_query(window.model_copy(update={"limit": skip}), concepts, tag_ids, kinds,
                                      owner=owner, until_id=hi, source=source)
                assert counted is not None  # the same filters as `query`
                seen = int(guard.fetch(f"SELECT count(*) FROM ({counted[0]})", counted[1])[0][0])
                if seen < skip:
                    skip -= seen
                    continue
                window = window.model_copy(update={"offset": skip})
            query = build_query(window, concepts, tag_ids, kinds, owner=owner, until_id=hi, source=source)
            assert query is not None
            rows = guard.fetch(*query)
        except duckdb.InterruptException:
            return found, True, (None if skip else lo)
        skip = 0
        found.extend(rows)
    return found, False, None


def _windows(sealed: list[segments.Window], after: int, last: int) -> Iterator[tuple[int, int | None, str]]:
    """The id windows a bounded recall scans after `after`, each (after id, up to id or None: open-ended,
    what to read): without segments, windows each twice the last over `timesteps`; with them, each
    segment read alone (a single table's top-N skips what it need not read), then the hot table."""
    if not sealed:
        lo, width = after, FIRST_WINDOW
        while lo < last:
            # The last window is open-ended: rows written since max(id) was read are in it too.
            hi = lo + width if lo + width < last else None
            yield lo, hi, "timesteps"
            lo, width = (last if hi is None else hi), width * 2
        return
    for window in sealed:
        if window.last_id > after:
            yield max(after, window.first_id - 1), window.last_id, window.source
    yield max(after, sealed[-1].last_id), None, HOT_TIMESTEPS


def recall_within(cur: duckdb.DuckDBPyConnection, filters: RecallFilters, concepts: ConceptIndex,
                  tag_cache: TagCache | None = None, *, owner: str, deadline_s: float | None) -> Recalled:
    """The matching rows, oldest first, with their tags and comments. `deadline_s`: the matches found
    within that many seconds (`_bounded`), marked partial when the deadline cut them short; None: one
    query (`build_query`), however long it takes."""
    guard = None if deadline_s is None else _Deadline(cur, deadline_s * (1 - FINISH_SHARE))
    try:
        tag_cache = tag_cache or TagCache()
        tag_ids, kinds = tag_cache.resolve(cur, filters.tags) if filters.tags else (None, None)
        partial, scanned_to = False, None
        if guard is None:
            query = build_query(filters, concepts, tag_ids, kinds, owner=owner)
            rows = [] if query is None else cur.execute(*query).fetchall()
        else:
            first_try_until = time.monotonic() + FIRST_TRY_SHARE * (guard.at - time.monotonic())
            rows, partial, scanned_to = _bounded(cur, guard, first_try_until, filters, concepts, tag_ids, kinds,
                                                 owner)
    finally:
        if guard is not None:
            guard.close()
    tags = tags_for(cur, rows, tag_cache)
    comments = comments_for(cur, rows)
    return Recalled([to_record(r, concepts, tags.get(r[0], []), comments.get(r[0])) for r in rows],
                    partial, scanned_to)


def timestep(cur: duckdb.DuckDBPyConnection, timestep_id: int, concepts: ConceptIndex, tag_cache: TagCache,
             owner: str) -> dict[str, Any] | None:
    """One row by id, with its tags and comments (None: no such row, or another tenant's)."""
    condition, params = owned("session_id", owner)
    rows = cur.execute(f"SELECT {', '.join(COLUMNS)} FROM timesteps WHERE id = ? AND {condition}",
                       [timestep_id, *params]).fetchall()
    if not rows:
        return None
    tags = tags_for(cur, rows, tag_cache)
    return to_record(rows[0], concepts, tags.get(timestep_id, []), comments_for(cur, rows).get(timestep_id))
