"""Cluster-wide reads over the lake: recall, concepts, tags, every replica's audit chain, and what a
replica needs to resume a session another one served (its newest State, its last tick).

Ids are per replica, so a row is named by (replica, id) and every result carries `replica`. A tick
range or a reply (request id) is the session's, whichever replica recorded it; a tag or comment on
one timestep names it by id, so only within its own replica. Concept ids are per replica too: a
concept filter is resolved to each replica's id for the name.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import duckdb

from xdb.audit.chain import GENESIS, RECORD_COLUMNS, Rehash, concept_hash
from xdb.audit.verify import AuditReport
from xdb.concepts import ConceptIndex
from xdb.recall.recall import COLUMNS, RecallFilterError, RecallFilters, _double, _strings, conditions
from xdb.schema import TOP_K
from xdb.session_state import StateVersion
from xdb.sql import Row, one, string_literal

LAKE_COLUMNS = ("replica", *COLUMNS)
VERIFY_CHUNK = 200_000


@dataclass
class NameCache:
    """(replica, id) -> name of concepts and tags: fixed once a replica has recorded them, so a lake
    reader keeps them between calls and reads only a replica with an id it has not seen."""

    concepts: dict[tuple[str, int], str] = field(default_factory=dict)
    tags: dict[tuple[str, int], str] = field(default_factory=dict)


# -- recall -------------------------------------------------------------------------------------------
def _concept_terms(cur: duckdb.DuckDBPyConnection, a: str, f: RecallFilters) -> tuple[list[str], str] | None:
    """WHERE terms for the concept filter, resolved to each replica's id for the name, and the SQL of
    the activation the bounds compare (None: no replica knows the concept)."""
    pairs = cur.execute(f"SELECT DISTINCT replica, id FROM {a}.concepts WHERE name = ? ORDER BY 1",
                        [f.concept]).fetchall()
    if not pairs:
        return None
    value = "CASE " + " ".join(f"WHEN t.replica = {string_literal(r)} THEN array_extract(t.concept_values, "
                               f"array_position(t.concept_ids, {int(cid)}))" for r, cid in pairs) + " END"
    where = []
    if f.min_activation is None and f.max_activation is None:
        present = [f"(t.replica = {string_literal(r)} AND array_contains(t.concept_ids, {int(cid)}))"
                   for r, cid in pairs]
        where.append("(" + " OR ".join(present) + ")")
    if f.min_activation is not None:
        where.append(f"{value} >= {_double(f.min_activation)}")
    if f.max_activation is not None:
        where.append(f"{value} <= {_double(f.max_activation)}")
    return where, value


def _tag_ids(cur: duckdb.DuckDBPyConnection, a: str, names: list[str]) -> list[tuple[str, int]]:
    params: list[Any] = []
    sql = f"SELECT DISTINCT replica, id FROM {a}.tags WHERE name IN ({_strings(names, params)}) ORDER BY 1, 2"
    return [(str(r), int(i)) for r, i in cur.execute(sql, params).fetchall()]


def build_lake_query(cur: duckdb.DuckDBPyConnection, a: str, f: RecallFilters,
                     owner: str) -> tuple[str, list[Any]] | None:
    """SQL and parameters for the matching rows of every replica, oldest first (created_at, then
    replica and id); None when nothing can match (an unknown concept or tag)."""
    if f.after_id is not None:
        raise RecallFilterError("after_id", "ids are per replica in the lake: page with offset instead")
    local = f if f.concept is None else f.model_copy(update={"concept": None, "min_activation": None,
                                                              "max_activation": None})
    found = conditions(local, ConceptIndex([]), owner)
    if found is None:
        return None
    where, params = found
    if f.concept is not None:
        terms = _concept_terms(cur, a, f)
        if terms is None:
            return None
        where += terms[0]
    where.append(f"NOT EXISTS (SELECT 1 FROM {a}.session_tombstones d WHERE d.session_id = t.session_id "
                 "AND d.deleted_at >= t.created_at)")
    sql_where = " WHERE " + " AND ".join(where)
    cols = ", ".join(f"t.{c}" for c in LAKE_COLUMNS)
    page = f"ORDER BY created_at, replica, id LIMIT {f.limit}" + (f" OFFSET {int(f.offset)}" if f.offset else "")
    if not f.tags:
        return f"SELECT {cols} FROM {a}.timesteps t{sql_where} {page}", params
    tag_ids = _tag_ids(cur, a, f.tags)
    if not tag_ids:
        return None
    chosen = "(VALUES " + ", ".join(f"({string_literal(r)}, {i})" for r, i in tag_ids) + ") g(replica, id)"
    apps = (f"SELECT {{cols}} FROM {a}.tag_applications x JOIN {chosen} ON x.replica = g.replica AND x.tag_id = g.id "
            "WHERE x.target_type = '{kind}'")
    joins = [
        (apps.format(cols="x.replica, x.timestep_id", kind="timestep"),
         "t.replica = s.replica AND t.id = s.timestep_id"),
        (apps.format(cols="x.session_id, x.event_id", kind="event"),
         "t.request_id = s.event_id AND t.session_id = s.session_id"),
        (apps.format(cols="x.session_id, x.range_start, x.range_end", kind="range"),
         "t.session_id = s.session_id AND t.tick BETWEEN s.range_start AND s.range_end"),
    ]
    branches = [f"SELECT {cols} FROM {a}.timesteps t SEMI JOIN ({sub}) s ON {on}{sql_where}" for sub, on in joins]
    return f"SELECT * FROM ({' UNION '.join(branches)}) {page}", params * len(branches)


def _names(cur: duckdb.DuckDBPyConnection, a: str, table: str, wanted: set[tuple[str, int]],
           cache: dict[tuple[str, int], str]) -> dict[tuple[str, int], str]:
    """`cache` with the names of the (replica, id) pairs wanted: the replicas with one not cached are read."""
    missing = sorted({replica for replica, i in wanted if (replica, i) not in cache})
    if missing:
        params: list[Any] = []
        found = cur.execute(f"SELECT DISTINCT replica, id, name FROM {a}.{table} WHERE replica IN "
                            f"({_strings(missing, params)})", params).fetchall()
        cache.update({(r, int(i)): name for r, i, name in found})
    return cache


def _annotations(cur: duckdb.DuckDBPyConnection, a: str, rows: list[Row], tag_names: dict[tuple[str, int], str]
                 ) -> tuple[dict[tuple[str, int], list[str]], dict[tuple[str, int], list[dict[str, Any]]]]:
    """Tag names and comments per recalled row: on it (same replica and id), on its reply, or on a
    tick range of its session (whichever replica applied them)."""
    if not rows:
        return {}, {}
    params: list[Any] = []
    sessions = _strings(sorted({r[2] for r in rows}), params)
    found = cur.execute(f"""
        SELECT replica, target_type, timestep_id, event_id, session_id, range_start, range_end, tag_id
        FROM {a}.tag_applications WHERE session_id IN ({sessions}) OR session_id IS NULL""", params).fetchall()
    names = _names(cur, a, "tags", {(x[0], int(x[7])) for x in found}, tag_names)
    apps = [(*x[:7], names[(x[0], int(x[7]))]) for x in found if (x[0], int(x[7])) in names]
    notes = cur.execute(f"""
        SELECT replica, target_type, timestep_id, event_id, session_id, range_start, range_end, id, content, created_at
        FROM {a}.comments WHERE session_id IN ({sessions}) ORDER BY created_at, replica, id""", params).fetchall()
    tags: dict[tuple[str, int], set[str]] = {}
    comments: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        replica, tid, session_id, tick, request_id = row[0], row[1], row[2], row[3], row[8]

        def hits(kind: str, rep: str, timestep_id: Any, event_id: Any, sid: Any, start: Any, end: Any) -> bool:
            return bool((kind == "timestep" and rep == replica and timestep_id == tid)  # noqa: B023
                        or (kind == "event" and event_id is not None and event_id == request_id  # noqa: B023
                            and sid == session_id)  # noqa: B023
                        or (kind == "range" and sid == session_id and start <= tick <= end))  # noqa: B023
        for rep, kind, timestep_id, event_id, sid, start, end, name in apps:
            if hits(kind, rep, timestep_id, event_id, sid, start, end):
                tags.setdefault((replica, tid), set()).add(name)
        for rep, kind, timestep_id, event_id, sid, start, end, cid, content, at in notes:
            if hits(kind, rep, timestep_id, event_id, sid, start, end):
                comments.setdefault((replica, tid), []).append(
                    {"replica": rep, "id": cid, "content": content, "created_at": at.isoformat() + "Z"})
    return {k: sorted(v) for k, v in tags.items()}, comments


def lake_recall(cur: duckdb.DuckDBPyConnection, a: str, f: RecallFilters, owner: str,
                cache: NameCache | None = None) -> list[dict[str, Any]]:
    """Timesteps of every replica matching the filters (as `XDB.recall` takes them, less `after_id`),
    oldest first, each with its `replica`, concept activations, tags and comments."""
    cache = cache or NameCache()
    query = build_lake_query(cur, a, f, owner)
    if query is None:
        return []
    rows = cur.execute(*query).fetchall()
    names = _names(cur, a, "concepts", {(r[0], int(c)) for r in rows for c in (r[9] or ()) if c is not None},
                   cache.concepts)
    tags, comments = _annotations(cur, a, rows, cache.tags)
    out = []
    for row in rows:
        rec = dict(zip(LAKE_COLUMNS, row))
        ids, values = rec.pop("concept_ids"), rec.pop("concept_values")
        rec["concept_activations"] = {names.get((rec["replica"], c), str(c)): v
                                      for c, v in zip(ids or (), values or ()) if c is not None}
        rec["created_at"] = rec["created_at"].isoformat() + "Z"
        rec["metadata"] = json.loads(rec["metadata"]) if rec["metadata"] else None
        rec["tags"] = tags.get((rec["replica"], rec["id"]), [])
        rec["comments"] = comments.get((rec["replica"], rec["id"]), [])
        out.append(rec)
    return out


# -- concepts and tags ---------------------------------------------------------------------------
def lake_concepts(cur: duckdb.DuckDBPyConnection, a: str, query: str | None = None) -> list[dict[str, Any]]:
    """Every concept some replica has recorded or registered (name contains `query`), with the newest
    registration's display name, parent and threshold, and the replicas that know it."""
    rows = cur.execute(f"""
        WITH seen AS (SELECT name, list(DISTINCT replica ORDER BY replica) AS replicas FROM {a}.concepts GROUP BY name),
        latest AS (SELECT concept, arg_max(display_name, (updated_at, shipped_at)) AS display_name,
                          arg_max(parent, (updated_at, shipped_at)) AS parent,
                          arg_max(threshold, (updated_at, shipped_at)) AS threshold,
                          list(DISTINCT replica ORDER BY replica) AS replicas
                   FROM {a}.concept_hierarchy GROUP BY concept)
        SELECT coalesce(s.name, h.concept) AS name, h.display_name, h.parent, h.threshold,
               list_sort(list_distinct(list_concat(coalesce(s.replicas, []), coalesce(h.replicas, []))))
        FROM seen s FULL OUTER JOIN latest h ON h.concept = s.name
        WHERE ? IS NULL OR coalesce(s.name, h.concept) ILIKE '%' || ? || '%'
        ORDER BY 1""", [query, query]).fetchall()
    return [{"name": name, "display_name": display, "parent": parent, "auto_tag_threshold": threshold,
             "replicas": replicas} for name, display, parent, threshold, replicas in rows]


def lake_tags(cur: duckdb.DuckDBPyConnection, a: str, tag_type: str | None = None) -> list[dict[str, Any]]:
    """Every tag name in the lake (of `tag_type`), with each replica's tag of that name (its newest
    version) and how many applications it has there."""
    rows = cur.execute(f"""
        WITH latest AS (SELECT replica, id, arg_max(name, shipped_at) AS name,
                               arg_max(tag_type, shipped_at) AS tag_type, arg_max(bud_status, shipped_at) AS bud_status,
                               arg_max(concept_id, shipped_at) AS concept_id,
                               arg_max(description, shipped_at) AS description
                        FROM {a}.tags GROUP BY replica, id),
        apps AS (SELECT replica, tag_id, count(*) AS n FROM {a}.tag_applications GROUP BY ALL)
        SELECT l.name, l.replica, l.id, l.tag_type, l.bud_status, l.concept_id, l.description, coalesce(p.n, 0)
        FROM latest l LEFT JOIN apps p ON p.replica = l.replica AND p.tag_id = l.id
        WHERE ? IS NULL OR l.tag_type = ? ORDER BY l.name, l.replica""", [tag_type, tag_type]).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for name, replica, tid, kind, status, concept_id, description, n in rows:
        tag = out.setdefault(name, {"name": name, "applications": 0, "replicas": []})
        tag["applications"] += int(n)
        tag["replicas"].append({"replica": replica, "id": tid, "tag_type": kind, "bud_status": status,
                                "concept_id": concept_id, "description": description, "applications": int(n)})
    return list(out.values())


# -- resuming a session ------------------------------------------------------------------------------
def tombstoned_at(cur: duckdb.DuckDBPyConnection, a: str, session_id: str) -> dt.datetime | None:
    """When any replica last deleted the session (None: never)."""
    found = one(cur.execute(f"SELECT max(deleted_at) FROM {a}.session_tombstones WHERE session_id = ?",
                            [session_id]))[0]
    return found if isinstance(found, dt.datetime) else None


def newest_state(cur: duckdb.DuckDBPyConnection, a: str, session_id: str,
                 after: dt.datetime | None = None) -> tuple[StateVersion | None, int]:
    """The session's newest intact State in the lake, of whichever replica (by created_at, then
    version), saved after `after` (a deletion), and how many newer ones failed their SHA-256 check."""
    rows = cur.execute(f"SELECT replica, version, state_json, sha256, created_at FROM {a}.session_states "
                       "WHERE session_id = ? AND created_at > ? ORDER BY created_at DESC, version DESC, replica",
                       [session_id, after or dt.datetime.min]).fetchall()
    for skipped, (replica, version, state_json, digest, created_at) in enumerate(rows):
        if hashlib.sha256(state_json.encode()).hexdigest() == digest:
            return StateVersion(int(version), state_json, created_at, replica), skipped
    return None, len(rows)


def last_tick(cur: duckdb.DuckDBPyConnection, a: str, session_id: str) -> int:
    """The largest tick any replica has shipped for the session (-1: none)."""
    found = one(cur.execute(f"SELECT max(last_tick) FROM {a}.session_ticks WHERE session_id = ?", [session_id]))[0]
    return -1 if found is None else int(found)


# -- the audit chains ----------------------------------------------------------------------------------
def verify_lake_audit(cur: duckdb.DuckDBPyConnection, a: str, chunk: int = VERIFY_CHUNK) -> dict[str, AuditReport]:
    """Every replica's audit chain as shipped to the lake: its concept chain, then each record's hash
    recomputed from its fields (xdb/audit/chain.py's canonical bytes and steps, `Rehash`) from seq 0 on, so an
    edited, removed, reordered or inserted record is named; a batch shipped in part (its head not in the lake
    yet) is checked once it is whole. One report per replica."""
    found = cur.execute(f"SELECT DISTINCT replica FROM {a}.audit_records "
                        f"UNION SELECT DISTINCT replica FROM {a}.audit_concepts ORDER BY 1").fetchall()
    replicas = [r for (r,) in found]
    return {replica: _verify_replica(cur, a, replica, chunk) for replica in replicas}


def _verify_replica(cur: duckdb.DuckDBPyConnection, a: str, replica: str, chunk: int) -> AuditReport:
    prev = GENESIS
    concepts = cur.execute(f"SELECT id, name, prev_hash, hash FROM {a}.audit_concepts WHERE replica = ? "
                           "ORDER BY id, hash", [replica]).fetchall()
    for i, (cid, name, stored_prev, stored) in enumerate(concepts):
        if cid != i:
            return AuditReport(False, 0, f"replica {replica!r} audit concept id={cid}: expected id {i} "
                                         "(a concept was deleted or inserted)")
        h = concept_hash(prev, cid, name)
        if bytes(stored_prev) != prev or bytes(stored) != h:
            return AuditReport(False, 0, f"replica {replica!r} audit concept id={cid} ({name!r}): "
                                         "hash mismatch (edited)")
        prev = h
    last = one(cur.execute(f"SELECT max(seq) FROM {a}.audit_records WHERE replica = ?", [replica]))[0]
    end = -1 if last is None else int(last)
    cols = ", ".join(f"CAST({c} AS {'INTEGER' if c == 'concept_ids' else 'FLOAT'}[{TOP_K}]) AS {c}"
                     if c in ("concept_ids", "concept_values") else c for c in RECORD_COLUMNS)
    have = {c for (c,) in cur.execute("SELECT column_name FROM duckdb_columns() WHERE database_name = ? "
                                      "AND table_name = 'audit_records'", [a]).fetchall()}
    leaf = ", leaf" if "leaf" in have else ""  # a lake older than batch hashing holds no batched record
    leaf += ", activation_root" if "activation_root" in have else ""
    leaf += ", hidden_digest" if "hidden_digest" in have else ""  # the values stay in each replica's own log
    rehash, expected = Rehash(GENESIS), 0
    while expected <= end:
        hi = min(expected + chunk - 1, end)
        batch = cur.execute(f"SELECT {cols}, prev_hash, record_hash{leaf} FROM {a}.audit_records WHERE replica = ? "
                            f"AND seq BETWEEN {expected} AND {hi} ORDER BY seq, record_hash",
                            [replica]).to_arrow_table()
        seqs = batch.column("seq").to_pylist()
        for seq in seqs:
            if seq != expected:
                what = "appears twice (inserted or shipped twice)" if seq < expected else "missing (deleted)"
                return AuditReport(False, rehash.checked, f"replica {replica!r} audit record "
                                                          f"seq={expected - 1 if seq < expected else expected}: {what}")
            expected += 1
        if expected <= hi:
            return AuditReport(False, rehash.checked,
                               f"replica {replica!r} audit record seq={expected}: missing (deleted)")
        problem = rehash.feed(batch)
        if problem is not None:
            return AuditReport(False, rehash.checked,
                               f"replica {replica!r} audit record seq={problem[0]}: {problem[1]}")
    # A batch whose head is not in the lake yet (shipped in part) is left for a later verification.
    return AuditReport(True, rehash.checked)


def check_lake_anchor(cur: duckdb.DuckDBPyConnection, a: str, replica: str,
                      heads: list[tuple[int, bytes]]) -> AuditReport:
    """The replica's chain in the lake against the heads its own audit log anchored (DATA_DIR/audit/
    audit.head): the newest head the lake has shipped past must be the lake's record hash at that seq.
    Recomputed from genesis alone, a lake chain rewritten as a whole verifies; against the replica's own
    head it cannot (every hash from an edit on differs, and the head file is out of the lake's reach)."""
    last = one(cur.execute(f"SELECT max(seq) FROM {a}.audit_records WHERE replica = ?", [replica]))[0]
    if last is None:
        return AuditReport(False, 0, f"replica {replica!r} has no audit records in the lake")
    shipped = [(seq, head) for seq, head in heads if seq <= int(last)]
    if not shipped:
        return AuditReport(True, 0)  # the lake holds less than the first anchored checkpoint: nothing to compare
    seq, head = shipped[-1]
    row = cur.execute(f"SELECT record_hash FROM {a}.audit_records WHERE replica = ? AND seq = ?",
                      [replica, seq]).fetchone()
    if row is None or bytes(row[0]) != head:
        return AuditReport(False, 0, f"replica {replica!r} audit record seq={seq}: the lake's chain differs from "
                                     "the replica's own anchored head (audit.head): rewritten in the lake")
    return AuditReport(True, seq + 1)


def newer(local: StateVersion | None, lake: StateVersion | None) -> StateVersion | None:
    """The newer of a session's local and lake States (by created_at, then version); the local one on a tie."""
    if lake is None:
        return local
    if local is None:
        return lake
    return lake if (lake.created_at, lake.version) > (local.created_at, local.version) else local

