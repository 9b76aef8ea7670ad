"""Condensed renditions of Codex documents, made by the served model and stored in XDB.

When a session's prompt needs room, the orchestrator would rather send each Codex document's
condensed rendition than leave the Codex out for RAG. A rendition is made once per source text and
model, by a hidden call to the served model, and stored as an XDB document (path
`ahc/condensed/<model>/<source sha256>`, tagged `condensed`, its `source` naming what it condenses),
so it survives restarts, is versioned and audited like any document, and renders byte-identically
every time after: the prefix stays cached.

A request that finds none wanted goes on without it (RAG this time); the rendition is made in the
background, once however many requests ask, and the session's next turn uses it. Each call is
admitted first (server/admission/hidden.py): within its tenant's budget, one at a time, and with its
KV blocks reserved; one refused is made by a later request that asks again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from core.errors import RateLimited
from orchestrator.context_spec import CodexDoc, StoredCodexDoc
from server.admission.hidden import HiddenAdmission, admitted
from server.codex.codex_resolver import CONDENSED_TAG, CodexResolver, Rendition, rendition_path, text_sha256
from xdb import XDBClient

log = logging.getLogger("ahc.codex")


INSTRUCTION = (
    "You condense reference documents for an AI agent's context window. Rewrite the document below in at "
    "most {budget} tokens. Keep every fact, name, number, unit, rule, constraint and API signature exactly; "
    "drop examples, repetition, pleasantries and prose. Output only the condensed document.")
MIN_TOKENS = 16
PROMPT_OVERHEAD = 64  # the instruction and the chat template's tokens around the source

Generate = Callable[[list[dict[str, Any]], int], Awaitable[str]]


class CodexCondenser:
    def __init__(self, generate: Generate, count: Callable[[str], int], xdb: XDBClient, resolver: CodexResolver,
                 ratio: float, max_model_len: int, admission: HiddenAdmission | None = None) -> None:
        """`generate(messages, max_tokens)`: a hidden call to the served model; `count`: tokens of a text;
        `admission`: what each call passes first (None: nothing, for a unit test of one piece)."""
        self.generate = generate
        self.count = count
        self.xdb = xdb
        self.resolver = resolver
        self.ratio = ratio
        self.max_model_len = max_model_len
        self.admission = admission
        self._running: dict[tuple[str, str], asyncio.Task[Rendition | None]] = {}

    def want(self, docs: tuple[CodexDoc, ...], owner: str) -> None:
        """Start making the renditions these documents lack (in the background, once each)."""
        for doc in docs:
            self._task(doc, owner)

    async def rendition_for(self, doc: CodexDoc, owner: str) -> Rendition | None:
        """The document's rendition, made now if need be (joining a run already making it)."""
        return await asyncio.shield(self._task(doc, owner))

    def _task(self, doc: CodexDoc, owner: str) -> asyncio.Task[Rendition | None]:
        key = (owner, _sha(doc))
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(self.condense(doc, owner))
            self._running[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        return task

    def _done(self, key: tuple[str, str], task: asyncio.Task[Rendition | None]) -> None:
        self._running.pop(key, None)
        error = None if task.cancelled() else task.exception()
        if isinstance(error, RateLimited):
            log.info("a Codex document was not condensed now: %s", error)
        elif error is not None:
            log.warning("condensing Codex document failed: %r", error)

    async def condense(self, doc: CodexDoc, owner: str) -> Rendition | None:
        """The document's rendition: the stored one, else a new one made and stored now. None when the
        model's text is no shorter than the source (it is not stored; the request goes on without)."""
        sha = _sha(doc)
        existing = await self.resolver.rendition(owner, sha)
        if existing is not None:
            return existing
        source_tokens = await asyncio.to_thread(self.count, doc.text)
        budget = max(int(source_tokens * self.ratio), MIN_TOKENS)
        prompt_tokens = source_tokens + PROMPT_OVERHEAD
        if prompt_tokens + budget > self.max_model_len:  # the whole source must fit the call's window
            log.info("Codex document %r (%d tokens) is too long to condense in one call", doc.id, source_tokens)
            return None
        messages = [{"role": "system", "content": INSTRUCTION.format(budget=budget)},
                    {"role": "user", "content": doc.text}]
        async with admitted(self.admission, owner, prompt_tokens, budget):
            text = (await self.generate(messages, budget)).strip()
        if not text or await asyncio.to_thread(self.count, text) >= source_tokens:
            log.info("the condensed rendition of %r was no shorter than its source; not stored", doc.id)
            return None
        source = f"{doc.document}@{doc.version}" if isinstance(doc, StoredCodexDoc) else f"inline:{doc.id}"
        stored = await asyncio.to_thread(
            self.xdb.add_document, f"{doc.id} (condensed)", text, path=rendition_path(self.resolver.model, sha),
            tags=[CONDENSED_TAG, self.resolver.model], source=source,
            summary=f"condensed from {source_tokens} tokens (sha256 {sha})", owner=owner)
        rendition = Rendition(stored["content"], f"{stored['id'].removeprefix(owner)}@{stored['version']}")
        self.resolver.remember_rendition(owner, sha, rendition)
        return rendition

    def cancel(self) -> None:
        """At shutdown: renditions under way are dropped (nothing is stored half-made)."""
        for task in list(self._running.values()):
            task.cancel()


def _sha(doc: CodexDoc) -> str:
    return doc.sha256 if isinstance(doc, StoredCodexDoc) else text_sha256(doc.text)


def source_document(doc: dict[str, Any]) -> CodexDoc:
    """A stored document version as the Codex entry it would be."""
    return StoredCodexDoc(id=doc["name"], text=doc["content"], document=doc["id"], version=doc["version"],
                          sha256=doc["content_hash"])
