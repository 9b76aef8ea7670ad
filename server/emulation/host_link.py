"""The worker side of vLLM's native CPU KV offloading (`--kv-offloading-size`, backend `native`), on a
modelled host link: what the emulated executor does with the offloading connector's jobs.

vLLM's `OffloadingConnector` runs its scheduler side unchanged in the engine core: it decides which
blocks go to host memory and which come back, and hands each step's jobs to the workers in
`SchedulerOutput.kv_connector_metadata`. A GPU worker copies the blocks by DMA and reports each job
done in `KVConnectorOutput`; here each job takes its bytes over the link at its bandwidth, one copy at
a time per direction (a PCIe link is full duplex: loads and stores do not wait for each other), and is
reported done once that time has passed. No memory is allocated. As on a GPU worker, a step's stores
start after its forward pass (they must not delay sampling), and stores the scheduler must see finished
before it reuses their blocks (a preemption's) are waited for before the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    TransferJob,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.outputs import KVConnectorOutput


@dataclass
class _Copy:
    job_id: int
    req_id: str
    load: bool  # host to GPU; else a store, GPU to host
    bytes: int
    done_at: float
    seconds: float


@dataclass
class HostLink:
    """Transfer jobs in flight on one GPU's host link. `bandwidth`: bytes/s each direction;
    `bytes_per_block`: one GPU KV block (every layer's K and V)."""

    bandwidth: float
    bytes_per_block: int
    clock: Callable[[], float] = time.perf_counter
    _free_at: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    _in_flight: dict[int, _Copy] = field(default_factory=dict)
    _deferred: dict[int, TransferJob] = field(default_factory=dict)  # stores waiting for the next step

    def before_step(self, meta: OffloadingConnectorMetadata) -> float:
        """Start the step's loads and the previous step's stores; a preemption's stores (`jobs_to_flush`)
        start now too. Returns the seconds the step must wait first: until those flushed stores are done."""
        flush = meta.jobs_to_flush or set()
        for job_id in flush:
            job = meta.store_jobs.pop(job_id, None)
            if job is not None:
                self._deferred[job_id] = job
        for job_id, job in self._deferred.items():
            self._start(job_id, job, load=False)
        self._deferred.clear()
        for job_id, job in meta.load_jobs.items():
            self._start(job_id, job, load=True)
        flushed = [self._in_flight[j].done_at for j in flush if j in self._in_flight]
        return max(max(flushed, default=0.0) - self.clock(), 0.0)

    def after_step(self, meta: OffloadingConnectorMetadata) -> None:
        """The step's stores start with the next step, after this one's forward pass."""
        self._deferred.update(meta.store_jobs)

    def finished(self) -> KVConnectorOutput | None:
        """The jobs done by now, as a worker reports them: each job's id to the scheduler side (with
        its bytes and seconds for vLLM's offload metrics), and the requests whose loads are done."""
        now = self.clock()
        done = [c for c in self._in_flight.values() if c.done_at <= now]
        if not done:
            return None
        meta = OffloadingWorkerMetadata()
        loaded: set[str] = set()
        for copy in done:
            del self._in_flight[copy.job_id]
            meta.mark_completed(copy.job_id)
            (meta.transfer_stats.load if copy.load else meta.transfer_stats.store).record(copy.bytes, copy.seconds)
            if copy.load:
                loaded.add(copy.req_id)
        return KVConnectorOutput(finished_recving=loaded, kv_connector_worker_meta=meta)

    def next_done_in(self) -> float | None:
        """Seconds until the next job in flight is done (None: none is)."""
        if not self._in_flight:
            return None
        return max(min(c.done_at for c in self._in_flight.values()) - self.clock(), 0.0)

    def _start(self, job_id: int, job: TransferJob, load: bool) -> None:
        gpu = job.dst_spec if load else job.src_spec
        if not isinstance(gpu, GPULoadStoreSpec):
            raise TypeError(f"offload job {job_id}: expected GPU blocks on the device side, got {type(gpu).__name__}")
        size = len(gpu.block_ids) * self.bytes_per_block
        seconds = size / self.bandwidth
        start = max(self.clock(), self._free_at[load])
        self._free_at[load] = start + seconds
        self._in_flight[job_id] = _Copy(job_id, job.req_id, load, size, start + seconds, seconds)
