"""The five prompt blocks and their canonical form.

A block's hash is taken over its canonical serialisation (sorted keys, no whitespace variance), so the
same inputs always hash the same and the cache report can say which block changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

BLOCK_ORDER: tuple[str, ...] = ("identity", "codex", "karma", "state", "query")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Block:
    """One block: its rendered text (what the model sees) and its token count."""

    name: str
    text: str
    tokens: int
    sha256: str

    def report(self) -> dict[str, Any]:
        return {"name": self.name, "tokens": self.tokens, "sha256": self.sha256}


def prefix_sha256(blocks: list[Block]) -> str:
    """One hash over the blocks above the Query: what the prefix cache can reuse."""
    return sha256_hex(canonical_json([b.sha256 for b in blocks if b.name != "query"]))


def first_changed(blocks: list[Block], previous: dict[str, str] | None) -> str | None:
    """The first block, in prompt order, whose hash differs from the previous request's."""
    if previous is None:
        return None
    for block in blocks:
        if previous.get(block.name) != block.sha256:
            return block.name
    return None
