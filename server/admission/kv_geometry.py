"""The KV cache's shape in bytes: what one token costs and how many the engine can hold.

Both the VRAM metrics and the VRAM governor reason in these units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True)
class KVGeometry:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int
    num_blocks: int
    on_gpu: bool
    # Physical (NVML) indices of the engine's GPUs: CUDA_VISIBLE_DEVICES may map the engine's first GPU
    # to any of the machine's.
    devices: tuple[int, ...] = ()
    # Ranks sharing the model: layers and KV heads above are one rank's, an offload buffer is all of theirs.
    ranks: int = 1

    @property
    def bytes_per_token(self) -> int:
        # K and V, for every layer and KV head.
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.bytes_per_token

    @staticmethod
    def from_vllm_config(config: VllmConfig) -> KVGeometry:
        import torch
        from vllm.platforms import current_platform

        model, cache, parallel = config.model_config, config.cache_config, config.parallel_config
        on_gpu = current_platform.is_cuda_alike()
        devices = tuple(int(current_platform.device_id_to_physical_device_id(rank))
                        for rank in range(parallel.world_size)) if on_gpu else ()
        if cache.cache_dtype in ("auto", None):
            assert isinstance(model.dtype, torch.dtype)  # ModelConfig's post-init resolves "auto" and names
            dtype_bytes = torch.empty((), dtype=model.dtype).element_size()
        else:
            dtype_bytes = 1 if "fp8" in str(cache.cache_dtype) else 2
        return KVGeometry(
            layers=model.get_num_layers(parallel),
            kv_heads=model.get_num_kv_heads(parallel),
            head_dim=model.get_head_size(),
            dtype_bytes=dtype_bytes,
            block_size=cache.block_size,
            num_blocks=cache.num_gpu_blocks or 0,
            on_gpu=on_gpu,
            devices=devices,
            ranks=parallel.world_size,
        )


@dataclass(frozen=True)
class DeviceMemory:
    used_bytes: float
    total_bytes: float


def device_memory(kv_usage: float, geometry: KVGeometry) -> DeviceMemory:
    """Memory of the engine's GPUs from NVML (nvidia-ml-py); on the CPU, the KV cache's host bytes."""
    if geometry.on_gpu:
        gpu = _nvml_memory(geometry.devices or (0,))
        if gpu is not None:
            return gpu
    total = geometry.total_bytes
    return DeviceMemory(used_bytes=kv_usage * total, total_bytes=total)


def _nvml_memory(devices: tuple[int, ...]) -> DeviceMemory | None:
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        infos = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in devices]
        return DeviceMemory(used_bytes=float(sum(i.used for i in infos)),
                            total_bytes=float(sum(i.total for i in infos)))
    finally:
        pynvml.nvmlShutdown()
