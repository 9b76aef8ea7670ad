"""The side channel that carries activations from vLLM's worker process to the XDB writer.

vLLM's EngineCoreOutput has no per-token field we could ride on, so the worker PUSHes the rows of its
engine steps, bundled every 20 ms, over a ZMQ `ipc://` socket and the process that writes XDB (the XDB
service, or the server itself when XDB runs in-process) PULLs them on a thread of its own. They never
pass through the API process's event loop: it sends each token's request key and output position with
the token, and the writer joins the two. A message is three frames: a small JSON header (request keys,
output positions, k, source, its sender and what it covers, and hidden_k) and the raw int32 concept indices
and float32 values, [rows, k] each, so nothing is pickled and no Python object is made a value. A row's last
hidden_k slots are its hidden concepts' (lens.hidden, indexing those alone), the others its visible ones'.

A message also says how far its sender has shipped: every row the sender took up to `covers` (its wall
clock) is in that message or an earlier one. A token reaches the writer after its step's rows were taken,
so once a sender's message covers the time a token batch was made, rows of the batch still missing will
not come (dropped, or never taken), and the writer stops waiting for them.

Request keys: vLLM's AsyncLLM makes the id the worker sees from the one the API process passed:
`f"{id}-{random 8 hex}"` (InputProcessor.assign_request_id), and for n > 1 each child is
`f"{index}_{id}-{random}"` (ParentRequest.get_child_info). The worker strips the random suffix; the
API process rebuilds the same key from the request id, n and the completion's index.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("ahc.lens")

_RANDOM_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
# A slow consumer must not make the worker block: past this many queued messages ZMQ drops.
_HIGH_WATER_MARK = 10_000


def engine_key(internal_request_id: str) -> str:
    """The key of a request as the worker sees it (vLLM's internal id without its random suffix)."""
    return _RANDOM_SUFFIX.sub("", internal_request_id)


def completion_key(request_id: str, n: int, index: int) -> str:
    """The same key from the API side: the request id given to generate, n and the completion index."""
    return request_id if n <= 1 else f"{index}_{request_id}"


@dataclass
class StepActivations:
    """One engine step's activations: row i is output token `positions[i]` of request `keys[i]`."""

    keys: list[str]
    positions: list[int]
    concept_index: np.ndarray  # int32 [rows, k]
    concept_values: np.ndarray  # float32 [rows, k]
    source: str  # "hidden_state" | "logit_lens" | "emulated" (the emulated engine draws them)
    sender: str = ""  # the shipping process
    covers: float = 0.0  # the sender's rows taken up to this time (time.time()) are in this message or before
    hidden_k: int = 0  # a row's last hidden_k slots are hidden concepts' (lens.hidden), for the audit log alone

    def frames(self) -> list[bytes]:
        header = {"keys": self.keys, "positions": self.positions, "k": int(self.concept_index.shape[1]),
                  "source": self.source, "sender": self.sender, "covers": self.covers, "hidden_k": self.hidden_k}
        return [json.dumps(header, separators=(",", ":")).encode(),
                np.ascontiguousarray(self.concept_index, dtype=np.int32).tobytes(),
                np.ascontiguousarray(self.concept_values, dtype=np.float32).tobytes()]

    @classmethod
    def from_frames(cls, frames: list[Any]) -> StepActivations:
        """A message as sent; anything else (a socket is reachable by other local processes) raises
        ValueError naming what is wrong."""
        if len(frames) != 3:
            raise ValueError(f"activation message: expected 3 frames, got {len(frames)}")
        header = json.loads(bytes(frames[0]))  # a JSONDecodeError is a ValueError
        if not isinstance(header, dict):
            raise ValueError("activation message: the header is not a JSON object")
        keys, positions, k, source = (header.get(name) for name in ("keys", "positions", "k", "source"))
        if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
            raise ValueError("activation message: keys must be a list of strings")
        if not isinstance(positions, list) or len(positions) != len(keys) or not all(
                type(p) is int and p >= 0 for p in positions):
            raise ValueError("activation message: positions must be one non-negative integer per key")
        if type(k) is not int or k <= 0 or not isinstance(source, str):
            raise ValueError("activation message: k must be a positive integer and source a string")
        sender, covers, hidden_k = header.get("sender", ""), header.get("covers", 0.0), header.get("hidden_k", 0)
        if type(hidden_k) is not int or not 0 <= hidden_k <= k:
            raise ValueError("activation message: hidden_k must be an integer from 0 to k")
        if not isinstance(sender, str) or type(covers) not in (int, float):
            raise ValueError("activation message: sender must be a string and covers a number")
        size = len(keys) * k * 4
        if len(frames[1]) != size or len(frames[2]) != size:
            raise ValueError(f"activation message: {len(keys)} rows of {k} need {size}-byte frames")
        index = np.frombuffer(frames[1], dtype=np.int32).reshape(len(keys), k)
        values = np.frombuffer(frames[2], dtype=np.float32).reshape(len(keys), k)
        return cls(keys, positions, index, values, source, sender, float(covers), hidden_k)


class ActivationSender:
    """Worker side: PUSH to the writer; never blocks the engine step (drops if nobody reads)."""

    def __init__(self, address: str) -> None:
        import zmq

        self._context: zmq.SyncContext = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, _HIGH_WATER_MARK)
        self._socket.setsockopt(zmq.LINGER, 1000)
        self._socket.connect(address)
        self._noblock = zmq.NOBLOCK
        self._again = zmq.Again

    def send(self, step: StepActivations) -> None:
        try:
            self._socket.send_multipart(step.frames(), flags=self._noblock, copy=False)
        except self._again:
            pass  # the writer is gone or far behind: its tokens get no activations, never wrong ones

    def close(self) -> None:
        self._socket.close()


@dataclass
class _Pending:
    """One step's rows on their way out; on an accelerator the host copies are valid once `ready` has
    completed, and `rows` then picks the rows kept from them."""

    keys: list[str]
    positions: list[int]
    index: Any
    values: Any
    rows: np.ndarray | None = None
    ready: Any = None  # a device event


class BundlingSender:
    """Worker side: take each step's top-k and ship the steps of every `interval_s` as one message,
    from a thread of its own.

    A message per engine step woke ZMQ's I/O thread once a step on the worker's own (bound) core: the
    largest share of capture's cost on a CPU engine. The writer drains its socket every 50 ms, so
    bundles of 20 ms reach it no later. On an accelerator the step's top-k is copied to
    pinned host memory without synchronising the step; the thread waits for the copy's event."""

    def __init__(self, sender: ActivationSender, on_host: bool, interval_s: float = 0.02) -> None:
        self._sender, self._on_host, self.interval_s = sender, on_host, interval_s
        self._pending: list[_Pending] = []
        self._source = "hidden_state"
        self.hidden_k = 0  # each row's last slots that are hidden concepts' (set by StepCapture)
        self._name = str(os.getpid())  # ipc:// senders share the writer's host
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ahc-lens-sender", daemon=True)
        self._thread.start()

    def add(self, keys: list[str], positions: list[int], rows: np.ndarray, index: Any, values: Any,
            source: str) -> None:
        """One step: `rows` of the [n, k] tensors `index` and `values` belong to `keys` at `positions`."""
        if self._on_host:
            item = _Pending(keys, positions, index.numpy()[rows].astype(np.int32), values.numpy()[rows])
        else:
            item = self._device_copy(keys, positions, rows, index, values)
        self._source = source
        with self._lock:
            self._pending.append(item)
        if not self._wake.is_set():
            self._wake.set()

    @staticmethod
    def _device_copy(keys: list[str], positions: list[int], rows: np.ndarray, index: Any, values: Any) -> _Pending:
        import torch

        host_index = torch.empty(index.shape, dtype=torch.int32, pin_memory=True)
        host_values = torch.empty(values.shape, dtype=torch.float32, pin_memory=True)
        host_index.copy_(index, non_blocking=True)
        host_values.copy_(values, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves Event.__new__ unannotated
        event.record()
        return _Pending(keys, positions, host_index, host_values, rows, event)

    def _run(self) -> None:
        while not self._closing.is_set():
            self._wake.wait()
            self._closing.wait(self.interval_s)  # let the interval's steps gather
            self._wake.clear()  # before taking them: a step added after this wakes the next round
            self._ship()
        self._ship()

    def _ship(self) -> None:
        with self._lock:
            covers = time.time()  # every row added before now is among these items or shipped already
            items, self._pending = self._pending, []
        if not items:
            return
        for item in items:
            if item.ready is not None:
                item.ready.synchronize()
                item.index, item.values = item.index.numpy()[item.rows], item.values.numpy()[item.rows]
        self._sender.send(StepActivations([key for item in items for key in item.keys],
                                          [pos for item in items for pos in item.positions],
                                          np.concatenate([item.index for item in items]),
                                          np.concatenate([item.values for item in items]), self._source,
                                          self._name, covers, self.hidden_k))

    def close(self) -> None:
        """Ship what is pending, then close the socket."""
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._sender.close()


class ActivationReceiver:
    """Writer side: a thread that PULLs step messages and hands each to `deliver`."""

    def __init__(self, address: str, deliver: Callable[[StepActivations], None],
                 on_idle: Callable[[], None] = lambda: None, drain_interval_s: float = 0.05) -> None:
        import zmq

        self._context: zmq.SyncContext = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.RCVHWM, _HIGH_WATER_MARK)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(address)  # bound before the engine starts, so no early step is lost
        self._deliver, self._on_idle = deliver, on_idle
        # Woken at most this often while steps stream in: each wake takes the GIL from the process's
        # other threads, and at GPU rates one per engine step costs more than the messages themselves.
        # Tokens reach the writer in chunks anyway (the recorder's TokenStream); a writer waiting for
        # a token's rows calls `wake` so it does not wait out the interval.
        self.drain_interval_s = drain_interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.dropped = 0  # messages refused as malformed
        self._thread = threading.Thread(target=self._run, name="ahc-lens-receiver", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Receiving: its thread runs (a dead one would leave every later token without activations)."""
        return self._thread.is_alive()

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                self._drain(poller)
            except Exception:  # whatever one round met, the next round runs: logged, never silent
                log.exception("activation receiver: a round failed; receiving goes on")
                self._stop.wait(0.1)

    def _drain(self, poller: Any) -> None:
        import zmq

        if not poller.poll(500):
            self._on_idle()
            return
        while True:
            try:
                frames = self._socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                self._deliver(StepActivations.from_frames(frames))
            except Exception as exc:  # a malformed message loses its rows, not the thread
                self.dropped += 1
                log.warning("activation receiver: dropped a bad message (%d so far): %s", self.dropped, exc)
        self._on_idle()
        self._wake.wait(self.drain_interval_s)
        self._wake.clear()

    def wake(self) -> None:
        """Drain the socket now rather than at the end of the interval."""
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._socket.close()
