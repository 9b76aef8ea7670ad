"""Reading across rows rather than row by row: the tokens that surprised (their top activation far from
the session's running mean up to them), and the concepts that light up together."""

from __future__ import annotations

from typing import Any

import duckdb

from core.errors import NotFound
from xdb.concepts import ConceptIndex
from xdb.owner import owned

# Each output token's top activation against the mean and spread of every earlier token's in its
# session (a running z-score), largest deviations first. The first few tokens of a session have no
# spread to measure against and are left out.
SURPRISING = """
    WITH top AS (
        SELECT id, tick, content, list_max(concept_values) AS v,
               concept_ids[list_position(concept_values, list_max(concept_values))] AS cid
        FROM timesteps WHERE session_id = ? AND event_type = 'output' AND concept_values IS NOT NULL),
    running AS (
        SELECT *, avg(v) OVER w AS mean, stddev_samp(v) OVER w AS sd, count(v) OVER w AS seen
        FROM top WINDOW w AS (ORDER BY tick ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))
    SELECT id, tick, content, cid, v, mean, sd, (v - mean) / sd AS z FROM running
    WHERE seen >= ? AND sd > 0 AND v IS NOT NULL
    ORDER BY abs(z) DESC, id LIMIT ?"""

MIN_HISTORY = 8


def surprising(cur: duckdb.DuckDBPyConnection, session_id: str, concepts: ConceptIndex,
               limit: int = 20) -> list[dict[str, Any]]:
    """The session's output tokens whose top activation deviates most from its running mean."""
    if cur.execute("SELECT 1 FROM session_ticks WHERE session_id = ?", [session_id]).fetchone() is None:
        raise NotFound(f"session {session_id!r} not found")
    rows = cur.execute(SURPRISING, [session_id, MIN_HISTORY, limit]).fetchall()
    return [{"timestep_id": tid, "tick": tick, "content": content, "concept": concepts.name_of(cid),
             "activation": v, "running_mean": mean, "running_sd": sd, "z": z}
            for tid, tick, content, cid, v, mean, sd, z in rows]


RELATED = """
    SELECT u.cid, count(*) AS together, avg(u.v) AS mean_activation FROM (
        SELECT unnest(concept_ids) AS cid, unnest(concept_values) AS v FROM timesteps
        WHERE array_contains(concept_ids, ?) AND (? IS NULL OR session_id = ?)
          AND {owned}) u
    WHERE u.cid IS NOT NULL AND u.cid != ?
    GROUP BY u.cid ORDER BY together DESC, mean_activation DESC, u.cid LIMIT ?"""


def related_concepts(cur: duckdb.DuckDBPyConnection, concept: str, concepts: ConceptIndex, limit: int = 10,
                     session_id: str | None = None, *, owner: str) -> list[dict[str, Any]]:
    """The concepts most often in the same tokens' top-k as `concept`, with how often and how strongly."""
    cid = concepts.id_of(concept)
    if cid is None:
        raise NotFound(f"concept {concept!r} has not been seen")
    condition, owner_params = owned("session_id", owner)
    rows = cur.execute(RELATED.format(owned=condition), [cid, session_id, session_id, *owner_params, cid, limit]
                       ).fetchall()
    total = cur.execute("SELECT count(*) FROM timesteps WHERE array_contains(concept_ids, ?) "
                        f"AND (? IS NULL OR session_id = ?) AND {condition}",
                        [cid, session_id, session_id, *owner_params]).fetchone()
    seen = int(total[0]) if total else 0
    return [{"concept": concepts.name_of(other), "together": int(n), "share": n / seen if seen else 0.0,
             "mean_activation": float(mean)} for other, n, mean in rows]
