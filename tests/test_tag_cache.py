"""The tag cache recalls read tag names and target types through (xdb/recall/tag_cache.py): bounded, the
least recently used out first, and a recall through a cache of two tags the same as through one of all."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from core.config import XDBConfig
from xdb import XDB, TimestepRow
from xdb.owner import EVERY
from xdb.recall.tag_cache import TagCache

TAGS = ["t0", "t1", "t2", "t3", "t4"]


def tagged(data_dir: Path, cache_size: int) -> XDB:
    """Five tokens of one session, each with a tag of its own; `t4` is on a tick range as well, and a tag
    named "1" is on the first token (a name that reads as another tag's id)."""
    xdb = XDB.open(data_dir, XDBConfig(tag_cache_size=cache_size))
    ticks = xdb.next_ticks("s", len(TAGS))
    xdb.writer.submit([TimestepRow("s", t, "output", "assistant", f"w{t}", request_id="r") for t in ticks])
    xdb.writer.flush()
    for tick, name in zip(ticks, TAGS):
        xdb.tag(name, session_id="s", tick=tick, owner=EVERY)
    xdb.tag("t4", session_id="s", tick_range=(0, 1), owner=EVERY)
    xdb.tag("1", session_id="s", tick=0, owner=EVERY)
    return xdb


def test_a_cache_smaller_than_the_tags_recalls_the_same_and_stays_bounded(tmp_path: Path) -> None:
    small, whole = tagged(tmp_path / "small", 2), tagged(tmp_path / "whole", 100)
    try:
        for tags in [None, *([t] for t in TAGS), ["t0", "t3"], ["1"], ["no-such-tag"], TAGS]:
            filters = {"session_id": "s"} | ({"tags": tags} if tags else {})
            found = [(r["tick"], r["tags"]) for r in small.recall(filters, owner=EVERY)]
            assert found == [(r["tick"], r["tags"]) for r in whole.recall(filters, owner=EVERY)], tags
            assert len(small.tag_cache) <= 2
        assert [r["tags"] for r in small.recall(session_id="s", owner=EVERY)][:2] == [["1", "t0", "t4"],
                                                                                       ["t1", "t4"]]
    finally:
        small.close()
        whole.close()


def test_a_name_wins_over_an_id_and_a_change_is_seen_at_once(tmp_path: Path) -> None:
    xdb = tagged(tmp_path / "xdb", 2)
    try:
        ids = {name: xdb.tag(name, session_id="s", tick=4, owner=EVERY)["tag"]["id"] for name in ("t1", "1")}
        with xdb.cursor() as cur:
            assert xdb.tag_cache.resolve(cur, ["1"]) == ([ids["1"]], ["timestep"])  # the tag named "1"
            assert xdb.tag_cache.resolve(cur, [str(ids["t1"])])[0] == [ids["t1"]]  # no tag of that name
            assert xdb.tag_cache.resolve(cur, ["no-such-tag", "987654"]) == ([], [])
            assert xdb.tag_cache.resolve(cur, ["t1"]) == ([ids["t1"]], ["timestep"])
        # A range application after the cache read the tag: its target types follow.
        xdb.tag("t1", session_id="s", tick_range=(2, 3), owner=EVERY)
        with xdb.cursor() as cur:
            assert xdb.tag_cache.resolve(cur, ["t1"]) == ([ids["t1"]], ["range", "timestep"])
        assert [r["tick"] for r in xdb.recall(tags=["t1"], owner=EVERY)] == [1, 2, 3, 4]
    finally:
        xdb.close()


def test_least_recently_used_leave_first(tmp_path: Path) -> None:
    xdb = tagged(tmp_path / "xdb", 100)
    try:
        cache = TagCache(max_tags=2)
        with xdb.cursor() as cur:
            [t0], _ = cache.resolve(cur, ["t0"])
            cache.resolve(cur, ["t1"])
            cache.resolve(cur, ["t0"])  # t0 used again: t1 is now the least recently used
            cache.resolve(cur, ["t2"])
            assert cache.held() == ["t0", "t2"]
            assert cache.names(cur, [t0]) == {t0: "t0"}  # a name read by id counts as a use
            assert cache.held() == ["t2", "t0"]
    finally:
        xdb.close()


def test_a_cache_of_no_tags_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one tag"):
        TagCache(max_tags=0)
    with pytest.raises(ValidationError, match="tag_cache_size"):
        XDBConfig(tag_cache_size=0)
