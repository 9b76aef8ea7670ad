"""AHC's config → the argparse Namespace that vLLM's OpenAI layer and engine are built from.

Going through vLLM's own parser keeps every default and validation vLLM has, and lets
`engine.extra_args` pass any other vLLM flag through unchanged.
"""

from __future__ import annotations

import argparse
import os
from argparse import Namespace

from ahc.config import AHCConfig, resolve_path


def vllm_cli_args(config: AHCConfig, capture_flags: list[str] | None = None) -> list[str]:
    """`capture_flags`: the lens capture's --worker-cls and --additional-config (server/capture)."""
    engine = config.engine
    args = [
        "--model", resolve_path(config.model),
        "--served-model-name", config.model_name,
        "--host", config.host,
        "--port", str(config.port),
        "--max-model-len", str(engine.max_model_len),
        "--dtype", engine.dtype,
        "--gpu-memory-utilization", str(engine.gpu_memory_utilization),
        "--max-num-seqs", str(engine.max_num_seqs),
        "--seed", str(engine.seed),
        "--tensor-parallel-size", str(engine.tensor_parallel_size),
        "--shutdown-timeout", str(engine.shutdown_timeout),
        "--uvicorn-log-level", config.log_level,
        # The cache report needs cached_tokens on every response.
        "--enable-prompt-tokens-details",
        "--disable-uvicorn-access-log",
    ]
    args.append("--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching")
    if engine.enforce_eager:
        args.append("--enforce-eager")
    if engine.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.block_size:
        args += ["--block-size", str(engine.block_size)]
    if engine.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", engine.tool_call_parser]
    return args + list(capture_flags or []) + list(engine.extra_args)


def build_vllm_namespace(config: AHCConfig, capture_flags: list[str] | None = None) -> Namespace:
    """Parse our config with vLLM's own serve parser; raises ValueError on a bad vLLM flag."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # Read by the CPU worker when it sizes the KV cache; set before the engine starts.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.engine.cpu_kvcache_space_gib))
    parser = make_arg_parser(FlexibleArgumentParser(prog="ahc serve", exit_on_error=False))
    try:
        namespace = parser.parse_args(vllm_cli_args(config, capture_flags))
    except argparse.ArgumentError as exc:
        raise ValueError(f"invalid engine argument: {exc}") from exc
    except SystemExit as exc:  # some argparse errors still exit even with exit_on_error=False
        raise ValueError(f"invalid engine arguments: {' '.join(config.engine.extra_args)}") from exc
    validate_parsed_serve_args(namespace)
    return namespace
