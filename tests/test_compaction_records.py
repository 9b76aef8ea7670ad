"""A server-side State compaction is recorded in XDB: a `compaction_records` row with its trigger, range,
summary and token counts, the compacted rows out of HOT, and nothing in the agent's `meta_knowledge`."""

from __future__ import annotations

from pathlib import Path

from chat_bodies import chat
from fake_app import serving

from core.config import AHCConfig
from xdb import XDB
from xdb.owner import EVERY


def test_a_compaction_writes_its_record_and_releases_the_rows_before_it(
        config: AHCConfig, vllm_config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    overrides = {"orchestrator.compaction_threshold_tokens": 1, "orchestrator.compaction_keep_turns": 0,
                 "xdb.hot_seconds": 3600}
    with serving(config, vllm_config, tmp_path, **overrides) as (client, runtime):
        first = client.post("/v1/chat/completions", json=chat("cr1", "What moves first?", max_tokens=6))
        assert first.status_code == 200
        runtime.xdb.writer.flush()
        first_rows = runtime.xdb.recall({"session_id": "cr1", "limit": 1000}, owner=EVERY)
        second = client.post("/v1/chat/completions", json=chat("cr1", "And then?", max_tokens=6))
        assert second.status_code == 200 and "compaction" in second.json()["context"]["governor"]
        runtime.background.submit(lambda: None).result()  # the record is written on the ordered worker
        xdb = runtime.xdb
        assert isinstance(xdb, XDB)
        records = xdb.conn.execute("SELECT range_start, range_end, trigger, summary, tokens_before, tokens_after "
                                   "FROM compaction_records WHERE session_id = 'cr1'").fetchall()
        session = runtime.orchestrator.sessions.get("cr1")
        [(start, end, trigger, summary, before, after)] = records
        assert (start, end) == (0, max(r["tick"] for r in first_rows))  # everything recorded before the request
        assert trigger == "context_full" and summary == session.summary and before > 0 and after > 0
        assert xdb.conn.execute("SELECT count(*) FROM meta_knowledge").fetchone() == (0,)
        # The first request's rows left HOT; the compacting request's own rows did not.
        tiers = xdb.state()["fidelity"]
        assert tiers["released"] == len(first_rows) and tiers["hot"] > 0
