"""The API side of activation capture without an engine: the side channel's messages and keys, the
inbox, and the join of tokens with activations that arrive before, after or never."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from server.capture.activation_join import ActivationJoin
from server.capture.inbox import ActivationInbox
from server.capture.side_channel import (
    ActivationReceiver,
    ActivationSender,
    BundlingSender,
    StepActivations,
    completion_key,
    engine_key,
)


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


def test_tokens_wait_for_their_activations_and_go_out_in_order() -> None:
    inbox = ActivationInbox(k=3)
    join = ActivationJoin(inbox, "r")
    inbox.put(step("r", [1]))  # token 1's activations come before token 0's
    join.hold([10, 11], ["a", "b"], [5, 6], [1.0, 2.0])
    assert join.ready() == []  # token 0 has none yet: nothing may overtake it
    inbox.put(step("r", [0]))
    runs = join.ready()
    assert len(runs) == 1 and runs[0].ticks == [10, 11]
    assert runs[0].concept_values[:, 0].tolist() == [0.5, 1.5]
    assert runs[0].created_at == [1.0, 2.0]  # each token keeps the time it arrived


def test_at_the_end_missing_activations_are_null_after_a_bounded_wait() -> None:
    inbox = ActivationInbox(k=3)
    join = ActivationJoin(inbox, "r")
    join.hold([0, 1, 2], ["a", "b", "c"], [1, 2, 3], [1.0, 2.0, 3.0])
    inbox.put(step("r", [0, 2]))
    start = time.monotonic()
    runs = asyncio.run(join.finish(0.2))
    assert 0.15 < time.monotonic() - start < 1.0
    assert [(r.ticks, r.concept_index is not None) for r in runs] == [([0], True), ([1], False), ([2], True)]
    assert len(inbox) == 0  # the request is forgotten


def test_activations_that_arrive_during_the_wait_are_used() -> None:
    inbox = ActivationInbox(k=3)
    join = ActivationJoin(inbox, "r")
    join.hold([0], ["a"], [1], [1.0])

    async def late_then_finish():
        asyncio.get_running_loop().call_later(0.05, inbox.put, step("r", [0]))
        return await join.finish(1.0)

    start = time.monotonic()
    runs = asyncio.run(late_then_finish())
    assert time.monotonic() - start < 0.5
    assert runs[0].concept_index is not None


class CountingInbox(ActivationInbox):
    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.looks = 0

    def take(self, key: str, positions: list[int]) -> list[tuple[np.ndarray, np.ndarray] | None]:
        self.looks += 1
        return super().take(key, positions)


def test_a_finished_reply_is_woken_by_the_delivery_of_its_rows_not_by_polling() -> None:
    inbox = CountingInbox(k=3)
    joins = [ActivationJoin(inbox, f"r{i}") for i in range(20)]  # replies that ended together
    for join in joins:
        join.hold([0, 1], ["a", "b"], [1, 2], [1.0, 1.0])

    async def finish_all() -> list[list]:
        # The receiver thread delivers the rows 0.2 s later: a poll every few ms would look hundreds of times.
        threading.Timer(0.2, lambda: [inbox.put(step(f"r{i}", [0, 1])) for i in range(20)]).start()
        return await asyncio.gather(*(join.finish(2.0) for join in joins))

    start = time.monotonic()
    results = asyncio.run(finish_all())
    assert 0.15 < time.monotonic() - start < 1.0
    assert all(len(runs) == 1 and runs[0].concept_index is not None for runs in results)
    assert inbox.looks <= 20 * 3  # each reply looks once at the start and once a message, not once a poll


def test_a_waiter_whose_event_loop_is_gone_does_not_stop_delivery() -> None:
    inbox = ActivationInbox(k=3)

    async def wait_and_leave() -> None:
        inbox.delivery()  # never awaited nor cancelled: its loop closes with it pending

    asyncio.run(wait_and_leave())
    inbox.put(step("r", [0]))  # the receiver thread's put still stores the rows
    assert inbox.has("r", 0)


def test_the_side_channel_delivers_over_ipc(tmp_path) -> None:
    inbox = ActivationInbox(k=3)
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
    inbox = ActivationInbox(k=3, ttl_s=0.01)
    inbox.put(step("hidden-call", [0]))
    time.sleep(0.05)
    inbox.evict_stale()
    assert len(inbox) == 0
