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

Events come over a socket that drops past its high-water mark: a gap in the sequence numbers leaves
the account untrusted (`trusted` False), and admission goes back to its own model.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence

log = logging.getLogger(__name__)

GPU, CPU = "GPU", "CPU"  # vLLM's medium names (vllm.distributed.kv_events.MEDIUM_GPU / MEDIUM_CPU)
# Sessions whose chain is kept; past this the least recently seen are forgotten.
MAX_SESSIONS = 4096
# A chain's ancestry is walked at most this far (a 1M-token context in 16-token blocks, and then some).
MAX_CHAIN = 1 << 17

BlockHash = bytes | int  # vLLM's ExternalBlockHash, as the events carry it


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

    def sequence(self, seq: int) -> None:
        """A batch's sequence number: a gap means events were dropped, and the account cannot be trusted."""
        if self._seq is not None and seq != self._seq + 1 and self.trusted:
            self.trusted = False
            log.warning("KV events %d to %d were dropped: session admission goes back to its own model of the "
                        "cache", self._seq + 1, seq - 1)
        self._seq = seq

    def apply(self, events: Iterable[object]) -> None:
        """vLLM's BlockStored, BlockRemoved and AllBlocksCleared events, in the order published."""
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        for event in events:
            if isinstance(event, BlockStored):
                self._stored(event.block_hashes, event.parent_block_hash, event.medium, event.session_id)
            elif isinstance(event, BlockRemoved):
                self._removed(event.block_hashes, event.medium)
            elif isinstance(event, AllBlocksCleared):
                self._gpu.clear()
                self._cpu.clear()
                self._parent.clear()
                for session_id in self._chains:
                    self._touch(session_id)

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


async def follow(endpoint: str, events: CacheEvents) -> None:
    """Read vLLM's published KV event batches from `endpoint` into `events` until cancelled."""
    import msgspec
    import zmq
    import zmq.asyncio
    from vllm.distributed.kv_events import KVEventBatch

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    try:
        while True:
            _topic, seq, payload = await socket.recv_multipart()
            events.sequence(int.from_bytes(seq, "big"))
            events.apply(decoder.decode(payload).events)
    finally:
        socket.close(linger=0)
        context.term()
