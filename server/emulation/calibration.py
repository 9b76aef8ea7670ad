"""The emulator's cost model against published vLLM measurements of Llama-3(.1)-8B in bf16 on one
H100 (TP=1): each point's setting replayed through the roofline, step by step as vLLM schedules it.

End-to-end figures include vLLM's host work per step (scheduling, output processing), which the
emulator does for real on whatever CPU runs it; for the comparison it is taken as the published gap
between a batch-1 end-to-end step and its GPU forward time (D1 - D2: about 1.1 ms).
`python -m server.emulation.calibration` prints the table docs/emulation.md shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from server.emulation.profiles import profile
from server.emulation.roofline import Roofline, SequenceStep

HOST_STEP_S = 0.00108  # D1's 7.58 ms a token end-to-end less D2's 6.5 ms forward: vLLM's host work a step


@dataclass(frozen=True)
class Point:
    key: str
    source: str
    setting: str
    unit: str
    published: float
    emulated: Callable[[Roofline], float]


def batch_latency(r: Roofline, batch: int, input_len: int, output_len: int, host: bool = True) -> float:
    """benchmark_latency: one batch's prefill, then output_len - 1 decode steps (seconds)."""
    extra = HOST_STEP_S if host else 0.0
    total = r.step_seconds([SequenceStep(input_len, 0, True)] * batch) + extra
    for step in range(1, output_len):
        total += r.step_seconds([SequenceStep(1, input_len + step - 1, True)] * batch) + extra
    return total


def offline_throughput(r: Roofline, prompts: int, input_len: int, output_len: int, max_seqs: int = 256,
                       max_batched: int = 8192) -> float:
    """benchmark_throughput: output tokens/s, waves of max_seqs requests, each prefilled in chunks of
    max_batched tokens, then decoded together."""
    seconds, left = 0.0, prompts
    while left:
        wave = min(left, max_seqs)
        left -= wave
        prefill = wave * input_len
        while prefill:
            chunk = min(prefill, max_batched)
            seconds += r.step_seconds([SequenceStep(chunk, 0, False)]) + HOST_STEP_S
            prefill -= chunk
        for step in range(output_len):
            seconds += r.step_seconds([SequenceStep(1, input_len + step, True)] * wave) + HOST_STEP_S
    return prompts * output_len / seconds


POINTS = (
    Point("D2", "vllm-project/vllm PR #11081 (forward_context time stats, Meta-Llama-3-8B, dummy weights)",
          "GPU forward of one decode step, batch 1, 32-token prompt", "ms", 6.5,
          lambda r: 1000 * r.step_seconds([SequenceStep(1, 64, True)])),
    Point("D2", "vllm-project/vllm PR #11081",
          "GPU forward of a 32-token prefill, batch 1", "ms", 7.51,
          lambda r: 1000 * r.step_seconds([SequenceStep(32, 0, True)])),
    Point("D1", "vLLM docs, torch_compile guide: benchmark_latency.py on H100, Meta-Llama-3-8B",
          "end-to-end latency, batch 1, 32 in / 128 out", "s", 0.9704,
          lambda r: batch_latency(r, 1, 32, 128)),
    Point("D4", "vLLM nightly performance benchmark, buildkite build 9555, latency_llama8B_tp1 (H100)",
          "end-to-end latency, batch 8, 32 in / 128 out (mean)", "s", 0.9975,
          lambda r: batch_latency(r, 8, 32, 128)),
    Point("D3", "vLLM docs, torch_compile guide: benchmark_throughput.py on H100, Meta-Llama-3-8B",
          "offline output tokens/s, 256 in / 256 out, 1000 prompts, up to 256 at once", "tok/s", 11364.0,
          lambda r: offline_throughput(r, 1000, 256, 256)),
    Point("D5", "LambdaLabsML/vllm-benchmark, results/prompt_10/1xH100-80GB-SXM (Meta-Llama-3-8B-Instruct)",
          "median time per output token, 10 concurrent requests (~137 in / ~187 out)", "ms", 7.558,
          lambda r: 1000 * (r.step_seconds([SequenceStep(1, 137 + 90, True)] * 10) + HOST_STEP_S)),
)


def table(name: str = "h100-llama-8b") -> list[tuple[Point, float]]:
    r = profile(name)
    return [(p, p.emulated(r)) for p in POINTS]


def markdown(name: str = "h100-llama-8b") -> str:
    rows = ["| point | setting | published | emulated | emulated / published |", "|---|---|---|---|---|"]
    for p, got in table(name):
        rows.append(f"| {p.key} | {p.setting} | {p.published:g} {p.unit} | {got:.4g} {p.unit} | "
                    f"{got / p.published:.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
