"""`pip install .` (not editable) gives a working `ahc`: everything it reads at run time is package data,
and the top-level `kernels` package does not break transformers or vLLM, which probe for a module of
that name (Hugging Face's kernel hub)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the built wheel alone (--no-deps); the project's environment supplies the
    dependencies through a .pth line, after the wheel's own packages."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(root / "dist"), str(CHECKOUT)], check=True, capture_output=True, timeout=300)
    [wheel] = (root / "dist").glob("ahc-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert site.is_dir(), sorted(str(p) for p in venv.rglob("*"))[:20]
    # Away from the checkout (the working directory and PYTHONPATH), whose ahc.egg-info would make pip count
    # ahc as installed already.
    away = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300, cwd=root, env=away)
    # Only now: with the project's environment (and its editable ahc) visible, pip would see ahc installed.
    (site / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # Outside the checkout, with no PYTHONPATH: only the installed wheel can answer.
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_installed_ahc_runs_from_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    ahc = str(installed / "bin" / "ahc")
    where = run(installed, str(installed / "bin" / "python"), "-c", "import universe, ahc; print(universe.__file__)",
                cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert str(installed) in where.stdout  # the wheel's copy, not the checkout's

    version = run(installed, ahc, "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("ahc "), version.stderr

    simulated = run(installed, ahc, "universe", "simulate", "--rule", "kinetic", "--state", "A___B___",
                    "--steps", "2", cwd=tmp_path)
    assert simulated.returncode == 0, simulated.stderr
    assert simulated.stdout.split() == ["A___B___", "_A_B____", "__K_____"]  # a bundled rule, read as package data

    helped = run(installed, ahc, "serve", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "MODEL" in helped.stdout, helped.stderr


def test_bundled_configs_and_lens_examples_are_package_data(installed: Path, tmp_path: Path) -> None:
    probe = ("from core.config import load_config, CHECKOUT, cache_dir\n"
             "from importlib import resources\n"
             "assert CHECKOUT is None, CHECKOUT\n"
             "assert load_config('cpu-tiny').served_model_name == 'tiny'\n"
             "assert load_config('gpu').engine.gpu_memory_utilization > 0\n"
             "assert resources.files('lens').joinpath('examples/tiny-demo/examples.json').is_file()\n"
             "assert resources.files('ahc').joinpath('data/corpus.txt').is_file()\n"
             "print(cache_dir())\n")
    result = run(installed, str(installed / "bin" / "python"), "-c", probe, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / ".cache" / "ahc")  # never inside the installed package


def test_transformers_and_vllm_still_work_beside_our_kernels_package(installed: Path, tmp_path: Path) -> None:
    probe = ("import kernels, transformers, torch\n"
             "from transformers import LlamaConfig, LlamaForCausalLM\n"
             "config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,\n"
             "                     num_attention_heads=1, num_key_value_heads=1)\n"
             "logits = LlamaForCausalLM(config)(torch.tensor([[1, 2, 3]])).logits\n"
             "assert logits.shape == (1, 3, 64)\n"
             "import vllm\n"
             "from vllm import SamplingParams\n"
             "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
             "assert SamplingParams(max_tokens=3).max_tokens == 3\n"
             "print(kernels.__file__)\n")
    result = run(installed, str(installed / "bin" / "python"), "-c", probe, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert str(installed) in result.stdout
