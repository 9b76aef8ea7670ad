"""The API-process half of activation capture: check the pack, name the side channel, tell vLLM.

Started before the engine: the pack is checked against the model (a pack for another model fails in a
second, not after the load). The side channel runs from the engine's worker to the XDB writer, which
binds it (`XDB.capture_activations`) before the engine starts, so the worker's first step already has
somewhere to go; the API process only names each token's request and position.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import AHCConfig, resolve_path
from lens.pack import LensPack, load_pack

CPU_WORKER = "server.capture.cpu_capture_worker.CPUCaptureWorker"
GPU_WORKER = "server.capture.gpu_capture_worker.GPUCaptureWorker"


def check_pack(config: AHCConfig) -> LensPack:
    """The configured pack, loaded and matched to the model; ValueError names what is wrong."""
    pack_dir = resolve_path(config.lens.pack or "")
    try:
        pack = load_pack(pack_dir)
    except FileNotFoundError as exc:
        raise ValueError(f"lens.pack: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"lens.pack {pack_dir}: {exc}") from None
    assert config.model is not None  # serve() has the model from vLLM's flags before the capture starts
    model_dir = resolve_path(config.model)
    if not (Path(model_dir) / "config.json").is_file():
        raise ValueError(f"lens.pack: cannot check the pack against model {config.model!r}: "
                         "no local config.json (give a model directory)")
    try:
        pack.check_model(model_dir)
    except ValueError as exc:
        raise ValueError(f"lens.pack {pack_dir} was not made for this model: {exc}") from None
    return pack


@dataclass
class CaptureSetup:
    pack: LensPack
    pack_dir: str
    k: int
    source: str
    finish_wait_s: float  # how long the writer waits for a token's activations
    socket_dir: str
    hidden: tuple[str, ...] = ()  # the pack's hidden concepts (lens.hidden), in pack order: the audit's alone
    audit_k: int = 0  # hidden concepts kept per token

    @property
    def visible(self) -> tuple[str, ...]:
        """The concepts the agent may see, in pack order: what its token batches name."""
        return tuple(c for c in self.pack.concept_ids if c not in self.hidden)

    def visible_hierarchy(self) -> list[dict[str, Any]]:
        """The pack's hierarchy without its hidden concepts (registered in XDB, browsable by the agent); a
        concept under a hidden one is shown as a root, so no parent names a hidden concept."""
        return [{**c, "parent": None if c["parent"] in self.hidden else c["parent"]}
                for c in self.pack.concept_hierarchy() if c["id"] not in self.hidden]

    @property
    def address(self) -> str:
        return f"ipc://{self.socket_dir}/activations"

    @property
    def settings(self) -> dict[str, Any]:
        """What the engine's worker is told (step_capture.LensSettings)."""
        return {"pack": self.pack_dir, "k": self.k, "ipc": self.address, "source": self.source,
                "hidden": list(self.hidden), "audit_k": self.audit_k}

    def vllm_flags(self) -> list[str]:
        from vllm.platforms import current_platform

        return ["--worker-cls", CPU_WORKER if current_platform.is_cpu() else GPU_WORKER,
                "--additional-config", json.dumps({"ahc_lens": self.settings})]

    def close(self) -> None:
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def check_hidden(config: AHCConfig, pack: LensPack) -> tuple[str, ...]:
    """`lens.hidden` in pack order; ValueError names a concept the pack lacks (or one hiding them all)."""
    unknown = [name for name in config.lens.hidden if name not in pack.concept_ids]
    if unknown:
        raise ValueError(f"lens.hidden: {unknown[0]!r} is not a concept of the pack {config.lens.pack} "
                         f"(its concepts: {', '.join(pack.concept_ids)})")
    hidden = tuple(c for c in pack.concept_ids if c in config.lens.hidden)
    if len(hidden) == pack.n_concepts:
        raise ValueError(f"lens.hidden hides every concept of the pack {config.lens.pack}: leave one visible")
    return hidden


def start_capture(config: AHCConfig) -> CaptureSetup | None:
    """None when the config has capture off."""
    if not config.lens.enabled:
        return None
    pack = check_pack(config)
    hidden = check_hidden(config, pack)
    # The capture hooks are the V1 model runner's; vLLM picks V2 by default where Triton runs (GPUs).
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    k = min(config.lens.k, pack.n_concepts - len(hidden))
    if config.lens.source == "logit_lens" and not pack.extra.get("token_sets"):
        raise ValueError(f"lens.source: logit_lens needs a pack with token sets ({config.lens.pack} has none; "
                         "retrain it with `ahc lens train`)")
    assert config.lens.pack is not None  # LensConfig's validator: enabled needs a pack
    return CaptureSetup(pack, str(Path(resolve_path(config.lens.pack)).resolve()), k, config.lens.source,
                        config.lens.finish_wait_s, tempfile.mkdtemp(prefix="ahc-lens-"), hidden,
                        min(config.lens.audit_k, len(hidden)))
