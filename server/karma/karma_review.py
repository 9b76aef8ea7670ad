"""The review step as a service: a tenant proposes an outcome for Karma; a reviewer decides it; an accepted
outcome is Karma of its session (or of every session of its tenant) from the next turn on.

A person decides with an auditor's key or as the server's operator (not as the tenant that proposed it: a
claim is not verified by its author). The served model decides for anyone who may see the proposal: it is
asked, as a hidden call (server/model/hidden_calls.py), whether the outcome is supported by the evidence the
proposal cites (the source session's recorded rows in its tick range, or the reply its event id names), and
answers held to `VERDICT_PATTERN`. Every verdict is stored with who gave it, when and why
(xdb/karma_reviews.py). Rejected and retracted outcomes never reach a prompt.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from core.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from orchestrator.context_spec import KarmaEntry
from orchestrator.turn_request import TurnRequest
from server.admission.hidden import HiddenAdmission, admitted
from server.tenancy.tenant_xdb import TenantXDB
from server.tenancy.tenants import Tenant
from xdb import XDBClient, karma_reviews
from xdb.owner import EVERY

# The model's answer: a verdict word, then its rationale on the same line.
VERDICT_PATTERN = r"(accepted|rejected): [^\n]{1,400}"
EVIDENCE_MAX_ROWS = 1000
EVIDENCE_MAX_CHARS = 12_000
TEMPLATE_TOKENS = 32  # the chat template's around the instruction and the question (counted themselves)
ENTRY_PREFIX = "review-"  # a promoted entry's Karma id: this, then its proposal's id

REVIEW_INSTRUCTION = (
    "You verify claims against evidence. Answer on one line: 'accepted: ' or 'rejected: ' followed by a short "
    "rationale. Accept only when the evidence supports the claim; with no evidence, reject.")

# (messages, max_tokens, regex) -> the model's reply text: the hidden call, held to the pattern.
Ask = Callable[[list[dict[str, Any]], int, str], Awaitable[str]]


@dataclass(frozen=True)
class ModelVerdict:
    verdict: karma_reviews.Verdict
    rationale: str


def parse_verdict(text: str) -> ModelVerdict:
    """The model's answer as a verdict; anything that does not start with one is a rejection, its text kept
    as the rationale (a verdict is never read into an answer that does not give one)."""
    found = re.match(r"\s*(accepted|rejected)\s*:\s*(.*)", text, flags=re.S)
    if found is None:
        return ModelVerdict("rejected", f"no verdict in the reviewer model's answer: {text.strip()[:400]!r}")
    verdict: karma_reviews.Verdict = "accepted" if found.group(1) == "accepted" else "rejected"
    return ModelVerdict(verdict, found.group(2).strip() or "(none given)")


def is_reviewer(caller: Tenant) -> bool:
    """A person who may decide a proposal: an auditor, or the server's operator."""
    return caller.auditor or caller.operator


def karma_entries(promoted: Sequence[dict[str, Any]]) -> tuple[KarmaEntry, ...]:
    """Accepted proposals as Karma entries: verbatim (verified facts are never pruned or condensed)."""
    return tuple(KarmaEntry(id=f"{ENTRY_PREFIX}{p['id']}", text=p["text"], verbatim=True) for p in promoted)


@dataclass
class KarmaReview:
    xdb: XDBClient
    ask: Ask | None  # None: no model to review with (the operator's person review still works)
    model_name: str
    max_tokens: int = 120
    # A model review is a background call like a Codex rendition: the caller's tenant's hourly budget, one
    # at a time, KV blocks first (server/admission/hidden.py). None: nothing to pass (a unit test of one piece).
    admission: HiddenAdmission | None = None
    count: Callable[[str], int] = len  # a text's tokens (the served model's tokenizer)

    def proposals(self, caller: Tenant, status: str | None, limit: int) -> list[dict[str, Any]]:
        """A reviewer's: every tenant's, ids as stored; a tenant's: its own, ids as it named them."""
        if is_reviewer(caller):
            return list(self.xdb.read(karma_reviews.karma_proposals, None, status, limit))
        return TenantXDB(self.xdb, caller).karma_proposals(status, limit)

    def _found(self, caller: Tenant, proposal_id: int) -> dict[str, Any]:
        if is_reviewer(caller):
            found = self.xdb.read(karma_reviews.karma_proposal, proposal_id)
            if found is None:
                raise NotFound(f"karma proposal {proposal_id} not found")
            return found
        return TenantXDB(self.xdb, caller).karma_proposal(proposal_id)

    def _shown(self, caller: Tenant, proposal: dict[str, Any]) -> dict[str, Any]:
        return proposal if is_reviewer(caller) else TenantXDB(self.xdb, caller).shown_proposal(proposal)

    async def review(self, caller: Tenant, proposal_id: int, reviewer: Literal["person", "model"],
                     verdict: karma_reviews.Verdict | None, rationale: str | None) -> dict[str, Any]:
        proposal = await asyncio.to_thread(self._found, caller, proposal_id)
        if proposal["status"] != "pending":
            raise Conflict(f"karma proposal {proposal_id} is {proposal['status']}: only a pending one is reviewed")
        if reviewer == "model":
            decided_by, judged = self.model_name, await self._ask_model(caller, proposal)
            verdict, rationale = judged.verdict, judged.rationale
        else:
            if not is_reviewer(caller):
                raise PermissionDenied("a person's verdict on a karma proposal is given with an auditor's key or "
                                       "as the server's operator; ask the model with {\"reviewer\": \"model\"}")
            if verdict is None or not rationale:
                raise InvalidRequest("a person's review gives a verdict and a rationale", param="verdict")
            decided_by = caller.name
        stored = await asyncio.to_thread(self.xdb.write, karma_reviews.review_proposal, proposal_id, verdict,
                                         decided_by, reviewer, rationale)
        return self._shown(caller, stored)

    async def retract(self, caller: Tenant, proposal_id: int, rationale: str) -> dict[str, Any]:
        """An accepted proposal leaves every prompt from the next turn on; who took it back is recorded."""
        await asyncio.to_thread(self._found, caller, proposal_id)
        kind: Literal["person", "model"] = "person"
        stored = await asyncio.to_thread(self.xdb.write, karma_reviews.review_proposal, proposal_id, "retracted",
                                         caller.name, kind, rationale)
        return self._shown(caller, stored)

    async def _ask_model(self, caller: Tenant, proposal: dict[str, Any]) -> ModelVerdict:
        if self.ask is None:
            raise InvalidRequest("this server has no model to review with", param="reviewer")
        evidence = await asyncio.to_thread(self._evidence, proposal)
        messages = [{"role": "system", "content": REVIEW_INSTRUCTION},
                    {"role": "user", "content": f"Evidence:\n{evidence or '(none)'}\n\nClaim: {proposal['text']}\n\n"
                                                "Is the claim supported by the evidence?"}]
        prompt = await asyncio.to_thread(self.count, "".join(m["content"] for m in messages))
        async with admitted(self.admission, caller.owner, prompt + TEMPLATE_TOKENS, self.max_tokens):
            answer = await self.ask(messages, self.max_tokens, VERDICT_PATTERN)
        return parse_verdict(answer)

    def _evidence(self, proposal: dict[str, Any]) -> str:
        """The recorded text the proposal cites: its source session's rows in its tick range (those of the
        reply its event id names, when it names one), in order, the most recent kept when too long."""
        source = proposal["source"]
        if source["session_id"] is None:
            return ""
        ticks = source["tick_range"] or [None, None]
        page = self.xdb.recall_page({"session_id": source["session_id"], "tick_from": ticks[0], "tick_to": ticks[1],
                                     "limit": EVIDENCE_MAX_ROWS}, owner=EVERY)
        rows = [r for r in page["data"] if source["event_id"] is None or r.get("request_id") == source["event_id"]]
        text = "".join(str(r.get("content") or "") for r in sorted(rows, key=lambda r: (r["tick"], r["id"])))
        return text[-EVIDENCE_MAX_CHARS:]

    async def held(self, tenant: Tenant, request: TurnRequest) -> TurnRequest:
        """The request with the Karma the server holds for its session and tenant, for the orchestrator to
        merge after the client's own entries. A request without `context` is passed through as sent."""
        if request.spec is None:
            return request
        session = request.spec.session_id or request.label
        promoted = await asyncio.to_thread(self.xdb.read, karma_reviews.promoted_karma, tenant.name, session)
        if not promoted:
            return request
        return replace(request, held_karma=karma_entries(promoted))
