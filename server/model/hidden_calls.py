"""Calls the server makes to its own model, unseen by clients (compaction summaries).

They go to the raw engine, not through the recording wrapper: they are bookkeeping, not the agent's
experience; the compaction itself is recorded as a system event.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from orchestrator.compaction import SummaryReply
from server.telemetry.tracing import engine_trace_headers
from server.tenancy.request_context import current_tenant
from server.tenancy.tenants import TenantKeys

if TYPE_CHECKING:  # vLLM is imported when the engine starts, not with this module
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.inputs import TokensPrompt
    from vllm.inputs.engine import TokensInput
    from vllm.renderers.chat_utils import ChatCompletionMessageParam
    from vllm.tokenizers.protocol import TokenizerLike


# Their request ids start with this, so the metrics tell them from the agents' requests.
HIDDEN_REQUEST_PREFIX = "ahc-hidden-"


@dataclass
class HiddenCaller:
    engine: EngineClient  # vLLM's AsyncLLM, not the recording wrapper
    tokenizer: TokenizerLike  # with a chat template
    max_model_len: int
    chat_template: str | None = None  # the one vLLM was given, else the tokenizer's own
    # vLLM's chat handler, once its app is built: a call that continues an agent's prompt must be
    # rendered exactly as that prompt was (vLLM's message normalisation, tools, template kwargs) for
    # its token ids, and so its prefix cache, to match. Before that: the tokenizer's template.
    serving: OpenAIServingChat | None = None
    # A call made for a tenant's request (a compaction, a condensed Codex) is salted as its requests
    # are: it continues their cached prompt, and no other tenant learns from it.
    keys: TenantKeys | None = None

    async def summarize(self, messages: list[dict[str, Any]], max_tokens: int = 128, *, system: bool = False) -> str:
        return (await self.complete(messages, max_tokens, system=system)).text

    async def complete(self, messages: list[dict[str, Any]], max_tokens: int,
                       tools: Sequence[dict[str, Any]] = (), *, system: bool = False,
                       regex: str | None = None) -> SummaryReply:
        """`system`: a call of the server's own over many tenants' rows, salted as no tenant's. `regex`: the
        reply is held to it (a grammar: the review step's verdict)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        ids = await self.render(messages, tools)
        budget = self.max_model_len - max_tokens - 1
        if len(ids) > budget:  # keep the instruction's head and the transcript's most recent end
            ids = ids[:64] + ids[len(ids) - (budget - 64):]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY,
                                structured_outputs=None if regex is None else StructuredOutputsParams(regex=regex))
        final = None
        prompt: TokensPrompt = {"prompt_token_ids": ids}
        salt = None if self.keys is None else self.keys.system_salt() if system else \
            self.keys.cache_salt(current_tenant.get())
        if salt is not None:
            prompt["cache_salt"] = salt
        # In the trace of the compaction that asked for it, when one is being traced.
        async for output in self.engine.generate(prompt, params,
                                                 request_id=f"{HIDDEN_REQUEST_PREFIX}{uuid.uuid4().hex}",
                                                 trace_headers=engine_trace_headers(None)):
            final = output
        if final is None:
            return SummaryReply("", len(ids), 0)
        return SummaryReply(final.outputs[0].text, len(ids), final.num_cached_tokens or 0)

    async def render(self, messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> list[int]:
        """The prompt's token ids, as vLLM's chat handler renders a request with these messages and tools."""
        if self.serving is not None:
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
            from vllm.entrypoints.serve.engine.protocol import ErrorResponse

            request = ChatCompletionRequest(messages=messages, tools=list(tools) or None)
            rendered = await self.serving.online_renderer.render_chat(request)  # no model check, no request log
            if isinstance(rendered, ErrorResponse):
                raise ValueError(f"the hidden call's prompt cannot be rendered: {rendered.error.message}")
            # vLLM types the input as any engine input; a text chat's is a TokensInput
            return list(cast("TokensInput", rendered[1][0])["prompt_token_ids"])
        # The messages are OpenAI chat dicts, which vLLM's signature names by its TypedDicts.
        chat = cast("list[ChatCompletionMessageParam]", messages)
        ids = self.tokenizer.apply_chat_template(chat, tools=list(tools) or None, add_generation_prompt=True,
                                                 tokenize=True, chat_template=self.chat_template)
        if isinstance(ids, list):
            return ids
        encoding: Any = ids  # newer transformers return a BatchEncoding, which vLLM's signature leaves out
        return list(encoding["input_ids"])
