"""The vLLM flags that put a model on the emulated engine, for `ahc serve --emulate` and for
`vllm serve` alike (the serving bench runs both on it)."""

from __future__ import annotations

import json
from typing import Any

from server.emulation.profiles import profile

EXECUTOR = "server.emulation.executor.EmulatedExecutor"
BLOCK_SIZE = 16  # vLLM's block size on a CUDA GPU (its CPU build defaults to 128)


def emulation_flags(name: str, lens: dict[str, Any] | None = None, reply_tokens: int | None = None) -> list[str]:
    """The served model's tokenizer and chat template stay; its config takes the profile's geometry
    (no weights are read) and the engine core runs the emulated executor. `lens`: the capture's settings
    (server/capture), for the executor to ship emulated activations as the capture worker would.
    `reply_tokens`: replies end after a length drawn around it (None: at the client's max_tokens)."""
    model = profile(name).model
    geometry = {"num_hidden_layers": model.layers, "hidden_size": model.hidden, "num_attention_heads": model.heads,
                "num_key_value_heads": model.kv_heads, "head_dim": model.head_dim,
                "intermediate_size": model.ffn, "max_position_embeddings": model.max_position}
    extra: dict[str, Any] = {"ahc_emulate": name, **({"ahc_lens": lens} if lens is not None else {}),
                             **({"ahc_emulate_reply_tokens": reply_tokens} if reply_tokens is not None else {})}
    return ["--distributed-executor-backend", EXECUTOR, "--additional-config", json.dumps(extra),
            "--hf-overrides", json.dumps(geometry), "--block-size", str(BLOCK_SIZE), "--load-format", "dummy",
            "--enforce-eager"]
