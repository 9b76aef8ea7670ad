"""What the experience browser reads: sessions at a glance, a session turn by turn, and the tokens that
lit a concept most.

A turn is recorded by the server as one `system` row after its reply (metadata `{"turn": {...}}`: the
cache report with the engine's usage), so a session's turns are the tick ranges between those rows, and
listing sessions reads only those rows, never the tokens themselves.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
from typing import Any

import duckdb

from core.errors import NotFound
from xdb.concepts import ConceptIndex
from xdb.interface import reads
from xdb.owner import owned_named

TURN_ROWS = "event_type = 'system' AND starts_with(metadata, '{\"turn\":')"
# A message row's text past this is cut in a turn listing (the row itself stays whole in recall).
CONTENT_CHARS = 4000
SEPARATOR = "/"  # a tenant's sessions are stored under `tenant/`


def iso(at: dt.datetime | None) -> str | None:
    """A stored (UTC) time as the API writes it."""
    return None if at is None else at.isoformat() + "Z"


def tenant_of(session_id: str) -> str:
    head, sep, _ = session_id.partition(SEPARATOR)
    return head if sep else "default"


# A turn record that is a side call of its session, not one of its turns (orchestrator/named_sessions.py):
# reported as one, or offering no tools where the session's last turn offered some (a side call an agent
# sent before its first turn). Over `t` (turn records, `m` their report) joined with `main`.
MAIN_THREADS = """main AS (
        SELECT session_id,
               arg_max(m ->> 'thread', tick) FILTER (WHERE coalesce(m ->> 'session_naming', '') <> 'side') AS thread
        FROM t GROUP BY session_id)"""
SIDE = ("(coalesce(m ->> 'session_naming', '') = 'side' "
        "OR (coalesce(m ->> 'thread', '-') = '' AND coalesce(main.thread, '') <> ''))")


def is_side(report: dict[str, Any], main_thread: str | None) -> bool:
    """SIDE, for one turn record's report."""
    return report.get("session_naming") == "side" or (report.get("thread") == "" and bool(main_thread))


OVERVIEW = f"""
    WITH t AS (
        SELECT session_id, tick, created_at, CAST(metadata AS JSON) -> 'turn' AS m FROM timesteps
        WHERE {TURN_ROWS} AND {owned_named('session_id')}),
    {MAIN_THREADS},
    agg AS (
        SELECT session_id, count(*) FILTER (WHERE NOT {SIDE}) AS turns, sum((m ->> 'prompt_tokens')::BIGINT) AS prompt,
               sum((m ->> 'cached_tokens')::BIGINT) AS cached, sum((m ->> 'completion_tokens')::BIGINT) AS generated,
               max(created_at) AS last_at, arg_max(m ->> 'mode', tick) AS mode
        FROM t JOIN main USING (session_id) GROUP BY session_id),
    win AS (
        SELECT session_id, bool_or(pinned) AS pinned, bool_or(len(submission_ids) > 0) AS submitted
        FROM time_windows WHERE {owned_named('session_id')} GROUP BY session_id)
    SELECT s.session_id, s.last_tick, agg.turns, agg.prompt, agg.cached, agg.generated, agg.last_at, agg.mode,
           win.pinned, win.submitted
    FROM session_ticks s LEFT JOIN agg USING (session_id) LEFT JOIN win USING (session_id)
    WHERE {owned_named('s.session_id')} AND ($q IS NULL OR contains(s.session_id, $q))
    ORDER BY agg.last_at DESC NULLS LAST, s.session_id LIMIT $limit"""


@reads
def sessions_overview(cur: duckdb.DuckDBPyConnection, owner: str, limit: int = 200,
                      query: str | None = None) -> list[dict[str, Any]]:
    """Sessions (one tenant's: `owner`, xdb/owner.py), the most recently active first: turns,
    tokens, cache hit ratio, last activity, the last turn's mode, pinned or submitted windows."""
    rows = cur.execute(OVERVIEW, {"owner": owner, "q": query, "limit": limit}).fetchall()
    out = []
    for sid, last_tick, turns, prompt, cached, generated, last_at, mode, pinned, submitted in rows:
        out.append({"session_id": sid, "tenant": tenant_of(sid), "last_tick": last_tick, "turns": turns or 0,
                    "prompt_tokens": int(prompt or 0), "cached_tokens": int(cached or 0),
                    "generated_tokens": int(generated or 0),
                    "hit_ratio": (cached or 0) / prompt if prompt else None, "last_activity": iso(last_at),
                    "mode": mode, "pinned": bool(pinned), "submitted": bool(submitted)})
    _fill_untracked(cur, [r for r in out if not r["turns"]])
    return out


@reads
def session_context(cur: duckdb.DuckDBPyConnection, session_id: str) -> dict[str, Any]:
    """Where a session stands, from its last turn's record: each block's tokens, the mode, the prompt
    and the share of it read from the cache; with its turns and compactions so far."""
    row = cur.execute(f"""
        SELECT (SELECT metadata FROM timesteps WHERE session_id = $sid AND {TURN_ROWS} ORDER BY tick DESC LIMIT 1),
               (SELECT max(created_at) FROM timesteps WHERE session_id = $sid AND {TURN_ROWS}),
               (SELECT count(*) FROM timesteps WHERE session_id = $sid AND {TURN_ROWS}),
               (SELECT count(*) FROM compaction_records WHERE session_id = $sid),
               EXISTS (SELECT 1 FROM session_ticks WHERE session_id = $sid)""", {"sid": session_id}).fetchone()
    assert row is not None
    meta, last_at, turns, compactions, known = row
    if not known:
        raise NotFound(f"session {session_id!r} not found")
    turn = json.loads(meta)["turn"] if meta else {}
    prompt, cached = turn.get("prompt_tokens"), turn.get("cached_tokens")
    return {"turns": int(turns), "compactions": int(compactions), "last_turn_at": iso(last_at),
            "mode": turn.get("mode"), "blocks": {b["name"]: b["tokens"] for b in turn.get("blocks", [])},
            "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": cached / prompt if prompt and cached is not None else None}


def _fill_untracked(cur: duckdb.DuckDBPyConnection, sessions: list[dict[str, Any]]) -> None:
    """Sessions without turn records (raw completions, imported rows): their tokens and last activity
    from the rows themselves, for this page's sessions only."""
    if not sessions:
        return
    by_id = {s["session_id"]: s for s in sessions}
    rows = cur.execute("""SELECT session_id, max(created_at), count(*) FILTER (WHERE event_type = 'output')
                          FROM timesteps WHERE session_id IN (SELECT unnest($ids)) GROUP BY session_id""",
                       {"ids": list(by_id)}).fetchall()
    for sid, last_at, generated in rows:
        by_id[sid]["last_activity"] = iso(last_at)
        by_id[sid]["generated_tokens"] = int(generated)


def break_reason(turn: dict[str, Any], previous: dict[str, Any] | None) -> str | None:
    """Why the prefix cache broke at this turn's first changed block, from the two turns' reports."""
    if previous is None:
        cached = turn.get("cached_tokens") or 0
        return f"first turn: {cached} tokens read from a prefix already cached" if cached else \
            "first turn: nothing cached yet"
    block = turn.get("first_changed_block")
    if block is None:
        return None
    if block == "replica":
        return "the session moved here from another replica, whose cache holds its prefix"
    if turn.get("compactions"):
        return "the State was compacted"
    if previous.get("mode") != turn.get("mode"):
        return f"mode {previous.get('mode')} → {turn.get('mode')}"
    before = {b["name"]: b for b in previous.get("blocks", [])}
    now = {b["name"]: b for b in turn.get("blocks", [])}
    if block not in now:
        return f"{block} block left the prompt"
    if block not in before:
        return f"{block} block added"
    a, b = before[block]["tokens"], now[block]["tokens"]
    if a != b:
        return f"{block} {'grew' if b > a else 'shrank'}: {a} → {b} tokens"
    return f"{block} text changed ({b} tokens)"


@reads
def session_turns(cur: duckdb.DuckDBPyConnection, session_id: str) -> dict[str, Any]:
    """A session turn by turn: each turn's tick range, cache report, usage and why the cache broke, its
    reply (the generated tokens' text, None for a turn that generated none), with its message-level rows
    (inputs, tool calls and results, governor events) and compactions."""
    if cur.execute("SELECT 1 FROM session_ticks WHERE session_id = ?", [session_id]).fetchone() is None:
        raise NotFound(f"session {session_id!r} not found")
    turn_rows = cur.execute(f"""SELECT id, tick, created_at, metadata FROM timesteps
                                WHERE session_id = ? AND {TURN_ROWS} ORDER BY tick""", [session_id]).fetchall()
    messages = cur.execute(f"""
        SELECT id, tick, event_type, role, left(content, {CONTENT_CHARS}), length(content) > {CONTENT_CHARS},
               metadata, created_at
        FROM timesteps WHERE session_id = ? AND event_type <> 'output' AND NOT ({TURN_ROWS})
        ORDER BY tick""", [session_id]).fetchall()
    # Each turn's reply: its output rows (one a token) joined, cut as a message row's text is.
    replies = dict(cur.execute(f"""
        WITH turn AS (SELECT tick AS tick_to, coalesce(lag(tick) OVER (ORDER BY tick), -1) + 1 AS tick_from
                      FROM timesteps WHERE session_id = $sid AND {TURN_ROWS})
        SELECT turn.tick_to, left(string_agg(o.content, '' ORDER BY o.tick), {CONTENT_CHARS})
        FROM turn JOIN timesteps o ON o.session_id = $sid AND o.event_type = 'output'
                                      AND o.tick BETWEEN turn.tick_from AND turn.tick_to
        GROUP BY turn.tick_to""", {"sid": session_id}).fetchall())
    compactions = cur.execute("""SELECT id, created_at, range_start, range_end, tokens_before, tokens_after,
                                        trigger, summary FROM compaction_records WHERE session_id = ? ORDER BY id""",
                              [session_id]).fetchall()
    turns: list[dict[str, Any]] = []
    reports = [json.loads(meta)["turn"] for _, _, _, meta in turn_rows]
    main = next((r.get("thread") for r in reversed(reports) if r.get("session_naming") != "side"), None)
    start, previous, index = 0, {False: None, True: None}, 0  # a side call's reason is against the last side call
    for (row_id, tick, at, _), report in zip(turn_rows, reports):
        side = is_side(report, main)
        index += not side
        turns.append({"index": None if side else index, "side": side, "row_id": row_id, "tick_from": start,
                      "tick_to": tick, "created_at": iso(at), **report,
                      "reason": break_reason(report, previous[side]), "reply": replies.get(tick),
                      "events": [], "compactions": []})
        start, previous[side] = tick + 1, report
    ends = [t["tick_to"] for t in turns]

    def owner(tick: int) -> dict[str, Any] | None:
        i = bisect.bisect_left(ends, tick)
        return turns[i] if i < len(turns) and turns[i]["tick_from"] <= tick else None

    pending: list[dict[str, Any]] = []  # rows after the last turn record: a turn still running or cut off
    for row_id, tick, event, role, content, cut, meta, at in messages:
        item = {"id": row_id, "tick": tick, "event_type": event, "role": role, "content": content,
                "truncated": bool(cut), "metadata": json.loads(meta) if meta else None, "created_at": iso(at)}
        turn = owner(tick)
        (turn["events"] if turn else pending).append(item)
    for cid, at, lo, hi, before, after, trigger, summary in compactions:
        turn = owner(hi + 1)
        if turn is not None:
            turn["compactions"].append({"id": cid, "created_at": iso(at), "range_start": lo, "range_end": hi,
                                        "tokens_before": before, "tokens_after": after, "trigger": trigger,
                                        "summary": summary[:CONTENT_CHARS]})
    last_tick = cur.execute("SELECT last_tick FROM session_ticks WHERE session_id = ?", [session_id]).fetchone()
    return {"session_id": session_id, "tenant": tenant_of(session_id), "turns": turns, "pending": pending,
            "last_tick": last_tick[0] if last_tick else None}


TOP_TOKENS = f"""
    SELECT id, session_id, tick, content, array_extract(concept_values, array_position(concept_ids, $cid)) AS v
    FROM timesteps WHERE array_contains(concept_ids, $cid) AND {owned_named('session_id')}
    ORDER BY v DESC, id LIMIT $limit"""


def top_tokens(cur: duckdb.DuckDBPyConnection, concept: str, concepts: ConceptIndex, owner: str,
               limit: int = 50) -> list[dict[str, Any]]:
    """The tokens, across `owner`'s sessions (xdb/owner.py), that activated `concept` most (it among their
    top-k)."""
    cid = concepts.id_of(concept)
    if cid is None:
        return []  # a concept of the pack no token has activated yet
    rows = cur.execute(TOP_TOKENS, {"cid": cid, "owner": owner, "limit": limit}).fetchall()
    return [{"id": tid, "session_id": sid, "tick": tick, "content": content, "activation": float(v)}
            for tid, sid, tick, content, v in rows]
