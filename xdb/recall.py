"""Recall: the SPEC §5 filters, validated, turned into one DuckDB query over `timesteps`."""

from __future__ import annotations

import json
from typing import Any

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from xdb.concepts import ConceptIndex

MAX_LIMIT = 10_000


class RecallFilterError(ValueError):
    """A bad recall filter; `param` names it (the HTTP route puts it in the error's `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"bad recall filter {param!r}: {message}")
        self.param = param


class RecallFilters(BaseModel):
    """Every filter is optional and they AND together; `tags` matches any of the tags given."""

    model_config = ConfigDict(extra="forbid")
    session_id: str | None = None
    event_types: list[str] | None = None
    tags: list[str] | None = None
    text: str | None = None
    tick_from: int | None = Field(None, ge=0)
    tick_to: int | None = Field(None, ge=0)
    concept: str | None = None
    min_activation: float | None = None
    limit: int = Field(100, ge=1, le=MAX_LIMIT)

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

    @field_validator("min_activation")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and value != value:
            raise ValueError("must be a number")
        return value

    @model_validator(mode="after")
    def _range(self) -> "RecallFilters":
        if self.tick_from is not None and self.tick_to is not None and self.tick_from > self.tick_to:
            raise ValueError("tick_from must not exceed tick_to")
        return self

    @classmethod
    def parse(cls, values: dict[str, Any] | "RecallFilters" | None = None, **kwargs: Any) -> "RecallFilters":
        """Build from loose values; a bad one raises RecallFilterError naming the filter."""
        if isinstance(values, RecallFilters) and not kwargs:
            return values
        data = {**(values.model_dump(exclude_unset=True) if isinstance(values, RecallFilters) else values or {}),
                **kwargs}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            param = str(err["loc"][0]) if err["loc"] else ("tick_from" if "tick_from" in err["msg"] else "filters")
            raise RecallFilterError(param, err["msg"]) from None


COLUMNS = ("id", "session_id", "tick", "event_type", "role", "content", "token_id", "request_id",
           "concept_ids", "concept_values", "activation_source", "created_at", "metadata")

# Tag applications reach a timestep three ways: directly, through its reply (event = request_id) or
# through a tick range of its session.
TAG_MATCH = """(
    (a.target_type = 'timestep' AND a.timestep_id = t.id)
    OR (a.target_type = 'event' AND a.event_id = t.request_id)
    OR (a.target_type = 'range' AND a.session_id = t.session_id AND t.tick BETWEEN a.range_start AND a.range_end))"""


def resolve_tag_ids(cur: duckdb.DuckDBPyConnection, names_or_ids: list[str]) -> list[int]:
    """Tag ids for names or numeric ids; unknown tags are skipped (they match nothing)."""
    numeric = [int(x) for x in names_or_ids if x.isdigit()]
    rows = cur.execute("SELECT id FROM tags WHERE name IN (SELECT unnest(?)) OR id IN (SELECT unnest(?))",
                       [names_or_ids, numeric]).fetchall()
    return [tid for (tid,) in rows]


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def build_query(f: RecallFilters, concepts: ConceptIndex, tag_ids: list[int] | None) -> tuple[str, list] | None:
    """SQL and parameters for the filters; None when they can match nothing (unknown concept/tags)."""
    where: list[str] = []
    params: list[Any] = []
    if f.session_id is not None:
        where.append("t.session_id = ?")
        params.append(f.session_id)
    if f.event_types:
        where.append("t.event_type IN (SELECT unnest(?))")
        params.append(f.event_types)
    if f.tick_from is not None:
        where.append("t.tick >= ?")
        params.append(f.tick_from)
    if f.tick_to is not None:
        where.append("t.tick <= ?")
        params.append(f.tick_to)
    if f.text is not None:
        where.append("t.content ILIKE ? ESCAPE '\\'")
        params.append(f"%{_escape_like(f.text)}%")
    if f.concept is not None:
        cid = concepts.id_of(f.concept)
        if cid is None:
            return None
        if f.min_activation is None:
            where.append("list_contains(t.concept_ids, ?)")
            params.append(cid)
        else:
            where.append("t.concept_values[list_position(t.concept_ids, ?)] >= ?")
            params += [cid, f.min_activation]
    elif f.min_activation is not None:
        where.append("list_max(t.concept_values) >= ?")
        params.append(f.min_activation)
    if tag_ids is not None:
        if not tag_ids:
            return None
        # Three semi-joins instead of one OR-correlated EXISTS: DuckDB plans each as a hash join.
        where.append("""(t.id IN (SELECT timestep_id FROM tag_applications
                                  WHERE target_type = 'timestep' AND tag_id IN (SELECT unnest(?)))
            OR t.request_id IN (SELECT event_id FROM tag_applications
                                WHERE target_type = 'event' AND tag_id IN (SELECT unnest(?)))
            OR t.id IN (SELECT r.id FROM timesteps r JOIN tag_applications a ON a.session_id = r.session_id
                        AND r.tick BETWEEN a.range_start AND a.range_end
                        WHERE a.target_type = 'range' AND a.tag_id IN (SELECT unnest(?))))""")
        params += [tag_ids, tag_ids, tag_ids]
    sql = f"SELECT {', '.join('t.' + c for c in COLUMNS)} FROM timesteps t"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY t.id LIMIT ?"
    params.append(f.limit)
    return sql, params


def tags_for(cur: duckdb.DuckDBPyConnection, rows: list[tuple]) -> dict[int, list[str]]:
    """Tag names per recalled timestep id."""
    if not rows:
        return {}
    ids, sessions, ticks, requests = ([r[i] for r in rows] for i in (0, 1, 2, 7))
    found = cur.execute(f"""
        SELECT t.id, list(DISTINCT g.name ORDER BY g.name)
        FROM (SELECT unnest(?) AS id, unnest(?) AS session_id, unnest(?) AS tick, unnest(?) AS request_id) t
        JOIN tag_applications a ON {TAG_MATCH}
        JOIN tags g ON g.id = a.tag_id GROUP BY t.id""", [ids, sessions, ticks, requests]).fetchall()
    return dict(found)


def to_record(row: tuple, concepts: ConceptIndex, tags: list[str]) -> dict[str, Any]:
    rec = dict(zip(COLUMNS, row))
    ids, values = rec.pop("concept_ids"), rec.pop("concept_values")
    rec["concept_activations"] = {concepts.name_of(c): v for c, v in zip(ids or (), values or ()) if c is not None}
    rec["created_at"] = rec["created_at"].isoformat() + "Z"
    rec["metadata"] = json.loads(rec["metadata"]) if rec["metadata"] else None
    rec["tags"] = tags
    return rec


def recall(cur: duckdb.DuckDBPyConnection, filters: RecallFilters, concepts: ConceptIndex) -> list[dict[str, Any]]:
    tag_ids = resolve_tag_ids(cur, filters.tags) if filters.tags else None
    query = build_query(filters, concepts, tag_ids)
    if query is None:
        return []
    rows = cur.execute(*query).fetchall()
    tags = tags_for(cur, rows)
    return [to_record(r, concepts, tags.get(r[0], [])) for r in rows]
