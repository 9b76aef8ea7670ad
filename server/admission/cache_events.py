"""vLLM's own account of its KV cache, per session, read from the KV events its scheduler publishes.

Session admission models what the cache holds of each session's prefix. Its own model replays vLLM's
least-recently-used order from what it sent; the engine knows better. vLLM publishes every block it
caches and every block it frees (`--kv-events-config`, over ZMQ), for the GPU and for the CPU tier of
its offloading connector, and tags a stored block with the session of the request that stored it
(the request's `session_id`, which AHC's recording engine sets to the turn's session).

From those events this keeps, for each session, the chain of block hashes its last request ran
through (the blocks it stored, and the shared prefix they hang from, by each block's parent), and which
hashes each tier holds. What a session would hit is then what vLLM's prefix lookup finds: the leading
blocks of its chain the tier holds, up to the first it does not.

Counting is kept off the hot path: a session's count is recounted only when an event touched a block
of its chain, and a reader learns which sessions those are (`take_touched`) rather than asking each.

Events come over a socket that drops past its high-water mark. When a batch is lost (a gap in the
sequence numbers, a batch that does not decode, the reader stopped) the account is cleared and left
untrusted (`trusted` False): admission goes back to its own model rather than use an account that
missed frees and stores. With vLLM's replay endpoint (`replay_endpoint` of `--kv-events-config`), the
reader first asks it for the missed batches, and a gap it fills loses nothing. The account is trusted
again at the next full resynchronisation: an AllBlocksCleared event, after which the engine holds
nothing the account does not know. A batch that does not decode is logged (at most once a minute),
counted (`undecodable`) and skipped; the reader goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GPU, CPU = "GPU", "CPU"  # vLLM's medium names (vllm.distributed.kv_events.MEDIUM_GPU / MEDIUM_CPU)
# Sessions whose chain is kept; past this the least recently seen are forgotten.
MAX_SESSIONS = 4096
# A chain's ancestry is walked at most this far (a 1M-token context in 16-token blocks, and then some).
MAX_CHAIN = 1 << 17

BlockHash = bytes | int  # vLLM's ExternalBlockHash, as the events carry it
UNDECODABLE_LOG_S = 60.0  # at most one log line a minute for batches that do not decode
REPLAY_TIMEOUT_S = 2.0  # the replay endpoint's answer, before the gap is taken as lost
END_SEQ = -1  # what vLLM's replay endpoint sends after the last batch it holds
RESTART_S = 1.0  # a failed reader's pause before it connects again


class CacheEvents:
    """See the module docstring. `apply` takes the decoded events in order; `blocks` answers."""

    def __init__(self) -> None:
        self._gpu: set[BlockHash] = set()  # the GPU frees a block once: a set
        self._cpu: Counter[BlockHash] = Counter()  # the tier may announce a hash once per chunk holding it
        self._parent: dict[BlockHash, BlockHash | None] = {}
        self._chains: OrderedDict[str, list[BlockHash]] = OrderedDict()
        self._members: dict[BlockHash, set[str]] = {}  # the sessions whose chain has the block
        self._counted: dict[tuple[str, str], int] = {}  # (session, medium) → blocks, until an event touches it
        self._touched: set[str] = set()
        self._seq: int | None = None
        self.trusted = True
        self.undecodable = 0  # batches skipped because they did not decode

    def blocks(self, session_id: str, medium: str = GPU) -> int | None:
        """The leading blocks of the session's chain the medium holds (what its next request would find
        there, up to its own growth); None when no event named the session or the account is untrusted."""
        chain = self._chains.get(session_id)
        if chain is None or not self.trusted:
            return None
        count = self._counted.get((session_id, medium))
        if count is None:
            held: set[BlockHash] | Counter[BlockHash] = self._gpu if medium == GPU else self._cpu
            count = 0
            for block in chain:
                if block not in held:
                    break
                count += 1
            self._counted[(session_id, medium)] = count
        return count

    def sessions(self) -> int:
        """How many sessions have a chain."""
        return len(self._chains)

    def take_touched(self) -> set[str]:
        """The sessions whose counts may have changed since the last call."""
        touched, self._touched = self._touched, set()
        return touched

    def _touch(self, session_id: str) -> None:
        self._counted.pop((session_id, GPU), None)
        self._counted.pop((session_id, CPU), None)
        self._touched.add(session_id)

    def _touch_members(self, block: BlockHash) -> None:
        for session_id in self._members.get(block, ()):
            self._touch(session_id)

    def next_seq(self) -> int | None:
        """The sequence number the next batch should carry (None before the first)."""
        return None if self._seq is None else self._seq + 1

    def sequence(self, seq: int) -> None:
        """A batch's sequence number: a gap means events were dropped, and the account cannot be trusted."""
        if self._seq is not None and seq != self._seq + 1:
            self.lost(f"KV events {self._seq + 1} to {seq - 1} were dropped")
        self._seq = seq

    def lost(self, why: str) -> None:
        """Events were lost: what the account holds is cleared, and it is untrusted until the engine's next
        AllBlocksCleared (it goes on learning from the events it does get)."""
        if self.trusted:
            log.warning("%s: session admission goes back to its own model of the cache until the engine's "
                        "prefix cache is next reset", why)
        self.trusted = False
        self._cleared()

    def _cleared(self) -> None:
        self._gpu.clear()
        self._cpu.clear()
        self._parent.clear()
        for session_id in self._chains:
            self._touch(session_id)

    def apply(self, events: Iterable[object]) -> None:
        """vLLM's BlockStored, BlockRemoved and AllBlocksCleared events, in the order published."""
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        for event in events:
            if isinstance(event, BlockStored):
                self._stored(event.block_hashes, event.parent_block_hash, event.medium, event.session_id)
            elif isinstance(event, BlockRemoved):
                self._removed(event.block_hashes, event.medium)
            elif isinstance(event, AllBlocksCleared):
                self._cleared()
                if not self.trusted:  # the engine holds nothing now, as the account says: in step again
                    self.trusted = True
                    log.info("the engine's prefix cache was reset: session admission reads its KV events again")

    def _stored(self, hashes: Sequence[BlockHash], parent: BlockHash | None, medium: str | None,
                session_id: str | None) -> None:
        if not hashes:
            return
        for block, above in zip(hashes, [parent, *hashes[:-1]], strict=True):
            self._parent[block] = above
            self._touch_members(block)
        (self._cpu if medium == CPU else self._gpu).update(hashes)
        if session_id is None or medium == CPU:
            return
        chain = self._chains.pop(session_id, None)
        if chain is not None and parent is not None and chain and chain[-1] == parent:
            chain.extend(hashes)  # the same request going on (a prefill chunk, a reply's next block)
            added: list[BlockHash] = list(hashes)
        else:
            if chain is not None:
                self._leave(session_id, chain)
            chain = [*self._ancestry(parent), *hashes]
            added = chain
        for block in added:
            self._members.setdefault(block, set()).add(session_id)
        self._chains[session_id] = chain
        self._touch(session_id)
        while len(self._chains) > MAX_SESSIONS:
            self._leave(*self._chains.popitem(last=False))

    def _leave(self, session_id: str, chain: list[BlockHash]) -> None:
        for block in chain:
            members = self._members.get(block)
            if members is not None:
                members.discard(session_id)
                if not members:
                    del self._members[block]
        self._counted.pop((session_id, GPU), None)
        self._counted.pop((session_id, CPU), None)

    def _ancestry(self, parent: BlockHash | None) -> list[BlockHash]:
        """The chain down to `parent`, root first. A parent no event announced (dropped, or cached before
        the account started) is kept as itself: no tier holds it as far as the account knows, so what
        hangs from it counts as a miss, as it would in vLLM's lookup."""
        chain: list[BlockHash] = []
        while parent is not None and len(chain) < MAX_CHAIN:
            chain.append(parent)
            parent = self._parent.get(parent)
        chain.reverse()
        return chain

    def _removed(self, hashes: Sequence[BlockHash], medium: str | None) -> None:
        for block in hashes:
            self._touch_members(block)
            if medium == CPU:
                self._cpu[block] -= 1
                if self._cpu[block] <= 0:
                    del self._cpu[block]
            else:
                self._gpu.discard(block)
            if block not in self._gpu and block not in self._cpu:
                self._parent.pop(block, None)


@dataclass
class _Throttle:
    """Lets one log line through per `every_s`."""

    every_s: float
    clock: Callable[[], float] = time.monotonic
    last: float | None = None

    def ready(self) -> bool:
        now = self.clock()
        if self.last is not None and now - self.last < self.every_s:
            return False
        self.last = now
        return True


def _take(events: CacheEvents, decoder: Any, seq: int, payload: bytes, throttle: _Throttle) -> None:
    """One batch into the account; one that does not decode, or that the account cannot apply, is
    counted, logged and lost."""
    events.sequence(seq)
    try:
        events.apply(decoder.decode(payload).events)
    except Exception as exc:  # msgspec's DecodeError or ValidationError: a batch this vLLM did not write
        events.undecodable += 1
        if throttle.ready():
            log.warning("KV event batch %d does not decode (%r); %d so far", seq, exc, events.undecodable)
        events.lost(f"KV event batch {seq} did not decode")


async def _replayed(context: Any, replay: str, start: int) -> list[tuple[int, bytes]]:
    """The batches vLLM's replay endpoint still holds from `start` on (none if it does not answer)."""
    import zmq

    socket = context.socket(zmq.DEALER)
    socket.connect(replay)
    batches: list[tuple[int, bytes]] = []
    try:
        await socket.send_multipart((b"", start.to_bytes(8, "big")))
        while await socket.poll(int(REPLAY_TIMEOUT_S * 1000)):
            _empty, _topic, seq, payload = await socket.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == END_SEQ:
                break
            batches.append((int.from_bytes(seq, "big"), payload))
    finally:
        socket.close(linger=0)
    return batches


async def follow(endpoint: str, events: CacheEvents, replay: str | None = None,
                 restart_s: float = RESTART_S) -> None:
    """Read vLLM's published KV event batches from `endpoint` into `events` until cancelled; `replay`:
    the publisher's replay endpoint, asked for what a gap missed. A reader that fails is started again
    after `restart_s`, the account untrusted meanwhile; a cancelled one leaves it untrusted too: it is
    never trusted and frozen."""
    throttle = _Throttle(UNDECODABLE_LOG_S)
    while True:
        try:
            await _read(endpoint, events, replay, throttle)
        except asyncio.CancelledError:
            events.trusted = False
            raise
        except Exception:
            log.exception("the KV events reader failed; it starts again in %.0f s", restart_s)
            events.lost("the KV events reader failed")
        await asyncio.sleep(restart_s)


async def _read(endpoint: str, events: CacheEvents, replay: str | None, throttle: _Throttle) -> None:
    import msgspec
    import zmq
    import zmq.asyncio
    from vllm.distributed.kv_events import KVEventBatch

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    replayed_to = -1  # the last batch taken from the replay endpoint, which the live stream repeats
    try:
        while True:
            _topic, seq_bytes, payload = await socket.recv_multipart()
            seq, expected = int.from_bytes(seq_bytes, "big"), events.next_seq()
            if seq <= replayed_to:
                continue
            if expected is not None and seq > expected and replay is not None:
                for missed, missed_payload in await _replayed(context, replay, expected):
                    if missed > replayed_to:
                        _take(events, decoder, missed, missed_payload, throttle)
                        replayed_to = missed
                if seq <= replayed_to:
                    continue
            _take(events, decoder, seq, payload, throttle)
            replayed_to = -1  # the live stream is past what was replayed: a lower number is a restart
    finally:
        socket.close(linger=0)
        context.term()
