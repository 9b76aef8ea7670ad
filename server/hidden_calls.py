"""Calls the server makes to its own model, unseen by clients (compaction summaries).

They go to the raw engine, not through the recording wrapper: they are bookkeeping, not the agent's
experience; the compaction itself is recorded as a system event.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from server.tracing import engine_trace_headers

if TYPE_CHECKING:  # vLLM is imported when the engine starts, not with this module
    from vllm.engine.protocol import EngineClient
    from vllm.tokenizers.protocol import TokenizerLike


# Their request ids start with this, so the metrics tell them from the agents' requests.
HIDDEN_REQUEST_PREFIX = "ahc-hidden-"


@dataclass
class HiddenCaller:
    engine: EngineClient  # vLLM's AsyncLLM, not the recording wrapper
    tokenizer: TokenizerLike  # with a chat template
    max_model_len: int
    chat_template: str | None = None  # the one vLLM was given, else the tokenizer's own

    async def summarize(self, messages: list[dict[str, Any]], max_tokens: int = 128) -> str:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 chat_template=self.chat_template)
        if not isinstance(ids, list):  # newer transformers return a BatchEncoding
            ids = list(ids["input_ids"])
        budget = self.max_model_len - max_tokens - 1
        if len(ids) > budget:  # keep the instruction's head and the transcript's most recent end
            ids = ids[:64] + ids[len(ids) - (budget - 64):]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        # In the trace of the compaction that asked for it, when one is being traced.
        async for output in self.engine.generate({"prompt_token_ids": ids}, params,
                                                 request_id=f"{HIDDEN_REQUEST_PREFIX}{uuid.uuid4().hex}",
                                                 trace_headers=engine_trace_headers(None)):
            final = output
        return final.outputs[0].text if final is not None else ""
