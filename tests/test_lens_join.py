"""Activation capture without an engine: the side channel's messages and keys, the inbox, and the
writer's join of tokens with activations that arrive before, after or never."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lens.inbox import ActivationInbox
from lens.side_channel import (
    ActivationReceiver,
    ActivationSender,
    BundlingSender,
    StepActivations,
    completion_key,
    engine_key,
)
from xdb import XDB
from xdb.activation_join import ActivationJoiner
from xdb.owner import EVERY
from xdb.rows import TokenBatch


def step(key: str, positions: list[int], k: int = 3) -> StepActivations:
    rows = len(positions)
    index = np.tile(np.arange(k, dtype=np.int32), (rows, 1))
    values = np.array([[p + 0.5 - c for c in range(k)] for p in positions], dtype=np.float32)
    return StepActivations([key] * rows, positions, index, values, "hidden_state")


def test_keys_match_between_the_worker_and_the_api_side() -> None:
    # vLLM adds "-" and 8 random hex digits; for n > 1 each child is "{index}_{id}".
    assert engine_key("chatcmpl-abc-0123abcd") == completion_key("chatcmpl-abc", 1, 0) == "chatcmpl-abc"
    assert engine_key("2_cmpl-9-deadbeef") == completion_key("cmpl-9", 3, 2)


def test_a_message_survives_its_frames() -> None:
    sent = step("r", [4, 5])
    got = StepActivations.from_frames(sent.frames())
    assert got.keys == ["r", "r"] and got.positions == [4, 5] and got.source == "hidden_state"
    np.testing.assert_array_equal(got.concept_values, sent.concept_values)


NAMES = ("c0", "c1", "c2")


def batch(key: str, first: int, n: int, join_by: float | None = None) -> TokenBatch:
    return TokenBatch("s", list(range(first, first + n)), [f"t{p}" for p in range(first, first + n)],
                      token_ids=list(range(first, first + n)), request_id="req", concept_names=NAMES,
                      activation_key=key, first_position=first, join_by=join_by)


@pytest.fixture
def joiner(tmp_path: Path) -> Iterator[ActivationJoiner]:
    joiner = ActivationJoiner(f"ipc://{tmp_path}/j", k=3, wait_s=1.0)
    yield joiner
    joiner.close()


def test_tokens_take_the_activations_of_their_own_positions(joiner: ActivationJoiner) -> None:
    joiner.inbox.put(step("r", [5, 4]))  # activations come in any order, before the tokens
    joiner.inbox.put(step("other", [4]))
    [run] = joiner.join([batch("r", 4, 2, join_by=0.0)])
    assert isinstance(run, TokenBatch) and run.activation_key is None
    assert run.concept_values is not None and run.concept_values[:, 0].tolist() == [4.5, 5.5]
    assert run.activation_source == "hidden_state"
    assert list(run.ticks) == [4, 5] and run.created_at is None  # everything else as the tokens came
    assert len(joiner.inbox) == 1  # "r" is taken in full and forgotten; "other" waits for its tokens


def test_missing_activations_are_null_after_a_bounded_wait(joiner: ActivationJoiner) -> None:
    joiner.inbox.put(step("r", [0, 2]))
    start = time.monotonic()
    runs = joiner.join([batch("r", 0, 3, join_by=start + 0.2)])
    assert 0.15 < time.monotonic() - start < 1.0
    assert [(list(r.ticks), r.concept_index is not None) for r in runs if isinstance(r, TokenBatch)] == \
        [([0], True), ([1], False), ([2], True)]


def test_activations_that_arrive_during_the_wait_are_used(joiner: ActivationJoiner) -> None:
    threading.Timer(0.05, joiner.inbox.put, [step("r", [0])]).start()
    start = time.monotonic()
    [run] = joiner.join([batch("r", 0, 1, join_by=start + 2.0)])
    assert time.monotonic() - start < 0.5  # woken by the delivery, not by the deadline
    assert isinstance(run, TokenBatch) and run.concept_index is not None


def covering(covers: float, key: str = "other", positions: tuple[int, ...] = (0,)) -> StepActivations:
    """A message from the worker "w" that says it has shipped every row it took up to `covers`."""
    return dataclasses.replace(step(key, list(positions)), sender="w", covers=covers)


def test_missing_activations_are_not_waited_for_once_the_sender_has_shipped_past_the_tokens(
        joiner: ActivationJoiner) -> None:
    """Batches are written in order, so a batch waiting for activations that were lost would hold every
    batch behind it for its whole deadline. A message covering the time the tokens were made proves the
    missing rows are not coming: the wait ends there."""
    made = time.time()
    waiting = dataclasses.replace(batch("r", 0, 2), created_at=np.array([made - 0.01, made]))
    joiner.inbox.put(covering(made - 1.0))  # shipped up to before the tokens: rows may still come
    threading.Timer(0.1, joiner.inbox.put, [covering(made + 0.001)]).start()
    start = time.monotonic()
    [run] = joiner.join([dataclasses.replace(waiting, join_by=start + 10.0)])
    assert 0.05 < time.monotonic() - start < 3.0  # the deadline was 10 s away
    assert isinstance(run, TokenBatch) and run.concept_index is None


def test_rows_covered_later_than_the_tokens_are_still_taken(joiner: ActivationJoiner) -> None:
    made = time.time()
    threading.Timer(0.05, joiner.inbox.put, [covering(made + 0.001, "r", (0, 1))]).start()
    [run] = joiner.join([dataclasses.replace(batch("r", 0, 2), created_at=made, join_by=time.monotonic() + 5.0)])
    assert isinstance(run, TokenBatch) and run.concept_index is not None


def test_a_batch_whose_activations_never_come_holds_another_requests_commit_for_one_message(
        tmp_path: Path) -> None:
    """Two requests on a live worker: one's activations were lost. The other's reply is committed, with its
    activations, as soon as the worker has shipped past it, not at the lost batch's 10 s deadline."""
    import torch

    address = f"ipc://{tmp_path}/w"
    with XDB.open(tmp_path / "x") as xdb:
        xdb.capture_activations(address, 3, 10.0)
        worker = BundlingSender(ActivationSender(address), on_host=True)
        try:
            lost = dataclasses.replace(batch("lost", 0, 2), session_id="lost-s")
            xdb.writer.submit(lost)
            time.sleep(0.03)
            index, values = torch.tensor([[0, 1, 2]] * 2, dtype=torch.int32), torch.tensor([[0.5, 0.4, 0.3]] * 2)
            worker.add(["b", "b"], [0, 1], np.array([0, 1]), index, values, "hidden_state")
            xdb.writer.submit(batch("b", 0, 2))
            worker.add(["next"], [0], np.array([0]), index[:1], values[:1], "hidden_state")  # the next step
            start = time.monotonic()
            xdb.writer.flush(timeout=10)
            waited = time.monotonic() - start
        finally:
            worker.close()
        rows = {(r["session_id"], r["tick"]): r for r in xdb.recall(limit=10, owner=EVERY)}
    assert waited < 3.0, f"the commit waited {waited:.2f} s"  # one message, not the 10 s deadline
    assert [rows[("s", t)]["concept_activations"]["c0"] for t in (0, 1)] == [0.5, 0.5]
    assert [rows[("lost-s", t)]["concept_activations"] for t in (0, 1)] == [{}, {}]


def test_rows_without_a_key_pass_as_they_are(joiner: ActivationJoiner) -> None:
    plain = TokenBatch("s", [0], ["x"])
    assert joiner.join([plain]) == [plain]


def test_an_index_past_the_packs_concepts_stores_no_activations(joiner: ActivationJoiner) -> None:
    joiner.inbox.put(step("r", [0], k=3))
    short = dataclasses.replace(batch("r", 0, 1, join_by=0.0), concept_names=("c0", "c1"))
    [run] = joiner.join([short])
    assert isinstance(run, TokenBatch) and run.concept_index is None


def test_the_writer_joins_the_engines_activations_to_the_tokens(tmp_path: Path) -> None:
    """End to end without an engine: a sender as the worker's, an XDB writer binding the side channel,
    token batches that name their request; a flush returns with the rows joined and committed."""
    address = f"ipc://{tmp_path}/w"
    with XDB.open(tmp_path / "x") as xdb:
        xdb.capture_activations(address, 3, 2.0)
        sender = ActivationSender(address)
        try:
            xdb.writer.submit(batch("r", 0, 2))  # the tokens come first; their activations a moment later
            time.sleep(0.05)
            sender.send(step("r", [0, 1]))
            xdb.writer.flush(timeout=10)
        finally:
            sender.close()
        rows = xdb.recall(session_id="s", limit=10, owner=EVERY)
    assert [r["tick"] for r in rows] == [0, 1]
    assert [r["concept_activations"]["c0"] for r in rows] == [0.5, 1.5]
    assert all(r["activation_source"] == "hidden_state" for r in rows)


def test_the_side_channel_delivers_over_ipc(tmp_path) -> None:
    inbox = ActivationInbox()
    address = f"ipc://{tmp_path}/a"
    receiver = ActivationReceiver(address, inbox.put, inbox.evict_stale)
    sender = ActivationSender(address)
    try:
        sender.send(step("r", [0, 1]))
        deadline = time.monotonic() + 5
        while not inbox.has("r", 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [row is not None for row in inbox.take("r", [0, 1])] == [True, True]
    finally:
        sender.close()
        receiver.close()


def test_the_worker_ships_steps_in_bundles_and_the_rest_on_close(tmp_path) -> None:
    import torch

    messages: list[StepActivations] = []
    address = f"ipc://{tmp_path}/b"
    receiver = ActivationReceiver(address, messages.append)
    sender = BundlingSender(ActivationSender(address), on_host=True, interval_s=0.2)
    try:
        for position in range(3):  # three steps of two requests; row 1 of each step is not kept
            values = torch.tensor([[position + 0.5, 0.1], [9.0, 8.0], [position + 1.5, 0.2]])
            index = torch.tensor([[1, 0], [0, 1], [0, 1]])
            sender.add(["a", "b"], [position, position], np.array([0, 2]), index, values, "hidden_state")
        deadline = time.monotonic() + 5
        while not messages and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(messages) == 1, "the three steps of one interval travel as one message"
        got = messages[0]
        assert got.keys == ["a", "b"] * 3 and got.positions == [0, 0, 1, 1, 2, 2]
        assert got.concept_index.dtype == np.int32
        np.testing.assert_array_equal(got.concept_index[:, 0], [1, 0] * 3)
        np.testing.assert_allclose(got.concept_values[:, 0], [0.5, 1.5, 1.5, 2.5, 2.5, 3.5])
        sender.add(["c"], [7], np.array([0]), torch.tensor([[1, 0]]), torch.tensor([[0.3, 0.1]]), "hidden_state")
    finally:
        sender.close()  # ships the step still pending before the interval is over
    deadline = time.monotonic() + 5
    while len(messages) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    receiver.close()
    assert [m.keys for m in messages[1:]] == [["c"]]


def test_unclaimed_requests_are_evicted() -> None:
    inbox = ActivationInbox(ttl_s=0.01)
    inbox.put(step("hidden-call", [0]))
    time.sleep(0.05)
    inbox.evict_stale()
    assert len(inbox) == 0


@pytest.mark.parametrize("frames", [
    [b"[1, 2]", b"", b""],                                             # a header that is a list
    [b'{"keys": "r", "positions": [0], "k": 1, "source": "x"}', b"", b""],
    [b'{"keys": ["r"], "positions": [-1], "k": 1, "source": "x"}', b"\0" * 4, b"\0" * 4],
    [b'{"keys": ["r"], "positions": [0], "k": 0, "source": "x"}', b"", b""],
    [b'{"keys": ["r"], "positions": [0], "k": 2, "source": "x"}', b"\0" * 4, b"\0" * 8],  # short frame
    [b"\xff", b"", b""],
    [b"{}"],
])
def test_a_malformed_message_is_a_value_error(frames: list[bytes]) -> None:
    with pytest.raises(ValueError, match="activation message|Expecting|JSON|codec"):
        StepActivations.from_frames(frames)


def test_the_receiver_survives_any_message_and_keeps_no_bundle_alive(tmp_path: Path) -> None:
    """Bad messages (a JSON list header killed the thread) are dropped and counted; the next good one is
    delivered; a row left waiting holds a copy of itself, not the message it came in."""
    import zmq

    inbox = ActivationInbox()
    address = f"ipc://{tmp_path}/r"
    receiver = ActivationReceiver(address, inbox.put, inbox.evict_stale)
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(address)
    try:
        for frames in ([b"[1, 2]", b"", b""], [b"null", b"", b""], [b"{}"]):
            push.send_multipart(frames)
        push.send_multipart(step("r", list(range(64)), k=8).frames())
        deadline = time.monotonic() + 5
        while not inbox.has("r", 63) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert receiver.alive and receiver.dropped == 3
        [(index, values)] = inbox.take("r", [5])
        assert index.base is None and values.base is None  # owns its data: the message can go
    finally:
        push.close(linger=0)
        receiver.close()
