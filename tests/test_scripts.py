"""scripts/: shell that parses, passes shellcheck, and fails cleanly where it cannot run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from required import missing

REPO = Path(__file__).resolve().parents[1]
GPU_CHECK = REPO / "scripts" / "gpu_check.sh"
NO_GPU = "error: no CUDA GPU"


def shellcheck() -> str | None:
    """The shellcheck binary: on PATH (Debian's package `shellcheck`) or beside this Python."""
    beside = Path(sys.executable).with_name("shellcheck")
    return shutil.which("shellcheck") or (str(beside) if beside.is_file() else None)


def path_without_nvidia_smi(*extra: Path) -> str:
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    return os.pathsep.join([*map(str, extra), *dirs])


def run_script(script: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES" and not k.startswith("AHC_GPU_CHECK")}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={**base, **env}, cwd=script.parent)


def gpu_check_logs() -> list[Path]:
    logs = REPO / ".cache" / "gpu-check"
    return sorted(logs.iterdir()) if logs.is_dir() else []


def assert_no_gpu_error(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result
    assert len(lines) == 1 and lines[0].startswith(NO_GPU), result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.mark.process
def test_gpu_check_is_executable_bash_that_parses() -> None:
    assert os.access(GPU_CHECK, os.X_OK)
    assert GPU_CHECK.read_text().startswith("#!/usr/bin/env bash\n")
    result = subprocess.run(["bash", "-n", str(GPU_CHECK)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.process
def test_scripts_pass_shellcheck() -> None:
    binary = shellcheck()
    if binary is None:
        message = "shellcheck is not installed: the Debian package `shellcheck` (apt-get install shellcheck)"
        missing(message)
    scripts = sorted(str(p) for p in (REPO / "scripts").glob("*.sh"))
    result = subprocess.run([binary, *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def isolated_copy(tmp_path: Path) -> Path:
    """The script alone in an empty directory: no .venv, no Makefile, so any step past the GPU check
    would leave traces (or fail some other way)."""
    (tmp_path / "scripts").mkdir()
    copy = tmp_path / "scripts" / GPU_CHECK.name
    shutil.copy2(GPU_CHECK, copy)
    return copy


@pytest.mark.process
def test_gpu_check_without_nvidia_smi_fails_before_any_step(tmp_path: Path) -> None:
    copy = isolated_copy(tmp_path)
    result = run_script(copy, PATH=path_without_nvidia_smi())
    assert assert_no_gpu_error(result) == "error: no CUDA GPU found (gpu_check.sh needs one)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scripts"]  # no logs, no .venv, nothing built


@pytest.mark.process
def test_gpu_check_with_a_failing_nvidia_smi_fails_before_any_step(tmp_path: Path) -> None:
    # nvidia-smi without a driver prints its complaint on stdout; that is no GPU.
    copy = isolated_copy(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                    "driver.\"\nexit 9\n")
    fake.chmod(0o755)
    result = run_script(copy, PATH=path_without_nvidia_smi(bin_dir))
    assert_no_gpu_error(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "scripts"]


@pytest.mark.process
def test_gpu_check_in_this_checkout_honours_hidden_devices() -> None:
    # In place (this checkout's .venv and .cache): CUDA_VISIBLE_DEVICES="" hides every GPU, whatever the machine.
    before = gpu_check_logs()
    result = run_script(GPU_CHECK, PATH=path_without_nvidia_smi(), CUDA_VISIBLE_DEVICES="")
    assert "CUDA_VISIBLE_DEVICES" in assert_no_gpu_error(result)
    assert gpu_check_logs() == before


@pytest.mark.skipif(Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None,
                    reason="this machine has an NVIDIA driver")
@pytest.mark.process
def test_gpu_check_in_this_checkout_finds_no_gpu_here() -> None:
    # No nvidia-smi: the script asks torch in .venv, which sees no GPU on this machine.
    before = gpu_check_logs()
    result = run_script(GPU_CHECK, PATH=path_without_nvidia_smi())
    assert assert_no_gpu_error(result) == "error: no CUDA GPU found (gpu_check.sh needs one)"
    assert gpu_check_logs() == before


@pytest.mark.process
def test_gpu_check_runs_its_universe_step_on_a_bare_machine(tmp_path: Path) -> None:
    """No .venv, torch and Triton for python3: `AHC_GPU_CHECK_STEPS=universe` runs the universe step from the
    checkout with no set-up. Here a fake nvidia-smi names an H100 and python3 is this venv's, so the kernel
    runs in Triton's interpreter: the summary says so, and the exactness check still compares every case."""
    checkout = tmp_path / "checkout"
    for part in ("scripts", "universe", "kernels", "bench"):
        shutil.copytree(REPO / part, checkout / part, ignore=shutil.ignore_patterns("__pycache__"))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559, 550.54.15'\n")
    (fake / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    for tool in ("nvidia-smi", "python3"):
        (fake / tool).chmod(0o755)
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], capture_output=True, text=True, timeout=300, cwd=checkout,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("AHC_GPU_CHECK")},
             "PATH": path_without_nvidia_smi(fake), "AHC_GPU_CHECK_STEPS": "universe", "UNIVERSE_CHECK_LENGTHS": "1,33",
             "BENCH_UNIVERSE_LOAD": "grids=2,length=64,steps=2,rounds=1,interpret_grids=1,interpret_length=64,"
                                    "interpret_steps=2"})
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert not (checkout / ".venv").exists()
    assert summary["setup"]["ok"] and summary["setup"]["action"].startswith("none: the universe step alone")
    universe = summary["universe"]
    assert universe["exact"] and universe["cases"] == 16 and not universe["mismatches"]
    assert universe["bench"]["triton_interpret_cells_per_s"] > 0 and universe["bench"]["numpy_cells_per_s"] > 0
    assert "interpreter" in universe["error"]  # no GPU here, whatever nvidia-smi says
    assert result.returncode == 1
