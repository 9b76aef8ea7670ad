"""The vLLM flags that put a model on the emulated engine, for `ahc serve --emulate` and for
`vllm serve` alike (the serving bench runs both on it)."""

from __future__ import annotations

import json
from typing import Any

from server.emulation.profiles import GIB, profile
from server.emulation.roofline import GPU

EXECUTOR = "server.emulation.executor.EmulatedExecutor"
BLOCK_SIZE = 16  # vLLM's block size on a CUDA GPU (its CPU build defaults to 128)


def gpu_batch_defaults(gpu: GPU) -> tuple[int, int]:
    """The tokens a step and the sequences vLLM's OpenAI server schedules by default on this GPU
    (`EngineArgs.get_batch_defaults`): 16,384 and 1,024 from 160 GiB, 8,192 and 1,024 from 70 GiB
    (A100s aside), else 2,048 and 256. The CPU build's own (2,048 and 128) would starve an emulated GPU."""
    name = gpu.name.lower()
    if gpu.memory_bytes >= 160 * GIB:
        return 16384, 1024
    if gpu.memory_bytes >= 70 * GIB and "a100" not in name:
        return 8192, 1024
    return 2048, 256


def emulation_flags(name: str, lens: dict[str, Any] | None = None, reply_tokens: int | None = None,
                    max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None) -> list[str]:
    """The served model's tokenizer and chat template stay; its config takes the profile's geometry
    (no weights are read) and the engine core runs the emulated executor. `lens`: the capture's settings
    (server/capture), for the executor to ship emulated activations as the capture worker would.
    `reply_tokens`: replies end after a length drawn around it (None: at the client's max_tokens).
    `max_num_seqs`, `max_num_batched_tokens`: the scheduler's, None for the emulated GPU's defaults."""
    emulated = profile(name)
    model = emulated.model
    tokens, seqs = gpu_batch_defaults(emulated.gpu)
    geometry = {"num_hidden_layers": model.layers, "hidden_size": model.hidden, "num_attention_heads": model.heads,
                "num_key_value_heads": model.kv_heads, "head_dim": model.head_dim,
                "intermediate_size": model.ffn, "max_position_embeddings": model.max_position}
    extra: dict[str, Any] = {"ahc_emulate": name, **({"ahc_lens": lens} if lens is not None else {}),
                             **({"ahc_emulate_reply_tokens": reply_tokens} if reply_tokens is not None else {})}
    return ["--distributed-executor-backend", EXECUTOR, "--additional-config", json.dumps(extra),
            "--hf-overrides", json.dumps(geometry), "--block-size", str(BLOCK_SIZE), "--load-format", "dummy",
            "--enforce-eager", "--max-num-seqs", str(max_num_seqs or seqs),
            "--max-num-batched-tokens", str(max_num_batched_tokens or tokens)]
