"""A concept's typed relations: its place in the lens packs' hierarchy (`concept_hierarchy`: parent,
children, siblings under the same parent, the ancestors up to the root) and the concepts that light up in
the same tokens (`co_activated`, from `insights.py`)."""

from __future__ import annotations

from typing import Any, Literal, get_args

import duckdb

from core.errors import NotFound
from xdb.concepts import ConceptIndex
from xdb.interface import reads
from xdb.recall import insights

Relation = Literal["parent", "child", "sibling", "co_activated"]
RELATIONS: tuple[Relation, ...] = get_args(Relation)


def _hierarchy(cur: duckdb.DuckDBPyConnection) -> dict[str, tuple[str | None, str | None]]:
    """concept -> (display name, parent): the whole table, one small row per concept of the lens packs."""
    rows = cur.execute("SELECT concept, display_name, parent FROM concept_hierarchy").fetchall()
    return {concept: (display, parent) for concept, display, parent in rows}


def _in_hierarchy(tree: dict[str, tuple[str | None, str | None]], concept: str) -> bool:
    return concept in tree or any(parent == concept for _, parent in tree.values())


def _entry(tree: dict[str, tuple[str | None, str | None]], concept: str, relation: Relation) -> dict[str, Any]:
    return {"concept": concept, "display_name": tree.get(concept, (None, None))[0], "relation": relation}


def _children(tree: dict[str, tuple[str | None, str | None]], concept: str) -> list[str]:
    return sorted(c for c, (_, parent) in tree.items() if parent == concept)


def _ancestors(tree: dict[str, tuple[str | None, str | None]], concept: str) -> list[str]:
    """The parent, its parent, ... up to the root; a cycle a pack may have drawn ends the chain."""
    chain: list[str] = []
    parent = tree.get(concept, (None, None))[1]
    while parent is not None and parent != concept and parent not in chain:
        chain.append(parent)
        parent = tree.get(parent, (None, None))[1]
    return chain


def _known(tree: dict[str, tuple[str | None, str | None]], concept: str) -> None:
    if not _in_hierarchy(tree, concept):
        raise NotFound(f"concept {concept!r} is not in the concept hierarchy")


@reads
def concept_children(cur: duckdb.DuckDBPyConnection, concept: str) -> list[dict[str, Any]]:
    """The concepts whose parent is `concept`, by name."""
    tree = _hierarchy(cur)
    _known(tree, concept)
    return [_entry(tree, child, "child") for child in _children(tree, concept)]


@reads
def concept_parents(cur: duckdb.DuckDBPyConnection, concept: str) -> list[dict[str, Any]]:
    """`concept`'s ancestors, its parent first, up to the root (a top-level concept has none)."""
    tree = _hierarchy(cur)
    _known(tree, concept)
    return [_entry(tree, ancestor, "parent") for ancestor in _ancestors(tree, concept)]


def related_concepts(cur: duckdb.DuckDBPyConnection, concept: str, concepts: ConceptIndex, limit: int = 10,
                     session_id: str | None = None, relation: Relation | None = None, *,
                     owner: str) -> list[dict[str, Any]]:
    """Each related concept with its `relation`: its parent, its children, its siblings (the same parent)
    from the hierarchy, then the concepts co-activated with it in the owner's tokens (with `together`,
    `share` and `mean_activation`); `relation` keeps one kind; `limit` caps each kind. A concept known
    neither to the hierarchy nor to the tokens is NotFound."""
    tree = _hierarchy(cur)
    seen = concepts.id_of(concept) is not None
    if not seen and not _in_hierarchy(tree, concept):
        raise NotFound(f"concept {concept!r} has not been seen and is not in the concept hierarchy")
    parent = tree.get(concept, (None, None))[1]
    found: dict[Relation, list[str]] = {
        "parent": [parent] if parent is not None else [],
        "child": _children(tree, concept),
        "sibling": [c for c in _children(tree, parent) if c != concept] if parent is not None else [],
    }
    out = [_entry(tree, name, kind) for kind, names in found.items() if relation in (None, kind)
           for name in names[:limit]]
    if seen and relation in (None, "co_activated"):
        together = insights.related_concepts(cur, concept, concepts, limit, session_id, owner=owner)
        out += [{**_entry(tree, row["concept"], "co_activated"), **row} for row in together]
    return out
