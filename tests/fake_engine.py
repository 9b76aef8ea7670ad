"""A stand-in for vLLM's AsyncLLM, so server tests run vLLM's real OpenAI layer in milliseconds.

Everything above the engine is real: the vLLM config and tokenizer of a model directory, vLLM's
renderer (chat template, tool parsing, request validation), its serving classes and routes. Only
generation is faked: each request's reply is a fixed script of token ids (the tokens of SCRIPT),
produced as real `RequestOutput`s with the output kind, `n`, `max_tokens`, `min_tokens`,
`ignore_eos` and `logprobs` of its sampling parameters honoured.

    args = vllm_args(model_dir)                     # vLLM's Namespace, as `ahc serve` builds it
    engine = FakeEngine(engine_config(args))         # the config once per session: seconds
    app = asyncio.run(vllm_app(args, engine))        # build_app + init_app_state: milliseconds
    TestClient(app).post("/v1/chat/completions", json=...)
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI
from vllm.config import VllmConfig
from vllm.engine.protocol import EngineClient
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.renderers import renderer_from_config
from vllm.renderers.inputs.preprocess import extract_prompt_components
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.input_processor import InputProcessor

from core.config import load_config
from server.engine_args import build_vllm_namespace

SCRIPT = " The particles move right, then left."


def vllm_args(model_dir: Path, config: Path | str = "cpu-tiny", **overrides: Any) -> Namespace:
    """vLLM's serve Namespace for `model_dir`, from an AHC config, the way `ahc serve` makes it."""
    ahc_config = load_config(config).with_overrides(model=str(model_dir), **overrides)
    return build_vllm_namespace(ahc_config)


def engine_config(args: Namespace) -> VllmConfig:
    """The engine's VllmConfig (model, cache, scheduler) for `args`; starts no engine."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    return AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


async def vllm_app(args: Namespace, engine: EngineClient) -> FastAPI:
    """vLLM's own OpenAI app (routes, serving classes, error handlers) on `engine`."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    tasks = await engine.get_supported_tasks()
    app = build_app(args, tasks, engine.model_config)
    await init_app_state(engine, app.state, args, tasks)
    # serve_http puts the uvicorn server here; vLLM's engine-death handler sets its should_exit.
    app.state.server = SimpleNamespace(should_exit=False)
    return app


@dataclass
class FakeRequest:
    """What one `generate` call received, for tests to inspect."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    kwargs: dict[str, Any]
    aborted: bool = False
    cache_salt: str | None = None


@dataclass
class _Choice:
    """One of a request's `n` sequences: its full token list and how far it has been reported."""

    index: int
    token_ids: list[int]
    finish_reason: str
    sent: int = 0
    text_sent: str = ""


@dataclass(eq=False)
class FakeEngine(EngineClient):
    """Scripted generation behind vLLM's EngineClient interface (what AsyncLLM implements).

    `script`: the token ids every reply cycles through (default: the tokens of SCRIPT). A reply stops
    after the script ("stop", as at an EOS) unless `min_tokens` or `ignore_eos` asks for more, and at
    `max_tokens` ("length"). Choice i of `n` starts i tokens into the script, so choices differ.
    `step_delay`: seconds between tokens (0: each token still yields to the event loop, so streaming
    and aborts interleave as with a real engine). `kv_blocks`: the KV cache size a real engine would
    measure at start-up (vLLM's --num-gpu-blocks-override wins, as in the engine)."""

    vllm_config: VllmConfig
    script: Sequence[int] | None = None
    step_delay: float = 0.0
    kv_blocks: int = 1024
    supported_tasks: tuple[str, ...] = ("generate",)
    requests: list[FakeRequest] = field(default_factory=list)
    dead: bool = False

    def __post_init__(self) -> None:
        # The serving layer reads these attributes directly; AsyncLLM builds them the same way.
        self.model_config = self.vllm_config.model_config
        cache = self.vllm_config.cache_config
        cache.num_gpu_blocks = cache.num_gpu_blocks_override or self.kv_blocks  # set by a real engine's profiling
        self.renderer = renderer_from_config(self.vllm_config)
        self.input_processor = InputProcessor(self.vllm_config, self.renderer)
        if self.script is None:
            self.script = self.get_tokenizer().encode(SCRIPT, add_special_tokens=False)
        if not self.script:
            raise ValueError("the script needs at least one token")
        self._aborted: set[str] = set()

    # --- generation -------------------------------------------------------------------------------

    async def generate(self, prompt: Any, sampling_params: SamplingParams, request_id: str,
                       **kwargs: Any) -> AsyncGenerator[RequestOutput, None]:
        if self.dead:
            raise self.dead_error
        request = FakeRequest(request_id, self._prompt_token_ids(prompt), sampling_params, kwargs,
                              cache_salt=_cache_salt(prompt))
        self.requests.append(request)
        choices = [self._choice(i, sampling_params) for i in range(sampling_params.n)]
        steps = max(len(c.token_ids) for c in choices)
        kind = sampling_params.output_kind
        try:
            for step in range(1, steps + 1):
                await asyncio.sleep(self.step_delay)
                if request_id in self._aborted:
                    request.aborted = True
                    return
                finished = step == steps
                if kind == RequestOutputKind.FINAL_ONLY and not finished:
                    continue
                yield self._output(request, choices, step, sampling_params, finished)
        except (asyncio.CancelledError, GeneratorExit):
            # As AsyncLLM does: a client that goes away aborts its request.
            request.aborted = True
            raise

    def _prompt_token_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return self.get_tokenizer().encode(prompt)
        if hasattr(prompt, "prompt_token_ids"):  # an EngineCoreRequest
            return list(prompt.prompt_token_ids)
        return list(extract_prompt_components(self.model_config, prompt).token_ids or [])

    def _choice(self, index: int, params: SamplingParams) -> _Choice:
        script = list(self.script or [])
        natural = None if params.ignore_eos else max(len(script), params.min_tokens)
        limit = params.max_tokens
        if natural is None and limit is None:
            raise ValueError("ignore_eos without max_tokens would never end")
        length = min(n for n in (natural, limit) if n is not None)
        ids = [script[(index + i) % len(script)] for i in range(length)]
        return _Choice(index, ids, "stop" if length == natural else "length")

    def _output(self, request: FakeRequest, choices: list[_Choice], step: int, params: SamplingParams,
                finished: bool) -> RequestOutput:
        delta = params.output_kind == RequestOutputKind.DELTA
        tokenizer = self.get_tokenizer()
        outputs = []
        for choice in choices:
            upto = min(step, len(choice.token_ids))
            text = tokenizer.decode(choice.token_ids[:upto], skip_special_tokens=params.skip_special_tokens)
            start = choice.sent if delta else 0
            ids = choice.token_ids[start:upto]
            done = upto == len(choice.token_ids)
            outputs.append(CompletionOutput(
                index=choice.index,
                text=text[len(choice.text_sent):] if delta else text,
                token_ids=ids,
                cumulative_logprob=None if params.logprobs is None else 0.0,
                logprobs=None if params.logprobs is None else [self._logprobs(t, params.logprobs) for t in ids],
                finish_reason=choice.finish_reason if done else None,
            ))
            choice.sent, choice.text_sent = upto, text
        return RequestOutput(request_id=request.request_id, prompt=None, prompt_token_ids=request.prompt_token_ids,
                             prompt_logprobs=None, outputs=outputs, finished=finished, num_cached_tokens=0)

    def _logprobs(self, token_id: int, top: int) -> dict[int, Logprob]:
        """The sampled token is certain (logprob 0, rank 1); `top` more ids fill the top list."""
        decode = self.get_tokenizer().decode
        entries = {token_id: Logprob(0.0, 1, decode([token_id]))}
        alternatives = (t for t in range(len(self.get_tokenizer())) if t != token_id)
        for rank, other in enumerate(alternatives, start=2):
            if len(entries) > top:
                break
            entries[other] = Logprob(-20.0, rank, decode([other]))
        return entries

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        self._aborted.update([request_id] if isinstance(request_id, str) else request_id)

    def encode(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        raise NotImplementedError("the fake engine only generates")

    # --- what the serving layer and health checks ask -------------------------------------------------

    def get_tokenizer(self) -> Any:
        return self.renderer.get_tokenizer()

    @property
    def tokenizer(self) -> Any:
        return self.renderer.tokenizer

    async def get_supported_tasks(self) -> tuple[Any, ...]:
        return self.supported_tasks

    @property
    def is_running(self) -> bool:
        return not self.dead

    @property
    def is_stopped(self) -> bool:
        return self.dead

    @property
    def errored(self) -> bool:
        return self.dead

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    async def check_health(self) -> None:
        if self.dead:
            raise self.dead_error

    async def is_tracing_enabled(self) -> bool:
        return False

    async def do_log_stats(self) -> None:
        pass

    def shutdown(self, timeout: float | None = None) -> None:
        self.dead = True

    # --- engine controls the fake has no state for --------------------------------------------------

    async def notify_kv_transfer_request_rejected(self, request_id: str, kv_transfer_params: dict[str, Any], *,
                                                  data_parallel_rank: int | None = None) -> None:
        pass

    async def start_profile(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def stop_profile(self) -> None:
        pass

    async def reset_mm_cache(self) -> None:
        pass

    async def reset_encoder_cache(self) -> None:
        pass

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return True

    async def sleep(self, level: int = 1, mode: Any = "abort") -> None:
        pass

    async def release_kv_cache_memory(self) -> None:
        pass

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        return True

    async def is_sleeping(self) -> bool:
        return False

    async def add_lora(self, lora_request: Any) -> bool:
        raise NotImplementedError("the fake engine has no LoRA adapters")

    async def pause_generation(self, *, mode: Any = "abort", clear_cache: bool = True) -> None:
        pass

    async def resume_generation(self) -> None:
        pass

    async def is_paused(self) -> bool:
        return False


def _cache_salt(prompt: Any) -> str | None:
    """The prefix-cache salt a prompt carries: a prompt dict's key, or an EngineCoreRequest's field."""
    if isinstance(prompt, dict):
        return prompt.get("cache_salt")
    return getattr(prompt, "cache_salt", None)
