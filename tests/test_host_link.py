"""The emulated worker side of vLLM's CPU offloading: each job takes its bytes over the host link."""

from __future__ import annotations

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    TransferJob,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from server.emulation.host_link import HostLink

BLOCK = 2 * 1024 * 1024  # one 16-token block of Llama-3.1-8B's KV
LINK = 40e9


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gpu(blocks: int) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(list(range(blocks)), group_sizes=[blocks], block_indices=[0])


def load(req: str, blocks: int) -> TransferJob:
    return TransferJob(req, CPULoadStoreSpec(list(range(blocks))), gpu(blocks))


def store(req: str, blocks: int) -> TransferJob:
    return TransferJob(req, gpu(blocks), CPULoadStoreSpec(list(range(blocks))))


def meta(loads: dict[int, TransferJob] | None = None, stores: dict[int, TransferJob] | None = None,
         flush: set[int] | None = None) -> OffloadingConnectorMetadata:
    return OffloadingConnectorMetadata(load_jobs=loads or {}, store_jobs=stores or {}, jobs_to_flush=flush)


def worker_meta(link: HostLink) -> tuple[set[str], OffloadingWorkerMetadata | None]:
    out = link.finished()
    if out is None:
        return set(), None
    assert isinstance(out.kv_connector_worker_meta, OffloadingWorkerMetadata)
    return out.finished_recving or set(), out.kv_connector_worker_meta


def test_a_load_is_done_after_its_bytes_cross_the_link_and_not_before() -> None:
    clock = Clock()
    link = HostLink(LINK, BLOCK, clock)
    assert link.before_step(meta(loads={7: load("a", 1000)})) == 0.0
    seconds = 1000 * BLOCK / LINK  # 2 GiB: ~54 ms
    clock.now += seconds * 0.99
    assert link.finished() is None and link.next_done_in() == pytest.approx(seconds * 0.01)
    clock.now += seconds * 0.02
    loaded, done = worker_meta(link)
    assert loaded == {"a"} and done is not None and done.completed_jobs == {7: 1}
    assert done.transfer_stats.load.bytes == 1000 * BLOCK
    assert done.transfer_stats.load.time == pytest.approx(seconds) and done.transfer_stats.store.is_empty()
    assert link.finished() is None and link.next_done_in() is None


def test_copies_one_way_queue_behind_each_other_and_the_two_ways_do_not_wait() -> None:
    clock = Clock()
    link = HostLink(LINK, BLOCK, clock)
    link.before_step(meta(loads={1: load("a", 100), 2: load("b", 100)}))
    link.after_step(meta(stores={3: store("c", 100)}))
    link.before_step(meta())  # the store starts with the next step
    one = 100 * BLOCK / LINK
    clock.now += one * 1.01
    loaded, done = worker_meta(link)
    assert loaded == {"a"} and done is not None and set(done.completed_jobs) == {1, 3}
    assert done.transfer_stats.store.bytes == 100 * BLOCK
    clock.now += one
    assert worker_meta(link)[0] == {"b"}


def test_a_stores_copy_waits_for_the_next_step_and_a_flushed_one_is_waited_for() -> None:
    clock = Clock()
    link = HostLink(LINK, BLOCK, clock)
    link.after_step(meta(stores={1: store("a", 100)}))
    clock.now += 1.0
    assert link.finished() is None  # not started yet: nothing is done however long it has been
    # A preemption: the scheduler must see job 2 stored before it reuses its blocks.
    wait = link.before_step(meta(stores={2: store("b", 50)}, flush={2}))
    assert wait == pytest.approx(150 * BLOCK / LINK)  # behind job 1 on the link
    clock.now += wait
    assert set(worker_meta(link)[1].completed_jobs) == {1, 2}  # type: ignore[union-attr]


def test_a_job_without_gpu_blocks_on_the_device_side_is_refused() -> None:
    link = HostLink(LINK, BLOCK, Clock())
    wrong = TransferJob("a", CPULoadStoreSpec([1]), CPULoadStoreSpec([2]))
    with pytest.raises(TypeError, match="offload job 4: expected GPU blocks"):
        link.before_step(meta(loads={4: wrong}))
