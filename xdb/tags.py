"""The folksonomy: tags (created on first use, by name or id), their applications, comments, buds."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import duckdb

from core.errors import Conflict, InvalidRequest, NotFound
from xdb.audit.log import AuditEvent
from xdb.interface import reads, writes
from xdb.owner import owned, owns
from xdb.schema import INT64_MAX
from xdb.sql import Row, one, one_int, transaction

# Tag applications reach a timestep three ways: directly, through its reply (event = request_id, in
# the session the tag was put in: a request id is a client's to choose) or through a tick range of its session.
TAG_MATCH = """(
    (a.target_type = 'timestep' AND a.timestep_id = t.id)
    OR (a.target_type = 'event' AND a.event_id = t.request_id AND a.session_id = t.session_id)
    OR (a.target_type = 'range' AND a.session_id = t.session_id AND t.tick BETWEEN a.range_start AND a.range_end))"""


class TagType(str, Enum):
    CONCEPT = "concept"
    ENTITY = "entity"
    BUD = "bud"
    CUSTOM = "custom"


class BudStatus(str, Enum):
    """A bud's life: a CANDIDATE collects examples (the timesteps it tags); with enough of them it may be
    READY; its evidence SUBMITTED (xdb/storage/fidelity.py's `submit_evidence`), it is GRAFTED (a lens
    learnt it) or REJECTED. A rejected bud may start again as a candidate."""

    CANDIDATE = "candidate"
    READY = "ready"
    SUBMITTED = "submitted"
    GRAFTED = "grafted"
    REJECTED = "rejected"


# Where each status may go (None: a tag not a bud yet). SUBMITTED is reached by submitting evidence, and
# left by resolving the submission, never by setting it.
BUD_MOVES: dict[str | None, frozenset[str]] = {
    None: frozenset({"candidate"}),
    "candidate": frozenset({"ready", "rejected"}),
    "ready": frozenset({"candidate", "rejected"}),
    "submitted": frozenset(),
    "grafted": frozenset(),
    "rejected": frozenset({"candidate"}),
}
BUD_MIN_EXAMPLES = 20  # xdb.bud_min_examples' default


TAG_SOURCES = ("auto", "manual", "inherited")
TAG_COLUMNS = ("id", "name", "tag_type", "concept_id", "entity_type", "bud_status", "created_at", "created_by",
               "description")


@dataclass
class TagTarget:
    """What a tag or comment points at: one timestep, one event (a reply: its request_id) or a tick
    range of a session. Exactly one of timestep_id / event_id / tick range is set."""

    session_id: str | None = None
    timestep_id: int | None = None
    event_id: str | None = None
    range_start: int | None = None
    range_end: int | None = None

    @property
    def kind(self) -> str:
        return "timestep" if self.timestep_id is not None else "event" if self.event_id is not None else "range"


def make_target(*, timestep_id: int | None = None, session_id: str | None = None, tick: int | None = None,
                event_id: str | None = None, tick_range: tuple[int, int] | None = None) -> TagTarget:
    """Validate the loose ways of naming a target (a tick of a session is a timestep)."""
    if tick is not None:
        if tick_range is not None:
            raise InvalidRequest("give either tick or tick_range, not both")
        tick_range = None
    chosen = [timestep_id is not None, event_id is not None, tick_range is not None, tick is not None]
    if sum(chosen) != 1:
        raise InvalidRequest("give exactly one target: timestep_id, event_id, session_id+tick or session_id+tick_range")
    if (tick is not None or tick_range is not None) and not session_id:
        raise InvalidRequest("session_id is required with tick or tick_range")
    if tick_range is not None:
        start, end = tick_range
        if start < 0 or end < start:
            raise InvalidRequest(f"bad tick_range {tick_range}: need 0 <= start <= end")
        return TagTarget(session_id=session_id, range_start=start, range_end=end)
    if tick is not None:
        return TagTarget(session_id=session_id, range_start=tick, range_end=tick)
    return TagTarget(session_id=session_id, timestep_id=timestep_id, event_id=event_id)


def resolve_target(cur: duckdb.DuckDBPyConnection, target: TagTarget, owner: str) -> TagTarget:
    """Check the target exists in a session `owner` (the caller's tenant's, xdb/owner.py) owns;
    a single tick becomes its timestep id. Raises NotFound, the same for a row that is
    missing and one of another tenant."""
    resolved = _resolve_target(cur, target, owner)
    if not owns(owner, resolved.session_id or ""):
        what = {"timestep": f"timestep {target.timestep_id}", "event": f"event (request) {target.event_id!r}"}
        raise NotFound(f"{what.get(target.kind, 'target')} not found")
    return resolved


def _resolve_target(cur: duckdb.DuckDBPyConnection, target: TagTarget, owner: str) -> TagTarget:
    if target.timestep_id is not None:
        row = cur.execute("SELECT session_id FROM timesteps WHERE id = ?", [target.timestep_id]).fetchone()
        if row is None:
            raise NotFound(f"timestep {target.timestep_id} not found")
        target.session_id = row[0]
    elif target.event_id is not None:
        # A request id is the client's to choose: the event is the owner's own (in the session named, if
        # one is), never another tenant's that happens to share its id.
        mine, params = owned("session_id", owner)
        where = f"request_id = ? AND {mine}" + (" AND session_id = ?" if target.session_id else "")
        row = cur.execute(f"SELECT session_id FROM timesteps WHERE {where} ORDER BY id DESC LIMIT 1",
                          [target.event_id, *params, *([target.session_id] if target.session_id else [])]).fetchone()
        if row is None:
            raise NotFound(f"event (request) {target.event_id!r} not found")
        target.session_id = row[0]
    elif target.range_start == target.range_end:
        row = cur.execute("SELECT id FROM timesteps WHERE session_id = ? AND tick = ? LIMIT 1",
                          [target.session_id, target.range_start]).fetchone()
        if row is None:
            raise NotFound(f"timestep at session {target.session_id!r} tick {target.range_start} not found")
        return TagTarget(session_id=target.session_id, timestep_id=row[0])
    else:
        row = cur.execute("SELECT 1 FROM session_ticks WHERE session_id = ?", [target.session_id]).fetchone()
        if row is None:
            raise NotFound(f"session {target.session_id!r} not found")
    return target


def tag_dict(row: Row) -> dict[str, Any]:
    rec = dict(zip(TAG_COLUMNS, row))
    rec["created_at"] = rec["created_at"].isoformat() + "Z"
    return rec


def find_tag(cur: duckdb.DuckDBPyConnection, name_or_id: str | int) -> dict[str, Any] | None:
    """The tag a str names or an int identifies. The type decides, never the content: "123" is the
    name "123" (a valid name, which may be created), so a name can never be taken for another tag's id."""
    cols = ", ".join(TAG_COLUMNS)
    if isinstance(name_or_id, bool) or not isinstance(name_or_id, str | int):
        raise InvalidRequest(f"a tag is a name (string) or an id (integer), got {name_or_id!r}", param="tag")
    if isinstance(name_or_id, int):
        if not 0 <= name_or_id <= INT64_MAX:
            raise InvalidRequest(f"a tag id is between 0 and {INT64_MAX}", param="tag")
        row = cur.execute(f"SELECT {cols} FROM tags WHERE id = ?", [name_or_id]).fetchone()
    else:
        row = cur.execute(f"SELECT {cols} FROM tags WHERE name = ?", [name_or_id]).fetchone()
    return tag_dict(row) if row else None


def require_tag(cur: duckdb.DuckDBPyConnection, name_or_id: str | int) -> dict[str, Any]:
    tag = find_tag(cur, name_or_id)
    if tag is None:
        raise NotFound(f"tag {name_or_id!r} not found")
    return tag


def get_or_create_tag(cur: duckdb.DuckDBPyConnection, name_or_id: str | int, *, tag_type: str = "custom",
                      created_by: str = "be", description: str | None = None,
                      concept_id: str | None = None, entity_type: str | None = None) -> dict[str, Any]:
    found = find_tag(cur, name_or_id)
    if found is not None:
        return found
    if isinstance(name_or_id, int):
        raise NotFound(f"tag id {name_or_id} not found")
    name = str(name_or_id).strip()
    if not name:
        raise InvalidRequest("tag name must not be empty")
    kind = TagType(tag_type).value
    status = BudStatus.CANDIDATE.value if kind == "bud" else None
    try:
        cur.execute("INSERT INTO tags (name, tag_type, concept_id, entity_type, bud_status, created_at, created_by, "
                    "description) VALUES (?, ?, ?, ?, ?, now(), ?, ?)",
                    [name, kind, concept_id, entity_type, status, created_by, description])
    except duckdb.ConstraintException:
        pass  # another thread created it first
    return require_tag(cur, name)


def apply_tag(cur: duckdb.DuckDBPyConnection, tag: dict[str, Any], target: TagTarget, *, confidence: float = 1.0,
              source: str = "manual", note: str | None = None) -> dict[str, Any]:
    if not 0.0 <= confidence <= 1.0:
        raise InvalidRequest("confidence must be within [0, 1]")
    if source not in TAG_SOURCES:
        raise InvalidRequest(f"source must be one of {', '.join(TAG_SOURCES)}")
    row = one(cur.execute(
        "INSERT INTO tag_applications (tag_id, session_id, target_type, timestep_id, event_id, range_start, "
        "range_end, confidence, source, created_at, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now(), ?) RETURNING id",
        [tag["id"], target.session_id, target.kind, target.timestep_id, target.event_id, target.range_start,
         target.range_end, confidence, source, note]))
    return {"id": row[0], "tag": tag, "target_type": target.kind, "session_id": target.session_id,
            "timestep_id": target.timestep_id, "event_id": target.event_id, "range_start": target.range_start,
            "range_end": target.range_end, "confidence": confidence, "source": source, "note": note}


def add_comment(cur: duckdb.DuckDBPyConnection, content: str, target: TagTarget) -> dict[str, Any]:
    if not content or not content.strip():
        raise InvalidRequest("comment content must not be empty")
    row = one(cur.execute(
        "INSERT INTO comments (session_id, target_type, timestep_id, event_id, range_start, range_end, content, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, now()) RETURNING id",
        [target.session_id, target.kind, target.timestep_id, target.event_id, target.range_start,
         target.range_end, content]))
    return {"id": row[0], "content": content, "target_type": target.kind, "session_id": target.session_id,
            "timestep_id": target.timestep_id, "event_id": target.event_id, "range_start": target.range_start,
            "range_end": target.range_end}


@reads
def list_comments(cur: duckdb.DuckDBPyConnection, session_id: str | None = None) -> list[dict[str, Any]]:
    cols = ("id", "session_id", "target_type", "timestep_id", "event_id", "range_start", "range_end", "content")
    sql = f"SELECT {', '.join(cols)} FROM comments"
    rows = cur.execute(sql + (" WHERE session_id = ? ORDER BY id" if session_id else " ORDER BY id"),
                       [session_id] if session_id else []).fetchall()
    return [dict(zip(cols, r)) for r in rows]


@reads
def search_tags(cur: duckdb.DuckDBPyConnection, pattern: str | None = None, tag_type: str | None = None,
                bud_status: str | None = None, entity_type: str | None = None,
                limit: int = 100) -> list[dict[str, Any]]:
    """The vocabulary's tags whose name matches `pattern` (a glob: `*` any run, `?` one character; case
    ignored), of a type, a bud status or an entity type, by name, each with its applications' count."""
    if tag_type is not None:
        tag_type = TagType(tag_type).value
    if bud_status is not None:
        bud_status = BudStatus(bud_status).value
    cols = ", ".join("g." + c for c in TAG_COLUMNS)
    rows = cur.execute(
        f"SELECT {cols}, count(a.id) FROM tags g LEFT JOIN tag_applications a ON a.tag_id = g.id "
        "WHERE (? IS NULL OR lower(g.name) GLOB lower(?)) AND (? IS NULL OR g.tag_type = ?) "
        "AND (? IS NULL OR g.bud_status = ?) AND (? IS NULL OR g.entity_type = ?) "
        "GROUP BY ALL ORDER BY lower(any_value(g.name)), any_value(g.name) LIMIT ?",
        [pattern, pattern, tag_type, tag_type, bud_status, bud_status, entity_type, entity_type, limit]).fetchall()
    return [{**tag_dict(r[:-1]), "applications": r[-1]} for r in rows]


@reads
def list_buds(cur: duckdb.DuckDBPyConnection, status: str | None = None) -> list[dict[str, Any]]:
    if status is not None:
        status = BudStatus(status).value
    cols = ", ".join("g." + c for c in TAG_COLUMNS)
    rows = cur.execute(
        f"SELECT {cols}, count(a.id) FROM tags g LEFT JOIN tag_applications a ON a.tag_id = g.id "
        f"WHERE g.tag_type = 'bud' AND (? IS NULL OR g.bud_status = ?) GROUP BY ALL ORDER BY g.id",
        [status, status]).fetchall()
    return [{**tag_dict(r[:-1]), "examples": r[-1]} for r in rows]


def bud_examples(cur: duckdb.DuckDBPyConnection, tag_id: int) -> int:
    return one_int(cur.execute("SELECT count(*) FROM tag_applications WHERE tag_id = ?", [tag_id]))


@writes
def set_bud_status(cur: duckdb.DuckDBPyConnection, audit: AuditEvent | None, name_or_id: str | int,
                   status: str, min_examples: int = BUD_MIN_EXAMPLES) -> dict[str, Any]:
    """Make a tag a bud (a candidate) or move a bud along its life (`BUD_MOVES`); READY needs
    `min_examples` examples. A move the life does not allow is a Conflict naming the ones it does. The
    rewrite is chained in the audit log with what it replaced."""
    status = BudStatus(status).value
    tag = require_tag(cur, name_or_id)
    current = tag["bud_status"] if tag["tag_type"] == "bud" else None
    if current != status and status not in BUD_MOVES[current]:
        allowed = ", ".join(sorted(BUD_MOVES[current])) or "none (it is settled by its submission)"
        raise Conflict(f"bud {tag['name']!r} is {current or 'not a bud'}: it may become {allowed}, not {status}",
                       param="status")
    if status == "ready" and (examples := bud_examples(cur, tag["id"])) < min_examples:
        raise Conflict(f"bud {tag['name']!r} has {examples} examples; ready needs {min_examples} "
                       "(xdb.bud_min_examples)", param="status")
    if (tag["tag_type"], tag["bud_status"]) != ("bud", status):
        with transaction(cur):
            cur.execute("UPDATE tags SET tag_type = 'bud', bud_status = ? WHERE id = ?", [status, tag["id"]])
            if audit is not None:
                audit("rewrite_tag", {"tag_id": tag["id"], "name": tag["name"],
                                      "from": {"tag_type": tag["tag_type"], "bud_status": tag["bud_status"]},
                                      "to": {"tag_type": "bud", "bud_status": status}})
    return require_tag(cur, tag["id"])


def register_concepts(cur: duckdb.DuckDBPyConnection, concepts: list[dict[str, Any]], source: str,
                      audit: AuditEvent | None = None) -> None:
    """A lens pack's concepts ({"id", "name", "parent", "threshold"}): one concept tag each (named by
    the id, the display name as its description), their place in the hierarchy, and the activation at
    which a token is tagged automatically (none: never). Idempotent; a newer pack's values replace an
    older one's, and each replacement is chained in the audit log."""
    for concept in concepts:
        get_or_create_tag(cur, concept["id"], tag_type="concept", created_by=source,
                          description=concept["name"], concept_id=concept["id"])
        threshold = concept.get("threshold")
        new = (concept["name"], concept.get("parent"), source, None if threshold is None else float(threshold))
        old = cur.execute("SELECT display_name, parent, source, threshold FROM concept_hierarchy WHERE concept = ?",
                          [concept["id"]]).fetchone()
        with transaction(cur):
            cur.execute("INSERT OR REPLACE INTO concept_hierarchy (concept, display_name, parent, source, updated_at, "
                        "threshold) VALUES (?, ?, ?, ?, now(), ?)", [concept["id"], *new])
            if old is not None and tuple(old) != new and audit is not None:
                keys = ("display_name", "parent", "source", "threshold")
                audit("rewrite_concept_hierarchy", {"concept": concept["id"], "from": dict(zip(keys, old)),
                                                    "to": dict(zip(keys, new))})


def list_concepts(cur: duckdb.DuckDBPyConnection, query: str | None = None) -> list[dict[str, Any]]:
    """Concepts seen in activations, with any concept tag that names them, then concept tags not yet
    seen; each with its display name, parent and children where a lens pack registered them."""
    rows = cur.execute(
        "SELECT c.id, c.name, g.id FROM concepts c LEFT JOIN tags g ON g.tag_type = 'concept' "
        "AND (g.concept_id = c.name OR g.name = c.name) WHERE (? IS NULL OR c.name ILIKE '%' || ? || '%') "
        "ORDER BY c.name", [query, query]).fetchall()
    seen = [{"id": cid, "name": name, "tag_id": tag_id} for cid, name, tag_id in rows]
    names = {c["name"] for c in seen}
    extra = cur.execute(
        "SELECT id, coalesce(concept_id, name) FROM tags WHERE tag_type = 'concept' "
        "AND (? IS NULL OR name ILIKE '%' || ? || '%') ORDER BY name", [query, query]).fetchall()
    found = seen + [{"id": None, "name": name, "tag_id": tid} for tid, name in extra if name not in names]
    hierarchy = {concept: (display, parent, threshold) for concept, display, parent, threshold in
                 cur.execute("SELECT concept, display_name, parent, threshold FROM concept_hierarchy").fetchall()}
    children: dict[str, list[str]] = {}
    for concept, (_, parent, _) in sorted(hierarchy.items()):
        if parent is not None:
            children.setdefault(parent, []).append(concept)
    for c in found:
        display, parent, threshold = hierarchy.get(c["name"], (None, None, None))
        c.update(display_name=display, parent=parent, children=children.get(c["name"], []),
                 auto_tag_threshold=threshold)
    return found
