"""vLLM's KV events read into what the cache holds per session (server/admission/cache_events.py), on
events built with vLLM's own event classes, and session admission taking its model from them; the
reader on real ZMQ sockets: a batch that does not decode, a gap, a gap the replay endpoint fills."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from server.admission.cache_events import CPU, GPU, CacheEvents, follow
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


# vLLM's publisher over real ZMQ sockets, in process: a PUB socket sends (topic, seq, payload) as vLLM's
# ZmqEventPublisher does (an XPUB here, which hears the reader subscribe), and a ROUTER answers replay
# requests as its replay endpoint does.
ENCODE = msgspec.msgpack.Encoder().encode


def batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> bytes:
    return ENCODE(KVEventBatch(ts=0.0, events=list(events)))


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


class Publisher:
    def __init__(self, context: zmq.asyncio.Context, endpoint: str) -> None:
        self.socket = context.socket(zmq.XPUB)
        self.socket.bind(endpoint)

    async def subscribed(self) -> None:
        await self.socket.recv()  # the reader's subscription

    async def send(self, seq: int, payload: bytes) -> None:
        await self.socket.send_multipart((b"", seq.to_bytes(8, "big"), payload))


async def serve_replay(context: zmq.asyncio.Context, endpoint: str, held: dict[int, bytes]) -> None:
    router = context.socket(zmq.ROUTER)
    router.bind(endpoint)
    try:
        while True:
            client, empty, start = await router.recv_multipart()
            for seq in sorted(s for s in held if s >= int.from_bytes(start, "big")):
                await router.send_multipart((client, empty, b"", seq.to_bytes(8, "big"), held[seq]))
            await router.send_multipart((client, empty, b"", (-1).to_bytes(8, "big", signed=True), b""))
    finally:
        router.close(linger=0)


def reading(tmp_path: Path, test: Callable[[Publisher, CacheEvents, zmq.asyncio.Context], Awaitable[None]],
            replay: bool = False) -> None:
    """`test` against a reader following a publisher (and a replay endpoint) on sockets in `tmp_path`."""
    async def run() -> None:
        context, events = zmq.asyncio.Context(), CacheEvents()
        publisher = Publisher(context, f"ipc://{tmp_path}/events")
        replays = (f"ipc://{tmp_path}/replay",) if replay else ()
        reader = asyncio.create_task(follow(f"ipc://{tmp_path}/events", events, *replays))
        try:
            await publisher.subscribed()
            await test(publisher, events, context)
            assert not reader.done()  # still reading
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            assert not events.trusted  # a stopped reader's account is never read as current
            publisher.socket.close(linger=0)
            context.term()

    asyncio.run(run())


def test_a_batch_that_does_not_decode_is_skipped_and_the_account_trusted_again_after_a_reset(tmp_path: Path) -> None:
    async def test(publisher: Publisher, events: CacheEvents, _: zmq.asyncio.Context) -> None:
        await publisher.send(0, batch(stored([1, 2], None, "a")))
        await until(lambda: events.blocks("a") == 2)
        await publisher.send(1, b"\xc1 not msgpack")
        await until(lambda: events.undecodable == 1)
        assert not events.trusted and events.blocks("a") is None  # it missed what that batch said
        await publisher.send(2, batch(stored([3], 2, "a")))
        await until(lambda: events.next_seq() == 3)
        assert events.blocks("a") is None
        await publisher.send(3, batch(AllBlocksCleared(), stored([5, 6], None, "a")))  # the engine's reset
        await until(lambda: events.trusted)
        assert events.blocks("a") == 2

    reading(tmp_path, test)


def test_a_gap_clears_the_account_until_the_engine_resets_its_cache(tmp_path: Path) -> None:
    async def test(publisher: Publisher, events: CacheEvents, _: zmq.asyncio.Context) -> None:
        await publisher.send(0, batch(stored([1, 2], None, "a")))
        await until(lambda: events.blocks("a") == 2)
        await publisher.send(2, batch(stored([3], 2, "a")))  # 1 was dropped: it may have freed 1 and 2
        await until(lambda: events.next_seq() == 3)
        assert not events.trusted and events.blocks("a") is None
        await publisher.send(3, batch(AllBlocksCleared()))
        await until(lambda: events.trusted)
        assert events.blocks("a") == 0  # what it held before the gap is not counted on

    reading(tmp_path, test)


def test_a_gap_the_replay_endpoint_fills_loses_nothing(tmp_path: Path) -> None:
    held = {0: batch(stored([1, 2], None, "a")), 1: batch(removed([2])), 2: batch(stored([7], None, "b"))}

    async def test(publisher: Publisher, events: CacheEvents, context: zmq.asyncio.Context) -> None:
        replay = asyncio.create_task(serve_replay(context, f"ipc://{tmp_path}/replay", held))
        try:
            await publisher.send(0, held[0])
            await until(lambda: events.blocks("a") == 2)
            await publisher.send(2, held[2])  # 1 was dropped: the replay endpoint still holds it
            await until(lambda: events.next_seq() == 3)
            assert events.trusted and (events.blocks("a"), events.blocks("b")) == (1, 1)
            await publisher.send(3, batch(removed([1])))
            await until(lambda: events.blocks("a") == 0)
        finally:
            replay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replay

    reading(tmp_path, test, replay=True)
