"""A roofline cost model of one GPU serving one dense transformer: how long a scheduler step takes,
and how many KV blocks the GPU holds after the weights.

A step reads every weight once plus the KV of every token its sequences attend to, and does two FLOPs
per weight per token plus attention's; it takes the longer of its memory time and its compute time at
achieved fractions of the GPU's peak, plus a fixed overhead (kernel launches, sampling, the
scheduler). Decode is bandwidth-bound, prefill compute-bound, a mixed (chunked-prefill) step whichever
dominates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    bandwidth: float  # HBM bytes/s
    bf16_flops: float  # dense tensor-core FLOP/s
    host_bandwidth: float  # bytes/s a pinned copy between GPU and host memory achieves, each direction


@dataclass(frozen=True)
class Transformer:
    name: str
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_position: int
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def matmul_params(self) -> int:
        """The weights a token multiplies through, less the LM head (only sampled tokens go through it)
        and the embedding table (a lookup)."""
        return self.params - 2 * self.vocab * self.hidden


@dataclass(frozen=True)
class SequenceStep:
    """One sequence's share of a step: `new` tokens computed after `cached` already in its KV."""

    new: int
    cached: int
    sampled: bool  # the chunk reaches the end of what is known: a token is sampled after it


@dataclass(frozen=True)
class Roofline:
    gpu: GPU
    model: Transformer
    bandwidth_efficiency: float  # achieved share of HBM bandwidth in a decode step
    flops_efficiency: float  # achieved share of tensor-core peak in a prefill step
    step_overhead_s: float  # per step, whatever the batch
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: int = 0  # peak activations and the CUDA context, held back from the KV cache

    def step_flops(self, chunks: Sequence[SequenceStep]) -> float:
        m = self.model
        tokens = sum(c.new for c in chunks)
        sampled = sum(c.sampled for c in chunks)
        # Causal attention: each new token attends to the cached ones and half the new ones on average;
        # QK^T and AV are two matmuls of 2 FLOPs a multiply-add.
        attended = sum(c.new * (c.cached + (c.new + 1) / 2) for c in chunks)
        attention = 4 * m.layers * m.heads * m.head_dim * attended
        return 2 * m.matmul_params * tokens + 2 * m.vocab * m.hidden * sampled + attention

    def step_bytes(self, chunks: Sequence[SequenceStep]) -> float:
        m = self.model
        kv_read = sum(c.cached + c.new for c in chunks) * m.kv_bytes_per_token
        kv_written = sum(c.new for c in chunks) * m.kv_bytes_per_token
        return m.weight_bytes + kv_read + kv_written

    def step_seconds(self, chunks: Sequence[SequenceStep]) -> float:
        """The modelled GPU time of one scheduler step (0 for an empty one)."""
        if not chunks:
            return 0.0
        memory = self.step_bytes(chunks) / (self.gpu.bandwidth * self.bandwidth_efficiency)
        compute = self.step_flops(chunks) / (self.gpu.bf16_flops * self.flops_efficiency)
        return max(memory, compute) + self.step_overhead_s

    def kv_cache_bytes(self) -> int:
        """What vLLM would give the KV cache: the GPU's memory at its utilization, less the weights and
        the activations' reserve."""
        usable = int(self.gpu.memory_bytes * self.gpu_memory_utilization)
        return usable - self.model.weight_bytes - self.activation_reserve_bytes

    def kv_tokens(self) -> int:
        return self.kv_cache_bytes() // self.model.kv_bytes_per_token
