"""AHC's config → the argparse Namespace that vLLM's OpenAI layer and engine are built from.

Going through vLLM's own parser keeps every default and validation vLLM has, and lets
`engine.extra_args` (and any flag of `ahc serve` that AHC does not own) pass through unchanged, with the
model as `vllm serve` takes it: first, without `--model`.
"""

from __future__ import annotations

import argparse
import os
from argparse import Namespace
from typing import TYPE_CHECKING, NoReturn

from core.config import NO_MODEL, AHCConfig, resolve_path
from server.emulation.engine_flags import emulation_flags

if TYPE_CHECKING:
    from server.capture.capture_setup import CaptureSetup


def vllm_cli_args(config: AHCConfig, capture: CaptureSetup | None = None) -> list[str]:
    """`capture`: the lens capture (server/capture), whose settings the engine's worker is given."""
    engine = config.engine
    args = [*(["--model", resolve_path(config.model)] if config.model else []),
            *(["--served-model-name", config.served_model_name] if config.served_model_name else [])]
    args += [
        "--host", config.host,
        "--port", str(config.port),
        "--max-model-len", str(engine.max_model_len),
        "--dtype", engine.dtype,
        "--gpu-memory-utilization", str(engine.gpu_memory_utilization),
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
    if engine.max_num_seqs:
        args += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.block_size:
        args += ["--block-size", str(engine.block_size)]
    if engine.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", engine.tool_call_parser,
                 "--tool-strict-level", engine.tool_strict_level]
    if engine.kv_offloading_size is not None:
        args += ["--kv-offloading-size", str(engine.kv_offloading_size),
                 "--kv-offloading-backend", engine.kv_offloading_backend]
    if engine.session_priority:
        args += ["--scheduling-policy", "priority"]
    if engine.return_order in ("gpu", "both"):
        args += ["--scheduler-cls", RETURN_ORDER_SCHEDULER]
    if engine.emulate is not None:  # its executor ships emulated activations itself: no worker to replace
        args += emulation_flags(engine.emulate, capture.settings if capture is not None else None,
                                engine.emulate_reply_tokens, engine.max_num_seqs, engine.max_num_batched_tokens)
    elif capture is not None:
        args += capture.vllm_flags()
    return args + list(engine.extra_args)


def build_vllm_namespace(config: AHCConfig, capture: CaptureSetup | None = None) -> Namespace:
    """Parse our config with vLLM's own serve parser; raises ValueError on a bad vLLM flag."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # Read by the CPU worker when it sizes the KV cache; set before the engine starts.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.engine.cpu_kvcache_space_gib))
    class Parser(FlexibleArgumentParser):
        def error(self, message: str) -> NoReturn:  # a message for our one-line error, not usage and exit 2
            raise ValueError(message)

    # vLLM leaves FlexibleArgumentParser.__init__ and parse_args unannotated.
    parser = make_arg_parser(Parser(prog="ahc serve", exit_on_error=False))  # type: ignore[no-untyped-call]
    try:
        namespace: Namespace = parser.parse_args(vllm_cli_args(config, capture))
    except argparse.ArgumentError as exc:
        raise ValueError(f"invalid engine argument: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"invalid engine arguments: {exc}") from exc
    if namespace.model_tag:  # `ahc serve MODEL …`, as `vllm serve MODEL …`
        namespace.model = resolve_path(namespace.model_tag)
    elif not config.model and not any(a == "--model" or a.startswith("--model=") for a in config.engine.extra_args):
        raise ValueError(NO_MODEL)
    validate_parsed_serve_args(namespace)
    if namespace.api_server_count is None:  # vLLM leaves it unset for one process
        namespace.api_server_count = 1
    if namespace.api_server_count < 1:
        raise ValueError(f"--api-server-count {namespace.api_server_count}: at least 1 API process")
    if config.engine.return_order in ("cpu", "both"):
        order_cpu_tier(namespace)
    return namespace


RETURN_ORDER_SCHEDULER = "server.kv_order.scheduler.return_order_scheduler"
RETURN_ORDER_POLICY = {"eviction_policy": "ReturnOrderPolicy", "cache_policy_module_path": "server.kv_order.cpu_policy"}


def order_cpu_tier(args: Namespace) -> None:
    """vLLM's native CPU tier, if on, evicts by AHC's return order (a connector configured by the command
    line keeps its own policy)."""
    from vllm.config.kv_transfer import KVTransferConfig

    if args.kv_offloading_size is None or args.kv_offloading_backend != "native":
        return
    transfer: KVTransferConfig = args.kv_transfer_config or KVTransferConfig()
    if "eviction_policy" not in transfer.kv_connector_extra_config:
        transfer.kv_connector_extra_config.update(RETURN_ORDER_POLICY)
    args.kv_transfer_config = transfer


# AHC settings that are vLLM flags of the same name: a flag given straight to vLLM sets them too, so the
# orchestrator budgets with the window vLLM really has.
ENGINE_FLAGS = ("max_model_len", "dtype", "enforce_eager", "enable_prefix_caching", "gpu_memory_utilization",
                "max_num_seqs", "max_num_batched_tokens", "block_size", "seed", "tensor_parallel_size",
                "tool_call_parser", "shutdown_timeout", "kv_offloading_size", "kv_offloading_backend")


def with_vllm_flags(config: AHCConfig) -> AHCConfig:
    """The config as vLLM's parser reads the whole command line (the positional model and every flag
    passed through included): the one view both AHC and the engine act on."""
    namespace = build_vllm_namespace(config)
    served = namespace.served_model_name
    return config.with_overrides(
        model=namespace.model, host=namespace.host, port=namespace.port,
        served_model_name=served[0] if isinstance(served, list) and served else served or namespace.model,
        **{f"engine.{name}": getattr(namespace, name) for name in ENGINE_FLAGS})


def publish_kv_events(args: Namespace, socket_dir: str) -> str | None:
    """Have the engine publish its KV cache events (session admission reads them: its cache_events)
    on a socket in `socket_dir`, private to this server since the events carry prompts' token ids;
    a command line that sets its own publisher keeps it. Returns the endpoint to read (None: the events
    go nowhere a subscriber can read)."""
    from vllm.config.kv_events import KVEventsConfig
    from vllm.config.kv_transfer import KVTransferConfig

    configured: KVEventsConfig | None = args.kv_events_config
    if configured is None:
        configured = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                    endpoint=f"ipc://{socket_dir}/kv-events",
                                    replay_endpoint=f"ipc://{socket_dir}/kv-events-replay")
        args.kv_events_config = configured
        if args.kv_offloading_size is not None:  # the CPU tier's events then name each block, as the GPU's do
            transfer: KVTransferConfig = args.kv_transfer_config or KVTransferConfig()
            transfer.kv_connector_extra_config.setdefault("self_describing_kv_events", True)
            args.kv_transfer_config = transfer
    if not configured.enable_kv_cache_events or configured.publisher != "zmq":
        return None
    return configured.endpoint.replace("*", "127.0.0.1")  # the publisher binds; a subscriber connects


def kv_events_replay(args: Namespace) -> str | None:
    """The publisher's replay endpoint (what a reader that missed batches asks for them), if it has one."""
    configured = args.kv_events_config
    replay = getattr(configured, "replay_endpoint", None) if configured is not None else None
    return replay.replace("*", "127.0.0.1") if replay else None
