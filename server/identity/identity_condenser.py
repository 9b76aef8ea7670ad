"""Identity condensation: a shorter persona made by the served model from an agent's successful traces,
accepted only if it answers the caller's tests as the full Identity does.

The Identity leads every prompt, so each of its tokens is paid in every prefill the cache misses and in
every window. The served model is asked (a hidden call, temperature 0, the reply bounded by
`identity_condense_ratio` of the Identity's tokens) to rewrite it keeping what the traces the caller names
as successful show the agent relied on. Then both personas answer every test (hidden calls, temperature 0,
`identity_test_max_tokens` each): the condensation is accepted only if it passes every test the full
Identity passes (a test the full one fails is reported, not held against it) and is shorter. Every check is
stored as a version of the tenant's `ahc/identity-checks/<name>` document; an accepted persona as a version of
`ahc/identity/<name>` (doc_type `identity`), both chained in the audit log (xdb/identities.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from core.errors import NotFound, PayloadTooLarge
from server.admission.hidden import HiddenAdmission, admitted
from server.identity.identity_tests import IdentityTest
from server.tenancy.tenant_xdb import TenantXDB

INSTRUCTION = (
    "You condense an AI agent's persona (its system prompt). Rewrite the persona below in at most {budget} "
    "tokens. Keep every instruction, name, format, tool and rule that the agent's successful traces show it "
    "relied on, exactly as written; drop what the traces never needed, examples, repetition and pleasantries. "
    "Output only the condensed persona.")
MIN_TOKENS = 16
PROMPT_OVERHEAD = 96  # the instruction, the headings and the chat template's tokens
EVENT_CHARS = 600  # a trace's line at most: the traces show what was relied on, not every byte of it

Generate = Callable[[list[dict[str, Any]], int], Awaitable[str]]


@dataclass(frozen=True)
class CondenseRequest:
    identity: str
    tests: tuple[IdentityTest, ...]
    name: str = "identity"
    sessions: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()
    candidate: str | None = None  # a condensation to check instead of asking the model for one
    answer_tokens: int | None = None  # each test answer's bound, within the server's (None: the server's)


@dataclass(frozen=True)
class Limits:
    ratio: float  # the condensed reply's bound, a share of the Identity's tokens
    identity_tokens: int  # the largest Identity taken
    answer_tokens: int  # each test answer's bound
    max_model_len: int
    max_document_bytes: int


class IdentityCondenser:
    def __init__(self, generate: Generate, count: Callable[[str], int], limits: Limits,
                 admission: HiddenAdmission | None = None) -> None:
        """`generate(messages, max_tokens)`: a hidden call to the served model at temperature 0; `count`: tokens
        of a text; `admission`: what each call passes first (None: nothing, for a unit test of one piece)."""
        self.generate = generate
        self.count = count
        self.limits = limits
        self.admission = admission

    async def condense(self, request: CondenseRequest, view: TenantXDB) -> dict[str, Any]:
        """Condense, check and store; the check report with the stored documents (`check`, `identity`)."""
        before = await asyncio.to_thread(self.count, request.identity)
        if before > self.limits.identity_tokens:
            raise PayloadTooLarge(f"the identity is {before} tokens, over the {self.limits.identity_tokens}-token "
                                  "limit (orchestrator.identity_condense_max_tokens)", param="identity")
        traces = await asyncio.to_thread(read_traces, view, request.sessions, request.runs)
        condensed = request.candidate if request.candidate is not None else \
            await self._condensed(request.identity, before, traces, view.owner)
        after = await asyncio.to_thread(self.count, condensed)
        answer_tokens = min(request.answer_tokens or self.limits.answer_tokens, self.limits.answer_tokens)
        tests = [await self._both(test, request.identity, condensed, view.owner, answer_tokens)
                 for test in request.tests]
        held = [i for i, t in enumerate(tests) if t["full"]["passed"] and not t["condensed"]["passed"]]
        reason = "the condensed identity is empty" if not condensed else \
            f"the condensed identity is no shorter ({after} tokens against {before})" if after >= before else \
            f"the condensed identity fails {len(held)} test(s) the full identity passes" if held else None
        report = {"name": request.name, "accepted": reason is None, "reason": reason, "tokens_before": before,
                  "tokens_after": after, "condensed": condensed, "made_by": "caller" if request.candidate is not
                  None else "model", "sessions": list(request.sessions), "runs": list(request.runs),
                  "failing": held, "tests": tests}
        summary = f"{'accepted' if reason is None else 'refused'}: {before} -> {after} tokens"
        stored = await asyncio.to_thread(
            view.save_condensation, request.name, json.dumps(report, ensure_ascii=False),
            condensed if reason is None else None, summary=summary, max_bytes=self.limits.max_document_bytes)
        return {**report, **stored}

    async def _condensed(self, identity: str, tokens: int, traces: list[str], owner: str) -> str:
        budget = max(int(tokens * self.limits.ratio), MIN_TOKENS)
        room = self.limits.max_model_len - tokens - budget - PROMPT_OVERHEAD
        if room < 0:
            raise PayloadTooLarge(f"the identity is {tokens} tokens: with its condensed reply ({budget}) it does not "
                                  f"fit the model's {self.limits.max_model_len}-token window", param="identity")
        shown, used = await asyncio.to_thread(self._fit, traces, room)
        content = f"PERSONA:\n{identity}\n\nSUCCESSFUL TRACES:\n{shown or '(none given)'}"
        messages = [{"role": "system", "content": INSTRUCTION.format(budget=budget)},
                    {"role": "user", "content": content}]
        async with admitted(self.admission, owner, tokens + PROMPT_OVERHEAD + used, budget):
            return (await self.generate(messages, budget)).strip()

    def _fit(self, lines: list[str], room: int) -> tuple[str, int]:
        """The traces' lines, in order, as many as fit `room` tokens (the first ones: a trace's start says
        what the agent was asked and how it set about it), and their tokens."""
        kept: list[str] = []
        used = 0
        for line in lines:
            tokens = self.count(line) + 1
            if used + tokens > room:
                break
            kept.append(line)
            used += tokens
        return "\n".join(kept), used

    async def _both(self, test: IdentityTest, identity: str, condensed: str, owner: str,
                    max_tokens: int) -> dict[str, Any]:
        return {"input": test.input, "expect": test.expected(),
                "full": await self._answer(test, identity, owner, max_tokens),
                "condensed": await self._answer(test, condensed, owner, max_tokens)}

    async def _answer(self, test: IdentityTest, persona: str, owner: str, max_tokens: int) -> dict[str, Any]:
        messages = [{"role": "system", "content": persona}, {"role": "user", "content": test.input}]
        prompt = await asyncio.to_thread(self.count, persona + test.input)
        async with admitted(self.admission, owner, prompt + PROMPT_OVERHEAD, max_tokens):
            answer = await self.generate(messages, max_tokens)
        failures = test.failures(answer)
        return {"answer": answer, "passed": not failures, "failures": failures}


def read_traces(view: TenantXDB, sessions: tuple[str, ...], runs: tuple[str, ...]) -> list[str]:
    """The named traces as lines of text, each session's and run's in order; one that does not exist
    (or is another tenant's): NotFound."""
    lines: list[str] = []
    for session_id in sessions:
        try:
            turns = view.session_turns(session_id)["turns"]
        except NotFound:  # XDB's message names the id as stored, under the tenant's prefix
            raise NotFound(f"session {session_id!r} not found", param="sessions") from None
        lines.append(f"## session {session_id}")
        for turn in turns:
            lines.extend(_line(e.get("role") or e["event_type"], e["content"]) for e in turn["events"]
                         if e.get("content") and e.get("role") != "system")
            if turn.get("reply"):
                lines.append(_line("assistant", turn["reply"]))
    for run_id in runs:
        turns = view.interactions(run_id)
        if not turns:
            raise NotFound(f"run {run_id!r} not found", param="runs")
        lines.append(f"## run {run_id}")
        for turn in turns:
            lines.extend(_line(label, turn[key]) for label, key in (
                ("journal", "journal_entry"), ("tool call", "tool_call_json"), ("tool result", "tool_result_json"))
                if turn.get(key))
    return lines


def _line(label: str, text: str) -> str:
    flat = " ".join(str(text).split())
    return f"{label}: {flat[:EVENT_CHARS]}"
