"""The server's parts around the engine, built once at start-up: the orchestrator with its governors,
the hidden-call helper, and the hooks the chat route calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ahc.config import AHCConfig
from orchestrator.orchestrator import Orchestrator, Prepared
from orchestrator.session import SessionStore
from orchestrator.token_counter import TokenCounter
from orchestrator.vram_governor import KVStats, VramGovernor
from server.chat_route import ChatHooks
from server.hidden_calls import HiddenCaller
from server.metrics import AHCMetrics


@dataclass
class Services:
    config: AHCConfig
    orchestrator: Orchestrator
    governor: VramGovernor
    metrics: AHCMetrics
    recorder: Any = None  # server.recorder.Recorder once XDB is attached

    def hooks(self) -> ChatHooks:
        return ChatHooks(orchestrator=self.orchestrator, admit=self.admit, on_prepared=self.on_prepared,
                         on_reply=self.on_reply, flush=self.flush)

    async def flush(self) -> None:
        if self.recorder is not None:
            await self.recorder.aflush()

    async def admit(self, prepared: Prepared, body: dict[str, Any]) -> Prepared:
        """VRAM admission; may replace the prepared request by a compacted one."""
        if prepared.prompt is None:
            return prepared
        needed = self._blocks_needed(prepared, body)
        actions = prepared.report["governor"]
        holder: dict[str, Prepared] = {}

        async def shrink() -> int | None:
            smaller = await self.orchestrator.shrink(prepared)
            if smaller is None:
                return None
            holder["prepared"] = smaller
            return self._blocks_needed(smaller, body)

        reservation = await self.governor.admit(needed, shrink if prepared.session else None, actions)
        final = holder.get("prepared", prepared)
        if final is not prepared:
            final.report["governor"] = actions + [a for a in final.report["governor"] if a not in actions]
            body["messages"] = final.messages
        final.on_complete.append(reservation.release)
        return final

    def _blocks_needed(self, prepared: Prepared, body: dict[str, Any]) -> int:
        prompt_tokens = prepared.prompt.tokens
        cached = cached_estimate(prepared.report)
        max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        if not isinstance(max_new, int) or max_new <= 0:
            max_new = max(self.config.engine.max_model_len - prompt_tokens, 0)
        return self.governor.blocks_needed(prompt_tokens, cached, max_new)

    def on_prepared(self, prepared: Prepared) -> None:
        self.metrics.record_context(prepared.report["mode"], prepared.report["blocks"],
                                    prepared.report["governor"])
        if self.recorder is not None:
            self.recorder.record_inputs(prepared)

    def on_reply(self, prepared: Prepared, reply: dict[str, Any] | None) -> None:
        if self.recorder is not None:
            self.recorder.record_reply(prepared, reply)


def cached_estimate(report: dict[str, Any]) -> int:
    """Tokens of the blocks above the first changed one: what the prefix cache should still hold."""
    first = report.get("first_changed_block")
    if first is None and report.get("mode") == "passthrough":
        return 0
    cached = 0
    for block in report["blocks"]:
        if block["name"] == first or block["name"] == "query":
            break
        cached += block["tokens"]
    return cached


def build_services(config: AHCConfig, engine: Any, tokenizer: Any, metrics: AHCMetrics,
                   sessions: SessionStore, retriever: Any = None) -> Services:
    hidden = HiddenCaller(engine, tokenizer, config.engine.max_model_len)
    oc = config.orchestrator

    async def summarize(messages: list[dict[str, Any]]) -> str:
        return await hidden.summarize(messages, oc.compaction_max_tokens)

    counter = TokenCounter(lambda text: tokenizer.encode(text, add_special_tokens=False))
    orchestrator = Orchestrator(oc, config.engine.max_model_len, counter, sessions, retriever, summarize)
    stats = KVStats()
    metrics.kv_stats = stats
    governor = VramGovernor(stats, oc.vram_queue_timeout_s, oc.retry_after_s)
    return Services(config, orchestrator, governor, metrics)
