"""Tag names, and the target types each tag's applications use, for the tags recalls name and return.

Every recall needs them and a DuckDB round trip costs milliseconds, so they are kept in memory; a year of
tagging holds more tags than any recall uses, so only the most recently used `max_tags` are: the ones a
recall misses are read in one query, the least recently used leave. Tags change only through this
process's XDB (DuckDB lets one process write), which calls `invalidate()` after each change; what was
read before it is dropped. Applications themselves stay in DuckDB.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

import duckdb

DEFAULT_MAX_TAGS = 4096


@dataclass(frozen=True)
class CachedTag:
    name: str
    kinds: frozenset[str]  # the target types of its applications


class TagCache:
    def __init__(self, max_tags: int = DEFAULT_MAX_TAGS) -> None:
        if max_tags < 1:
            raise ValueError(f"a tag cache holds at least one tag, not {max_tags}")
        self.max_tags = max_tags
        self._lock = threading.Lock()
        self._version = 0
        self._tags: OrderedDict[int, CachedTag] = OrderedDict()  # least recently used first
        self._by_name: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._tags)

    def held(self) -> list[str]:
        """The names of the tags held, least recently used first."""
        with self._lock:
            return [tag.name for tag in self._tags.values()]

    def invalidate(self) -> None:
        with self._lock:
            self._version += 1
            self._tags.clear()
            self._by_name.clear()

    def resolve(self, cur: duckdb.DuckDBPyConnection, names_or_ids: list[str]) -> tuple[list[int], list[str]]:
        """Tag ids for names or numeric ids (unknown tags are skipped: they match nothing), and the
        target types their applications use. A filter value is text, so a name wins: "123" means the
        tag named "123" where there is one, and tag id 123 only otherwise."""
        numbers = [int(x) for x in names_or_ids if x.isdecimal()]
        found = self._load(cur, names=names_or_ids, ids=numbers)
        by_name = {tag.name: tid for tid, tag in found.items()}
        ids = {by_name[x] for x in names_or_ids if x in by_name}
        ids.update(int(x) for x in names_or_ids if x not in by_name and x.isdecimal() and int(x) in found)
        return sorted(ids), sorted({kind for tid in ids for kind in found[tid].kinds})

    def names(self, cur: duckdb.DuckDBPyConnection, ids: Collection[int]) -> dict[int, str]:
        """The names of these tag ids (an id with no tag is left out)."""
        return {tid: tag.name for tid, tag in self._load(cur, names=(), ids=ids).items()}

    def _load(self, cur: duckdb.DuckDBPyConnection, names: Collection[str],
              ids: Collection[int]) -> dict[int, CachedTag]:
        """The tags named or numbered, from memory where they are, the rest in one query."""
        found: dict[int, CachedTag] = {}
        with self._lock:
            version = self._version
            for tid in [*(self._by_name[n] for n in names if n in self._by_name), *ids]:
                tag = self._tags.get(tid)
                if tag is not None:
                    self._tags.move_to_end(tid)
                    found[tid] = tag
            missing_names = [n for n in names if n not in self._by_name]
            missing_ids = [i for i in ids if i not in found]
        if missing_names or missing_ids:
            read = read_tags(cur, missing_names, missing_ids)
            found.update(read)
            self._keep(read, version)
        return found

    def _keep(self, read: dict[int, CachedTag], version: int) -> None:
        with self._lock:
            if self._version != version:  # a change made meanwhile: what was read may be stale
                return
            for tid, tag in read.items():
                self._tags[tid] = tag
                self._tags.move_to_end(tid)
                self._by_name[tag.name] = tid
            while len(self._tags) > self.max_tags:
                _, gone = self._tags.popitem(last=False)
                del self._by_name[gone.name]


def read_tags(cur: duckdb.DuckDBPyConnection, names: Collection[str], ids: Collection[int]) -> dict[int, CachedTag]:
    """The tags with these names or ids, each with its applications' target types."""
    rows = cur.execute("""
        SELECT g.id, g.name, list(DISTINCT a.target_type) FILTER (WHERE a.target_type IS NOT NULL)
        FROM tags g LEFT JOIN tag_applications a ON a.tag_id = g.id
        WHERE g.name IN (SELECT unnest(from_json(?, '["VARCHAR"]')))
           OR g.id IN (SELECT unnest(from_json(?, '["BIGINT"]')))
        GROUP BY g.id, g.name""", [json.dumps(list(names)), json.dumps(list(ids))]).fetchall()
    return {tid: CachedTag(name, frozenset(kinds or ())) for tid, name, kinds in rows}
