"""One request sequence through vLLM's engine, emulated or real, printing as JSON each request's cached
prompt tokens (`cached`) and what the engine's KV events said, just before it, its session (its prompt's
name) held in blocks on the GPU and in the CPU tier (`held`):
`python tests/emulation_sequence.py emulated|real MODEL_DIR [OFFLOAD_GIB]`, the last turning vLLM's
native CPU offloading on with a tier that size. A process of its own, as vLLM's engine wants its
multiprocess start under `__main__`."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from typing import Any

BLOCKS, BLOCK_SIZE, PROMPT = 32, 32, 320  # room for three of the sequence's prompts at once
SEQUENCE = "A A B A C D E A E".split()


def prompt_ids(name: str) -> list[int]:
    return [100 + (ord(name) * 997 + i * 31) % 900 for i in range(PROMPT)]


async def run(kind: str, model: str, offload_gib: float | None = None) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM

    from server.admission.cache_events import CPU, GPU, CacheEvents, follow
    from server.emulation.engine_flags import emulation_flags
    from server.engine_args import publish_kv_events

    flags = emulation_flags("h100-llama-8b") if kind == "emulated" else ["--enforce-eager"]
    if offload_gib is not None:
        flags += ["--kv-offloading-size", str(offload_gib), "--kv-offloading-backend", "native"]
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", model, "--max-model-len", "512", "--num-gpu-blocks-override", str(BLOCKS),
                              *flags, "--block-size", str(BLOCK_SIZE)])  # the CPU engine's blocks are 32s
    endpoint = publish_kv_events(args, tempfile.mkdtemp(prefix="ahc-kv-"))
    assert endpoint is not None
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(args))
    events = CacheEvents()
    reading = asyncio.create_task(follow(endpoint, events))
    cached, held = [], []
    try:
        for n, name in enumerate(SEQUENCE):
            await asyncio.sleep(0.5)  # the last request's events cross the socket
            held.append([events.blocks(name, GPU) or 0, events.blocks(name, CPU) or 0])
            final = None
            async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt_ids(name)),
                                          SamplingParams(max_tokens=1, ignore_eos=True), request_id=f"{n}-{name}",
                                          session_id=name):
                final = out
            assert final is not None
            cached.append(int(final.num_cached_tokens or 0))
    finally:
        reading.cancel()
        llm.shutdown()
    assert events.trusted
    return {"cached": cached, "held": held}


if __name__ == "__main__":
    offload = float(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(asyncio.run(run(sys.argv[1], sys.argv[2], offload))))
