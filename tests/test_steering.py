"""The steering hook: a plug-in found by its entry point (tests/plugins, an installed-looking package) is
called after each reply with its steps and their concept activations; each directive it answers becomes a
`steering` timestep with its rationale, chained in the audit log and read back by recall's
`event_types=steering`. AHC's whole app on the fake engine (tests/fake_app.py), a real XDB."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fake_app import serving

from core.config import AHCConfig
from server.recording.steering import ENTRY_POINT_GROUP, Steering, SteeringDirective, load_hook
from xdb import XDB, TimestepRow
from xdb.audit.log import verify_audit
from xdb.owner import EVERY

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example package on sys.path, where importlib.metadata finds its dist-info's entry points."""
    monkeypatch.syspath_prepend(str(PLUGINS))


def steering_rows(xdb: Any, session: str, want: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The session's steering rows once `want` are committed (the hook runs after the reply, off its path)."""
    deadline = time.monotonic() + timeout_s
    while True:
        xdb.writer.flush()
        rows: list[dict[str, Any]] = xdb.recall(session_id=session, event_types=["steering"], owner=EVERY)
        if len(rows) >= want or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def chat(client: Any, session: str) -> None:
    reply = client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 6, "messages": [{"role": "user", "content": "hello"}],
        "context": {"session_id": session}})
    assert reply.status_code == 200, reply.text


def test_a_hooks_directives_are_recorded_chained_and_recalled(config: AHCConfig, vllm_config: Any,
                                                            tmp_path: Path, installed: None) -> None:
    with serving(config, vllm_config, tmp_path, **{"lens.steering_hook": "example"}) as (client, runtime):
        chat(client, "s")
        [row] = steering_rows(runtime.xdb, "s", 1)
        outputs = runtime.xdb.recall(session_id="s", event_types=["output"], owner=EVERY)
        assert row["event_type"] == "steering" and row["request_id"] == outputs[0]["request_id"]
        assert row["tick"] > outputs[-1]["tick"]  # after the reply it answers
        meta = row["metadata"]
        assert meta["directive"] == "observe" and meta["hook"] == "example" and meta["step_tick"] == outputs[0]["tick"]
        assert repr(outputs[0]["content"]) in meta["rationale"]  # the hook saw the reply's tokens
        # The operator's recall over HTTP, by event type.
        got = client.get("/v1/xdb/recall", params={"session_id": "s", "event_types": "steering"})
        assert got.status_code == 200, got.text
        assert [r["metadata"]["rationale"] for r in got.json()["data"]] == [meta["rationale"]]
        audit = runtime.xdb.audit
        assert audit is not None
        chained = audit.conn.execute("SELECT count(*) FROM audit_records WHERE event_type = 'steering' "
                                     "AND session_id = 's'").fetchone()
        assert chained == (1,)
    assert verify_audit(tmp_path / "xdb").ok


def test_the_hook_sees_each_steps_activations(tmp_path: Path, installed: None) -> None:
    with XDB.open(tmp_path / "x") as xdb:
        assert xdb.writer is not None
        ticks = xdb.next_ticks("s", 3)
        xdb.writer.submit([TimestepRow("s", t, "output", "assistant", word, request_id="r1",
                                       concept_activations={"deception": value, "joy": 0.1},
                                       activation_source="hidden_state")
                           for t, word, value in zip(ticks, ("I ", "lied ", "."), (0.2, 0.9, 0.3))])
        other = xdb.next_ticks("s", 1)  # another request's row within the range: not this reply's
        xdb.writer.submit([TimestepRow("s", other[0], "output", "assistant", "x", request_id="r2",
                                       concept_activations={"deception": 0.99})])
        xdb.writer.flush()
        steering = Steering("example", load_hook("example"), xdb)
        directives = steering.decide("s", "r1", [(ticks[0], other[0])])
    damp = SteeringDirective("damp deception", "deception measured 0.90 > 0.5 at token 'lied '", tick=ticks[1],
                             details={"concept": "deception", "value": pytest.approx(0.9)})
    assert directives == [damp]


def test_a_failing_hook_costs_the_reply_nothing(config: AHCConfig, vllm_config: Any, tmp_path: Path,
                                                installed: None, caplog: pytest.LogCaptureFixture) -> None:
    with serving(config, vllm_config, tmp_path, **{"lens.steering_hook": "broken"}) as (client, runtime):
        chat(client, "s")
        deadline = time.monotonic() + 10
        while "steering hook 'broken' failed" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "this hook always fails" in caplog.text
        assert steering_rows(runtime.xdb, "s", 0) == []
        assert runtime.xdb.recall(session_id="s", event_types=["output"], owner=EVERY)


def test_an_unknown_hook_is_refused_naming_the_installed_ones(config: AHCConfig, vllm_config: Any, tmp_path: Path,
                                                              installed: None) -> None:
    with pytest.raises(ValueError, match="no steering hook 'nope' is installed.*installed: broken, example"):
        load_hook("nope")
    with pytest.raises(ValueError, match="lens.steering_hook: no steering hook 'nope'"):  # the server's start
        with serving(config, vllm_config, tmp_path, **{"lens.steering_hook": "nope"}):
            pass
    assert ENTRY_POINT_GROUP == "ahc.steering"
    with pytest.raises(ValueError, match="non-empty rationale"):
        SteeringDirective("damp x", " ")
