"""What a client or the agent adds beside the recorded rows is chained in the audit log too: a tag applied,
a comment, a pinned window, the agent's logged interaction and its knowledge, each as an event naming what
it added and its text by hash (the text stays in the experience file, and leaves with a deleted session);
the chain verifies before and after the deletion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xdb import XDB, TimestepRow, verify_audit
from xdb.owner import EVERY
from xdb.runs import log_interaction, save_meta_knowledge
from xdb.sql import digest


def events(xdb: XDB) -> list[dict[str, Any]]:
    return [json.loads(r["content"]) if r["content"] else {"erased": r["erased"]}
            for r in xdb.audit_records(event_type="xdb_event", limit=1000)]


def test_tags_comments_pins_and_the_agents_inserts_are_chained(tmp_path: Path) -> None:
    data = tmp_path / "x"
    with XDB.open(data) as xdb:
        ticks = xdb.next_ticks("s", 3)
        xdb.writer.submit([TimestepRow("s", t, "output", "assistant", f"w{t}") for t in ticks])
        xdb.writer.flush()
        applied = xdb.tag("door", session_id="s", tick_range=(0, 1), note="the north one", owner=EVERY)
        comment = xdb.comment("the key is red", session_id="s", tick=2, owner=EVERY)
        window = xdb.pin("s", 0, 2, "evidence")
        turn = xdb.write(log_interaction, "run-1", journal_entry="tried A", tool_call_json='{"x": 1}')
        version = xdb.write(save_meta_knowledge, "run-1", theorems_json="[]")
        chained = {e["action"]: e for e in events(xdb)}
    assert chained["tag_applied"] == {
        "action": "tag_applied", "application_id": applied["id"], "tag_id": applied["tag"]["id"], "tag": "door",
        "session_id": "s", "target_type": "range", "timestep_id": None, "event_id": None, "ticks": [0, 1],
        "source": "manual", "confidence": 1.0, "note_sha256": digest("the north one")}
    assert chained["comment_added"]["comment_id"] == comment["id"]
    assert chained["comment_added"]["sha256"] == digest("the key is red")
    assert "the key is red" not in json.dumps(chained)  # the text by hash only
    assert chained["window_pinned"]["window_id"] == window["id"] and chained["window_pinned"]["ticks"] == [0, 2]
    assert chained["agent_interaction"] == {"action": "agent_interaction", "run_id": "run-1", "turn_id": turn,
                                            "sha256": digest("tried A", '{"x": 1}', None)}
    assert chained["agent_knowledge"]["version_id"] == version
    report = verify_audit(data)
    assert report.ok and report.records_checked >= 8, report.first_bad

    with XDB.open(data) as xdb:
        xdb.delete_session("s")
        kept = events(xdb)
    # The events carry no text to erase: they stay, with the deletion after them, and the chain verifies.
    assert [e["action"] for e in kept][:5] == ["tag_applied", "comment_added", "window_pinned", "agent_interaction",
                                               "agent_knowledge"] and kept[-1]["action"] == "delete_session"
    assert verify_audit(data).ok
