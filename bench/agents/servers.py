"""The servers the agents bench measures, started together: AHC and FCFS, and on the emulated engine AHC's
ablations, vanilla vLLM, vLLM with CPU offload and the ideal cache."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.agents.cache import CacheSize
from bench.agents.load import AgentLoad
from bench.serve import start_vllm
from bench.servers import start_server, start_together
from core.config import OrchestratorConfig
from server.cluster.server_process import ServerProcess
from server.emulation.engine_flags import gpu_batch_defaults
from server.emulation.profiles import profile

SWITCH = "session_admission"
FCFS_ENV = {f"AHC_ORCHESTRATOR__{SWITCH.upper()}": "false"}


def switch_available() -> bool:
    """Whether this build's config knows the session-aware admission switch (FCFS needs it off)."""
    return SWITCH in OrchestratorConfig.model_fields


def start_sides(model_dir: Path, tmp: Path, size: CacheSize, load: AgentLoad,
                fcfs_env: dict[str, str]) -> dict[str, ServerProcess]:
    """The servers, started together (start-up is mostly waiting; one failing stops the others): AHC and
    FCFS; on the emulated engine also vanilla `vllm serve`, `vllm serve` with the same CPU tier as AHC's
    (if any), and the ideal, vanilla vLLM on a cache that holds every session."""
    extra = ["--max-model-len", str(size.max_model_len), "--num-gpu-blocks-override", str(size.blocks)]
    tier: list[str] = []
    if load.emulate:
        # Every side schedules as vLLM would on that GPU, not as the bundled CPU config does.
        tokens, seqs = gpu_batch_defaults(profile(load.emulate).gpu)
        extra += ["--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(tokens)]
        if load.offload_gib:
            tier = ["--kv-offloading-size", str(load.offload_gib), "--kv-offloading-backend", "native"]
    # Threshold compaction off: every turn appends to State, which the ceiling assumes; the governor
    # may still compact a State to admit a turn, as it would for any agent.
    common = {"AHC_ORCHESTRATOR__COMPACTION_THRESHOLD_TOKENS": str(size.max_model_len)}
    ahc_extra = [*extra, *tier, *(["--emulate", load.emulate] if load.emulate else [])]
    envs = {"ahc": common, "fcfs": {**common, **fcfs_env}}
    if load.emulate:  # the ablations: program order alone, and return order on the GPU as well
        envs |= {"ahc_priority": {**common, "AHC_ENGINE__RETURN_ORDER": "off"},
                 "ahc_gpu": {**common, "AHC_ENGINE__RETURN_ORDER": "both"}}
    starts: dict[str, Callable[[], ServerProcess]] = {
        name: partial(start_server, tmp / name / "xdb", model=model_dir, lens="off", extra=ahc_extra, env=env)
        for name, env in envs.items()}
    if load.emulate:
        vllm = partial(start_vllm, model_dir, max_model_len=size.max_model_len, emulate=load.emulate)
        starts["vllm"] = partial(vllm, tmp / "vllm", extra=extra)
        if tier:
            starts["offload"] = partial(vllm, tmp / "offload", extra=[*extra, *tier])
        everything = ["--num-gpu-blocks-override", str(size.blocks_for_all)]
        starts["ideal"] = partial(vllm, tmp / "ideal", extra=[*extra, *everything])
    chosen = load.side_names()
    if chosen:
        starts = {name: start for name, start in starts.items() if name in chosen}
    return dict(zip(starts, start_together(list(starts.values()))))
