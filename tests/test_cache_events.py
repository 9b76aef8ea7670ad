"""vLLM's KV events read into what the cache holds per session (server/admission/cache_events.py), on
events built with vLLM's own event classes, and session admission taking its model from them."""

from __future__ import annotations

import asyncio

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

from server.admission.cache_events import CPU, GPU, CacheEvents
from server.admission.session_admission import Costs, SessionAdmission


def stored(hashes: list[int], parent: int | None, session: str | None = None, medium: str = GPU) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=[0] * 16 * len(hashes),
                       block_size=16, lora_id=None, medium=medium, lora_name=None, session_id=session)


def removed(hashes: list[int], medium: str = GPU) -> BlockRemoved:
    return BlockRemoved(block_hashes=hashes, medium=medium)


def shared_prompt_then_two_sessions() -> CacheEvents:
    """a stores a shared prefix (1, 2) and its own 3, 4; b's request hits 1, 2 and stores 5."""
    events = CacheEvents()
    events.apply([stored([1, 2], None, "a"), stored([3], 2, "a")])
    events.apply([stored([4], 3, "a")])  # the same request's reply fills a block
    events.apply([stored([5], 2, "b")])
    return events


def test_a_session_holds_its_chain_and_the_shared_prefix_it_hangs_from() -> None:
    events = shared_prompt_then_two_sessions()
    assert events.blocks("a") == 4
    assert events.blocks("b") == 3  # 1 and 2 were stored by a: b's chain reaches them by the parents
    assert events.blocks("nobody") is None


def test_a_freed_block_ends_the_prefix_a_lookup_would_find() -> None:
    events = shared_prompt_then_two_sessions()
    events.apply([removed([3])])
    assert events.blocks("a") == 2  # 4 is still cached, but vLLM's lookup stops at the first miss
    events.apply([removed([1])])
    assert (events.blocks("a"), events.blocks("b")) == (0, 0)


def test_the_cpu_tier_counts_apart_and_by_reference() -> None:
    events = shared_prompt_then_two_sessions()
    events.apply([stored([1, 2, 3], None, medium=CPU), stored([1, 2], None, medium=CPU)])  # two chunks share 1, 2
    assert events.blocks("a", CPU) == 3
    events.apply([removed([1, 2], CPU)])  # one chunk gone: the other still holds 1 and 2
    assert events.blocks("a", CPU) == 3
    events.apply([removed([1, 2, 3], CPU)])
    assert events.blocks("a", CPU) == 0
    assert events.blocks("a", GPU) == 4


def test_a_new_request_of_a_session_replaces_its_chain() -> None:
    events = shared_prompt_then_two_sessions()
    events.apply([stored([6, 7], 2, "a")])  # a's next prompt diverges after the shared prefix
    assert events.blocks("a") == 4  # 1, 2, 6, 7
    events.apply([removed([3, 4])])
    assert events.blocks("a") == 4


def test_a_clear_leaves_nothing_held() -> None:
    events = shared_prompt_then_two_sessions()
    events.apply([AllBlocksCleared()])
    assert events.blocks("a") == 0


def test_a_reader_learns_which_sessions_an_event_touched() -> None:
    events = shared_prompt_then_two_sessions()
    assert events.take_touched() == {"a", "b"}
    assert events.take_touched() == set()
    events.apply([removed([4])])  # only a's chain has it
    assert events.take_touched() == {"a"}
    events.apply([removed([1])])  # the shared prefix: both
    assert events.take_touched() == {"a", "b"}
    assert (events.blocks("a"), events.blocks("b")) == (0, 0)
    assert events.sessions() == 2


def test_a_gap_in_the_sequence_makes_the_account_untrusted() -> None:
    events = shared_prompt_then_two_sessions()
    events.sequence(7)
    events.sequence(8)
    assert events.trusted
    events.sequence(10)
    assert not events.trusted
    assert events.blocks("a") is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_admission_takes_what_each_session_holds_from_the_events() -> None:
    async def run() -> None:
        clock, events = Clock(), CacheEvents()
        offload = 1000
        gate = SessionAdmission(Costs(lambda: 100, lambda: 0.1, lambda: offload, lambda: 0.001), hot_s=5.0,
                                max_wait_s=30.0, poll_s=0.001, clock=clock, observed=events)
        for sid in "ab":
            await gate.admit(sid, 30)
            gate.finished(sid)
        assert gate.resident_blocks("a") == 30  # the model's own guess: no event yet
        # vLLM says: a kept 2 blocks on the GPU (the rest freed), b none but 5 in the CPU tier, and c,
        # which the model never saw, holds 3.
        events.apply([stored([1, 2, 3], None, "a"), stored([4, 5, 6, 7, 8], None, "b"), stored([9, 10, 11], None, "c"),
                      stored([4, 5, 6, 7, 8], None, medium=CPU), removed([3, 4, 5, 6, 7, 8])])
        clock.now = 1.0
        gate.hold_s("d", 10, 0.0)
        assert gate.resident_blocks("a") == 2
        assert not gate.is_resident("b") and gate.is_offloaded("b")
        assert gate.resident_blocks("c") == 3
        events.sequence(1)
        events.sequence(5)  # dropped events: the model keeps its own from here
        events.apply([removed([1, 2])])
        clock.now = 2.0
        gate.hold_s("d", 10, 0.0)
        assert gate.resident_blocks("a") == 2

    asyncio.run(run())
