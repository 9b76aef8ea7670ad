"""vLLM's executor for the emulated engine: everything vLLM runs in its engine core stays real (the
scheduler, the KV cache manager with prefix caching, LRU eviction and preemption); the forward pass is
a sleep as long as the roofline model says the step takes on the named GPU, and each sampled token is
drawn deterministically from the vocabulary. No KV memory is allocated: the cache manager's
bookkeeping is all there is of it. With a lens pack (`{"ahc_lens": ...}` beside `ahc_emulate`), each
sampled token's top-k concepts are drawn deterministically too and shipped over the capture's side
channel as its worker would ship them, so the API process joins and records them at the GPU's rate.
With vLLM's native CPU offloading on (`--kv-offloading-size`), the offloading connector's scheduler side
runs as it is and the executor moves its jobs over the GPU's modelled host link (host_link.py).

vLLM takes it by name: `--distributed-executor-backend server.emulation.executor.EmulatedExecutor`
with `--additional-config '{"ahc_emulate": "h100-llama-8b"}'` (server/emulation/engine_flags.py).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingConnectorMetadata
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import ModelRunnerOutput

from lens.pack import load_pack
from lens.side_channel import ActivationSender, BundlingSender, engine_key
from server.capture.step_capture import LensSettings
from server.emulation.host_link import HostLink
from server.emulation.profiles import profile
from server.emulation.roofline import Roofline, SequenceStep

log = logging.getLogger("ahc.emulation")
CONFIG_KEY = "ahc_emulate"
REPLY_TOKENS_KEY = "ahc_emulate_reply_tokens"


@dataclass
class _Sequence:
    """What the executor keeps of a request: how many tokens it has (prompt and sampled)."""

    seed: int
    tokens: int
    prompt: int


class EmulatedExecutor(Executor):
    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        extra = self.vllm_config.additional_config
        name = extra.get(CONFIG_KEY) if isinstance(extra, dict) else None
        if not name:
            raise ValueError(f"the emulated executor needs --additional-config '{{\"{CONFIG_KEY}\": NAME}}'")
        self.roofline: Roofline = profile(str(name))
        self.block_size = self.cache_config.block_size
        self.token_ids, self.eos = _text_token_ids(self.model_config.model, self.model_config.get_vocab_size())
        # A mean reply length: each reply ends (EOS) after a length drawn around it; None: at max_tokens.
        reply_tokens = extra.get(REPLY_TOKENS_KEY) if isinstance(extra, dict) else None
        self.reply_tokens = int(reply_tokens) if reply_tokens else None
        if self.reply_tokens is not None and self.eos is None:
            raise ValueError(f"{self.model_config.model}: no end-of-sequence token to end emulated replies with")
        self.sequences: dict[str, _Sequence] = {}
        self.modelled_s = 0.0  # the GPU time modelled so far
        self.lens = _EmulatedLens.start(self.vllm_config)
        m = self.roofline.model
        self.host_link = HostLink(self.roofline.gpu.host_bandwidth, self.block_size * m.kv_bytes_per_token)
        sched = self.vllm_config.scheduler_config
        log.warning("EMULATED engine: %s on %s (roofline model; no model runs, tokens are drawn, not generated); "
                    "scheduler: %d tokens a step, %d sequences", self.roofline.model.name, self.roofline.gpu.name,
                    sched.max_num_batched_tokens, sched.max_num_seqs)

    # -- what vLLM's engine core asks of an executor ----------------------------------------------
    def get_kv_cache_specs(self) -> list[dict[str, KVCacheSpec]]:
        m = self.roofline.model
        spec = FullAttentionSpec(block_size=self.block_size, num_kv_heads=m.kv_heads, head_size=m.head_dim,
                                 dtype=torch.bfloat16)
        return [{f"model.layers.{i}.self_attn.attn": spec for i in range(m.layers)}]

    def determine_available_memory(self) -> list[int]:
        return [self.roofline.kv_cache_bytes()]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [[KVCacheLayout.LBNHC.name]]

    def set_kv_cache_layout(self, layout_name: str) -> None:
        self.cache_config.kv_cache_layout = layout_name

    def initialize_from_config(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        blocks = kv_cache_configs[0].num_blocks
        log.warning("EMULATED KV cache: %d blocks of %d tokens (%s after the weights), nothing allocated",
                    blocks, self.block_size, f"{self.roofline.kv_cache_bytes() / 1024**3:.1f} GiB")

    def compile_or_warm_up_model(self) -> None:
        return None

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None, args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None, non_block: bool = False) -> Any:
        name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        if name in ("update_max_model_len", "reset_mm_cache", "reset_encoder_cache", "shutdown",
                    "get_kv_connector_handshake_metadata"):  # the offloading connector needs no handshake
            return [None]
        raise NotImplementedError(f"the emulated engine has no worker to run {name!r} on")

    def execute_model(self, scheduler_output: SchedulerOutput,  # type: ignore[override]
                      non_block: bool = False) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        output = self.step(scheduler_output)
        if not non_block:
            return output
        done: Future[ModelRunnerOutput] = Future()
        done.set_result(output)
        return done

    def sample_tokens(self, grammar_output: GrammarOutput | None,  # type: ignore[override]
                      non_block: bool = False) -> ModelRunnerOutput:
        raise RuntimeError("the emulated engine samples in execute_model")

    def take_draft_token_ids(self) -> None:
        return None

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        if self.lens is not None:
            self.lens.close()
            self.lens = None

    @property
    def supported_tasks(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("generate",)

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return False

    # -- the step -------------------------------------------------------------------------------
    def step(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Advance every scheduled sequence by its scheduled tokens; those that reach the end of what is
        known sample one token. Sleeps the modelled time of the step, and of any offload the step must
        wait for."""
        started = time.perf_counter()
        offload = out.kv_connector_metadata if isinstance(out.kv_connector_metadata, OffloadingConnectorMetadata) \
            else None
        if offload is not None:
            started += self.host_link.before_step(offload)
        for req_id in out.finished_req_ids:
            self.sequences.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            if new.req_id not in self.sequences:  # a preempted request comes back knowing its own tokens
                prompt = len(new.prompt_token_ids or [])
                self.sequences[new.req_id] = _Sequence(zlib.crc32(new.req_id.encode()), prompt, prompt)
        computed = dict(zip(out.scheduled_cached_reqs.req_ids, out.scheduled_cached_reqs.num_computed_tokens))
        computed.update((new.req_id, new.num_computed_tokens) for new in out.scheduled_new_reqs)
        chunks: list[SequenceStep] = []
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        produced: list[tuple[str, int, int]] = []  # request, seed, the sampled token's output index
        for req_id, n in out.num_scheduled_tokens.items():
            seq = self.sequences[req_id]
            done = computed[req_id]
            reaches_end = done + n >= seq.tokens
            chunks.append(SequenceStep(new=n, cached=done, sampled=reaches_end))
            req_ids.append(req_id)
            if reaches_end:
                draw = seq.seed + 7919 * seq.tokens  # the token and its activations, fixed by its place
                token = self.token_ids[draw % len(self.token_ids)]
                if self.reply_tokens is not None and seq.tokens - seq.prompt + 1 >= reply_length(seq.seed,
                                                                                                  self.reply_tokens):
                    token = self.eos  # type: ignore[assignment]  # not None: checked at start
                produced.append((req_id, draw, seq.tokens - seq.prompt))
                seq.tokens += 1
                sampled.append([token])
            else:
                sampled.append([])
        if self.lens is not None and produced:
            self.lens.ship(produced)
        modelled = self.roofline.step_seconds(chunks)
        self.modelled_s += modelled
        # The GPU would be busy this long; the CPU spent on bookkeeping above counts towards it.
        remaining = modelled - (time.perf_counter() - started)
        if not chunks and offload is not None:  # nothing to run but copies: idle until one is done
            remaining = max(remaining, min(self.host_link.next_done_in() or 0.0, IDLE_POLL_S))
        if remaining > 0:
            time.sleep(remaining)
        output = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=sampled)
        if offload is not None:
            self.host_link.after_step(offload)
            output.kv_connector_output = self.host_link.finished()
        return output


# The longest an idle step waits for a copy to finish: new requests reach the engine core between steps.
IDLE_POLL_S = 0.002

# One sampled token in this many has its top concept reach that concept's tagging threshold: concept
# tags fire now and then, as a real lens fires them, not on every token.
TAG_EVERY = 20


class _EmulatedLens:
    """Each sampled token's top-k concepts, drawn from the token's place in its sequence: k distinct
    concepts, scores falling with rank below each concept's tagging threshold (its top one reaching it
    one token in TAG_EVERY); shipped as the capture worker ships a step's rows."""

    def __init__(self, settings: LensSettings, thresholds: np.ndarray) -> None:
        self.n_concepts = len(thresholds)
        self.k = min(settings.k, self.n_concepts)
        self.sender = BundlingSender(ActivationSender(settings.ipc), on_host=True)
        self.thresholds = thresholds  # 1.0 where the pack sets none
        self.falling = np.linspace(0.9, 0.5, self.k, dtype=np.float32)

    @classmethod
    def start(cls, vllm_config: Any) -> _EmulatedLens | None:
        settings = LensSettings.from_vllm_config(vllm_config)
        if settings is None:
            return None
        pack = load_pack(settings.pack)
        given = pack.thresholds or [None] * pack.n_concepts
        # Drawn over the visible concepts alone (their indices are what the writer's batches name); a hidden
        # concept is not emulated.
        given = [t for c, t in zip(pack.concept_ids, given) if c not in settings.hidden]
        return cls(settings, np.array([1.0 if t is None else t for t in given], dtype=np.float32))

    def ship(self, produced: list[tuple[str, int, int]]) -> None:
        """`produced`: each request that samples a token this step, a seed for the draw and the token's
        index in the reply."""
        positions = [position for _, _, position in produced]
        seeds = np.array([seed for _, seed, _ in produced], dtype=np.int64)
        index = (seeds[:, None] % self.n_concepts + np.arange(self.k)[None, :]) % self.n_concepts
        values = self.thresholds[index] * self.falling[None, :]
        fires = seeds % TAG_EVERY == 0
        values[fires, 0] = self.thresholds[index[fires, 0]]
        self.sender.add([engine_key(req_id) for req_id, _, _ in produced], positions, np.arange(len(produced)),
                        torch.from_numpy(index.astype(np.int32)), torch.from_numpy(values), "emulated")

    def close(self) -> None:
        self.sender.close()


# The shortest reply, its EOS included. A reply with no text is not what a model answers an agent with,
# and agent clients treat one as a failed turn: Claude Code asks again, so a drawn empty reply would
# change what the client sends.
MIN_REPLY_TOKENS = 4


def reply_length(seed: int, mean: int) -> int:
    """A reply's length in tokens, its EOS included, drawn from an exponential distribution of mean
    `mean` by the request's seed (so a request's length is fixed, and replies vary as a model's do); at
    least MIN_REPLY_TOKENS."""
    u = (zlib.crc32(seed.to_bytes(8, "little")) + 1) / 2**32  # in (0, 1]
    return max(MIN_REPLY_TOKENS, round(-mean * float(np.log(u))))


def _text_token_ids(model: str, vocab_size: int) -> tuple[list[int], int | None]:
    """The ids a reply is drawn from: the vocabulary less its special tokens (a drawn end-of-sequence
    would end replies at random; a reply ends at its drawn length, or at the client's max_tokens), and
    the model's end-of-sequence id."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or ())
    ids = [i for i in range(min(vocab_size, len(tokenizer))) if i not in special]
    if not ids:
        raise ValueError(f"{model}: no ordinary token to draw replies from")
    eos = tokenizer.eos_token_id
    return ids, eos if isinstance(eos, int) else None
