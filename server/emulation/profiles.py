"""The emulated GPU-and-model pairs, by name (`ahc serve --emulate NAME`). Where each figure comes from
is cited beside it; docs/emulation.md compares the model with published vLLM measurements."""

from __future__ import annotations

from server.emulation.roofline import GPU, Roofline, Transformer

GIB = 1024**3

# NVIDIA H100 Tensor Core GPU datasheet, SXM5 80 GB: HBM3 3.35 TB/s; BF16 tensor core 1,979 TFLOPS with
# sparsity, i.e. 989.5 dense. Host link: PCIe Gen5 x16 (64 GB/s each way on paper); a pinned
# device-to-host copy of 1.29 GB on an H100 80GB HBM3 ran at 41.6 GB/s (torch 2.11, measured 2026-11-27).
H100_SXM = GPU(name="NVIDIA H100 SXM5 80GB", memory_bytes=80 * GIB, bandwidth=3.35e12, bf16_flops=989.5e12,
               host_bandwidth=41.6e9)

# meta-llama/Llama-3.1-8B-Instruct, config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads (GQA),
# intermediate 14336, vocab 128256, max_position_embeddings 131072; 8.03B parameters (model card).
LLAMA_31_8B = Transformer(name="Llama-3.1-8B-Instruct", params=8_030_261_248, layers=32, hidden=4096, heads=32,
                          kv_heads=8, head_dim=128, ffn=14336, vocab=128256, max_position=131072)

PROFILES: dict[str, Roofline] = {
    # Efficiencies and overhead fitted to published vLLM figures of this pair (docs/emulation.md).
    "h100-llama-8b": Roofline(H100_SXM, LLAMA_31_8B, bandwidth_efficiency=0.76, flops_efficiency=0.55,
                              step_overhead_s=0.0003, gpu_memory_utilization=0.9,
                              activation_reserve_bytes=4 * GIB),
}


def profile(name: str) -> Roofline:
    """The named profile; ValueError naming the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown emulation profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
