"""Codex entries resolved against XDB before the orchestrator sees them.

An entry may name a stored document (`{"document": "spec", "version": 3}`, or `{"sha256": …}`)
instead of carrying its text: it is rendered from that stored version, byte for byte, so a large
Codex is uploaded once and its prefix stays cached while each request stays small. And a document
that has a condensed rendition for the served model (see `server/codex/codex_condenser.py`) carries it,
for the orchestrator to use when the prompt needs room.

A stored version never changes, so its text is read from XDB once and kept here (bounded in
characters); a reference to the latest version costs one small lookup per request.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from core.errors import InvalidRequest
from orchestrator.context_spec import CodexDoc, CodexRef, CodexSet, ContextSpec, StoredCodexDoc
from xdb import XDBClient
from xdb.documents import find_document, get_document, list_documents

CONDENSED_TAG = "condensed"
LONG_TEXT = 1 << 16  # characters past which hashing leaves the event loop

K = TypeVar("K")
V = TypeVar("V")


def rendition_path(model: str, source_sha256: str) -> str:
    """Where a condensed rendition is stored: one per source text and model."""
    return f"ahc/condensed/{model}/{source_sha256}"


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Rendition:
    text: str
    label: str  # the rendition document's id@version (without the tenant's prefix)


class _Bounded(Generic[K, V]):
    """A least-recently-used map bounded by the characters of what it holds."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._chars = 0

    def get(self, key: K) -> tuple[bool, V | None]:
        if key not in self._items:
            return False, None
        self._items.move_to_end(key)
        return True, self._items[key][0]

    def put(self, key: K, value: V, chars: int) -> None:
        if key in self._items:
            self._chars -= self._items.pop(key)[1]
        if chars > self.max_chars:
            return
        self._items[key] = (value, chars)
        self._chars += chars
        while self._chars > self.max_chars:
            self._chars -= self._items.popitem(last=False)[1][1]


class CodexResolver:
    def __init__(self, xdb: XDBClient, model: str, max_chars: int = 64 << 20) -> None:
        self.xdb = xdb
        self.model = model
        self._versions: _Bounded[tuple[str, int], dict[str, Any]] = _Bounded(max_chars)
        # (owner, source sha256) -> its rendition, or None: none stored (yet).
        self._renditions: _Bounded[tuple[str, str], Rendition | None] = _Bounded(max_chars)
        # An inline document's SHA-256 by its text: a Codex sent with every turn is hashed once.
        self._digests: _Bounded[str, str] = _Bounded(max_chars)

    async def resolve(self, spec: ContextSpec, owner: str) -> ContextSpec:
        """The spec with every Codex entry a document with text (and its rendition, when stored)."""
        if not spec.codex:
            return spec
        docs: list[CodexDoc] = []
        for i, entry in enumerate(spec.codex):
            found: list[CodexDoc]
            if isinstance(entry, CodexSet):
                found = list(await self._members(entry, owner, i))
            else:
                found = [await self._stored(entry, owner, i) if isinstance(entry, CodexRef) else entry]
            for doc in found:
                if doc.condensed is None and not doc.verbatim:
                    doc = await self._with_rendition(doc, owner)
                docs.append(doc)
        ids = [doc.id for doc in docs]
        if len(ids) != len(set(ids)):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise InvalidRequest(f"context.codex: two entries are named {dup!r}; give a reference its own `id`",
                                 param="context.codex")
        return spec.model_copy(update={"codex": docs})

    def remember_rendition(self, owner: str, source_sha256: str, rendition: Rendition | None) -> None:
        self._renditions.put((owner, source_sha256), rendition, len(rendition.text) if rendition else 0)

    async def rendition(self, owner: str, source_sha256: str) -> Rendition | None:
        known, cached = self._renditions.get((owner, source_sha256))
        if known:
            return cached
        try:
            doc = await asyncio.to_thread(self.xdb.read, find_document, path=rendition_path(self.model, source_sha256),
                                          owner=owner)
        except LookupError:
            found = None
        else:
            found = Rendition(doc["content"], f"{doc['id'].removeprefix(owner)}@{doc['version']}")
        self.remember_rendition(owner, source_sha256, found)
        return found

    async def _stored(self, ref: CodexRef, owner: str, index: int) -> StoredCodexDoc:
        try:
            meta = await asyncio.to_thread(self.xdb.read, find_document, ref.document, version=ref.version,
                                           sha256=ref.sha256, owner=owner, with_content=False)
        except LookupError as exc:
            raise InvalidRequest(f"context.codex.{index}: {exc.args[0] if exc.args else exc}",
                                 param=f"context.codex.{index}") from None
        return self._doc(await self._version(meta["id"], meta["version"]), owner, ref.id, ref.verbatim)

    async def _members(self, entry: CodexSet, owner: str, index: int) -> list[StoredCodexDoc]:
        """A set's documents, latest versions, by path then name; an empty set is an error (a typo in the
        tag would otherwise serve a prompt without its Codex)."""
        listed = await asyncio.to_thread(self.xdb.read, list_documents, owner=owner, tag=entry.tag)
        members = sorted(listed, key=lambda d: (d.get("path") or "", d["name"]))
        if not members:
            raise InvalidRequest(f"context.codex.{index}: no document carries the tag {entry.tag!r}",
                                 param=f"context.codex.{index}")
        return [self._doc(await self._version(m["id"], m["version"]), owner, None, entry.verbatim) for m in members]

    async def _version(self, doc_id: str, version: int) -> dict[str, Any]:
        key = (doc_id, version)
        known, doc = self._versions.get(key)
        if not known or doc is None:
            fetched: dict[str, Any] = await asyncio.to_thread(self.xdb.read, get_document, doc_id, version=version)
            self._versions.put(key, fetched, len(fetched["content"]))
            doc = fetched
        return doc

    @staticmethod
    def _doc(doc: dict[str, Any], owner: str, name: str | None, verbatim: bool) -> StoredCodexDoc:
        return StoredCodexDoc(id=name or doc["name"], text=doc["content"], verbatim=verbatim,
                              document=doc["id"].removeprefix(owner), version=doc["version"],
                              sha256=doc["content_hash"])

    async def _digest(self, text: str) -> str:
        known, digest = self._digests.get(text)
        if not known or digest is None:
            # A long text is hashed off the event loop (a 20 MB Codex takes tens of milliseconds).
            digest = await asyncio.to_thread(text_sha256, text) if len(text) > LONG_TEXT else text_sha256(text)
            self._digests.put(text, digest, len(text))
        return digest

    async def _with_rendition(self, doc: CodexDoc, owner: str) -> CodexDoc:
        sha = doc.sha256 if isinstance(doc, StoredCodexDoc) else await self._digest(doc.text)
        rendition = await self.rendition(owner, sha)
        if rendition is None:
            return doc
        update: dict[str, Any] = {"condensed": rendition.text}
        if isinstance(doc, StoredCodexDoc):
            update["condensed_version"] = rendition.label
        return doc.model_copy(update=update)
