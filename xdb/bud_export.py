"""A bud's examples as a lens training file, the JSON `ahc lens train --examples` reads (lens/train.py).

The bud is one concept: its examples are the texts of what it tags, one text per application (a reply's
generated tokens, a tick range's rows, a single timestep's token), in the order they were tagged. The
contrast concept (`not-<bud>`) takes the replies of the bud's own sessions that none of its applications
touches, then, if those are fewer than the bud's examples, other sessions' replies, newest first. Where
both sides have `HELDOUT_EVERY` texts or more, every `HELDOUT_EVERY`-th is held out (`heldout`), so
`ahc lens train` reports the new concept's held-out ROC-AUC against a shuffled-label control.

Only a bud whose examples were judged enough (READY, or SUBMITTED / GRAFTED after it) exports: a
candidate may still be wrong, a rejected one was. A bud whose tagged rows have been compressed away may
have fewer texts than applications; fewer than `min_examples` is a Conflict, as READY itself is.
"""

from __future__ import annotations

from typing import Any

import duckdb

from core.errors import Conflict, NotFound
from xdb.interface import reads
from xdb.tags import BUD_MIN_EXAMPLES, TAG_MATCH, BudStatus, find_tag

EXPORTABLE = (BudStatus.READY.value, BudStatus.SUBMITTED.value, BudStatus.GRAFTED.value)
HELDOUT_EVERY = 4
# The contrast set's size, as a multiple of the bud's examples (the lens fits one direction per concept:
# far more contrast than examples would only tilt it).
CONTRAST_RATIO = 3
CONTRAST_PREFIX = "not-"

# One text per application: the generated tokens it covers joined as they were streamed, or, where it
# covers none (an input message, a tool result), its rows one per line.
EXAMPLE_TEXTS = f"""
    SELECT a.id, coalesce(string_agg(t.content, '' ORDER BY t.tick) FILTER (WHERE t.event_type = 'output'),
                          string_agg(t.content, chr(10) ORDER BY t.tick))
    FROM tag_applications a JOIN timesteps t ON {TAG_MATCH}
    WHERE a.tag_id = ? GROUP BY a.id ORDER BY a.id"""

# Replies (a request's generated tokens) none of whose rows the bud tags: its own sessions' first.
CONTRAST_TEXTS = f"""
    WITH bud_sessions AS (SELECT DISTINCT t.session_id FROM tag_applications a JOIN timesteps t ON {TAG_MATCH}
                          WHERE a.tag_id = $tag),
    tagged AS (SELECT DISTINCT t.session_id, t.request_id FROM tag_applications a JOIN timesteps t ON {TAG_MATCH}
               WHERE a.tag_id = $tag AND t.request_id IS NOT NULL)
    SELECT string_agg(r.content, '' ORDER BY r.tick), r.session_id IN (SELECT session_id FROM bud_sessions) AS own,
           max(r.id) AS last
    FROM timesteps r
    WHERE r.event_type = 'output' AND r.request_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM tagged g WHERE g.session_id = r.session_id AND g.request_id = r.request_id)
    GROUP BY r.session_id, r.request_id
    ORDER BY own DESC, last DESC LIMIT $limit"""


def _distinct(texts: list[str], exclude: set[str] | None = None) -> list[str]:
    seen: set[str] = set(exclude or ())
    out = []
    for text in texts:
        if text.strip() and text not in seen:
            seen.add(text)
            out.append(text)
    return out


def _split(texts: list[str], hold: bool) -> tuple[list[str], list[str]]:
    if not hold:
        return texts, []
    return ([t for i, t in enumerate(texts) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1],
            [t for i, t in enumerate(texts) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1])


@reads
def bud_training_file(cur: duckdb.DuckDBPyConnection, bud: str | int,
                      min_examples: int = BUD_MIN_EXAMPLES) -> dict[str, Any]:
    """The training file of a READY (or submitted, or grafted) bud: NotFound for no such tag, Conflict
    for a tag that is no bud, a bud not ready, fewer than `min_examples` texts or nothing to contrast."""
    tag = find_tag(cur, bud)
    if tag is None:
        raise NotFound(f"tag {bud!r} not found")
    if tag["tag_type"] != "bud":
        raise Conflict(f"tag {tag['name']!r} is a {tag['tag_type']} tag, not a bud: only a bud's examples export",
                       param="tag")
    if tag["bud_status"] not in EXPORTABLE:
        raise Conflict(f"bud {tag['name']!r} is {tag['bud_status']}: its examples export once it is ready",
                       param="tag")
    examples = _distinct([text for _, text in cur.execute(EXAMPLE_TEXTS, [tag["id"]]).fetchall() if text])
    if len(examples) < min_examples:
        raise Conflict(f"bud {tag['name']!r} has {len(examples)} example texts left; a training file needs "
                       f"{min_examples} (xdb.bud_min_examples)", param="tag")
    rows = cur.execute(CONTRAST_TEXTS, {"tag": tag["id"], "limit": CONTRAST_RATIO * len(examples)}).fetchall()
    contrast = _distinct([text for text, _, _ in rows if text], set(examples))
    if not contrast:
        raise Conflict(f"bud {tag['name']!r}: no reply it does not tag to contrast it with", param="tag")
    hold = min(len(examples), len(contrast)) >= HELDOUT_EVERY
    train, heldout = _split(examples, hold)
    other_train, other_heldout = _split(contrast, hold)
    name = tag["name"]
    return {
        "description": f"Bud {name!r}'s examples (the texts it tags) against replies it does not tag, "
                       "exported from XDB for `ahc lens train`.",
        "bud": {"id": tag["id"], "name": name, "status": tag["bud_status"]},
        "concepts": [
            {"id": name, "name": tag["description"] or name, "examples": train, "heldout": heldout},
            {"id": CONTRAST_PREFIX + name, "name": f"Not {name}", "examples": other_train,
             "heldout": other_heldout},
        ],
    }
