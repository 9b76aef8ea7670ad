"""Assembly: blocks in, prompt out, as a pure function.

Identity, Codex and Karma become the one system message (in that order); State is the message history;
Query is the last user message, with the karma entries it stages and, in RAG mode, retrieved excerpts.
Identical inputs give identical messages, hence identical prompt text and token ids through the
(prefix-stable) chat template.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.blocks import Block, prefix_sha256, sha256_hex
from orchestrator.context_spec import CodexDoc, KarmaEntry
from orchestrator.formatters import Excerpt, Formatter
from orchestrator.message import Message
from orchestrator.token_counter import MAX_CHARS, TokenCounter


@dataclass(frozen=True)
class AssemblyInput:
    identity: str
    codex: tuple[CodexDoc, ...]
    karma: tuple[KarmaEntry, ...]
    summary: str | None
    state: tuple[Message, ...]
    query: str | None
    excerpts: tuple[Excerpt, ...] = ()
    include_codex: bool = True
    staged_karma: tuple[KarmaEntry, ...] = ()  # delivered in the Query block (orchestrator/karma.py)


@dataclass(frozen=True)
class AssembledPrompt:
    messages: list[dict[str, Any]]
    blocks: list[Block]

    @property
    def tokens(self) -> int:
        return sum(block.tokens for block in self.blocks)

    @property
    def chars(self) -> int:
        return sum(len(m.get("content") or "") for m in self.messages)

    @property
    def prefix_sha256(self) -> str:
        return prefix_sha256(self.blocks)

    def hashes(self) -> dict[str, str]:
        return {block.name: block.sha256 for block in self.blocks}


class RenderCache:
    """Memo of rendered blocks, so an unchanged block costs a lookup, not a re-render and re-hash.

    Results never depend on it (assembly stays a pure function); it only skips repeated work. The
    State digest is a hash chain over message hashes, so a State that grew by one message extends the
    previous digest instead of re-hashing the whole history.

    Each memo is bounded by the characters it holds (`max_chars`) as well as by count: a rendered block
    may be a 20 MB Codex (whose key holds the documents again, so a block weighs about twice its
    text), a State every message of a long history.
    """

    def __init__(self, capacity: int = 256, max_chars: int = MAX_CHARS, states: int = 8) -> None:
        self._texts: OrderedDict[tuple[Hashable, ...], Block] = OrderedDict()
        self._text_chars = 0
        # (messages, digest, tokens, characters of the messages' texts), oldest first.
        self._states: list[tuple[tuple[Message, ...], str, int, int]] = []
        self._capacity = capacity
        self._max_states = states
        self.max_chars = max_chars

    @property
    def cached_chars(self) -> int:
        """Characters of the rendered blocks held, plus those of the States' messages."""
        return self._text_chars + sum(entry[3] for entry in self._states)

    def text_block(self, key: tuple[Hashable, ...], render: Callable[[], str], counter: TokenCounter,
                   name: str) -> Block:
        block = self._texts.get(key)
        if block is None:
            block = self._store(key, _text_block(name, render(), counter))
        else:
            self._texts.move_to_end(key)
        return block

    async def prefetch_text_block(self, key: tuple[Hashable, ...], render: Callable[[], str], counter: TokenCounter,
                                  name: str, size: int) -> None:
        """`text_block` ahead of time, rendering and counting on a worker thread when the block's
        content (`size` characters) is long, so the assembly that follows finds it done."""
        if key in self._texts or size <= counter.offload_chars:
            return

        text = await asyncio.to_thread(render)  # formatters are pure: safe off the loop
        await counter.prefetch([text])
        if key not in self._texts:  # another request may have made it meanwhile
            self._store(key, _text_block(name, text, counter))  # a cache hit now

    def _store(self, key: tuple[Hashable, ...], block: Block) -> Block:
        """Keep a block, least recently used ones making room; one longer than `max_chars` is not kept
        (it would evict everything else, then be evicted by the next: its counts stay in the counter)."""
        if len(block.text) > self.max_chars:
            return block
        self._texts[key] = block
        self._text_chars += len(block.text)
        while len(self._texts) > self._capacity or self._text_chars > self.max_chars:
            _, evicted = self._texts.popitem(last=False)
            self._text_chars -= len(evicted.text)
        return block

    def state_block(self, state: tuple[Message, ...], counter: TokenCounter) -> Block:
        best: tuple[tuple[Message, ...], str, int, int] = ((), STATE_ROOT, 0, 0)
        for entry in self._states:
            messages = entry[0]
            if len(best[0]) < len(messages) <= len(state) and _same_prefix(messages, state):
                best = entry
        done, sha, tokens, chars = best
        for message in state[len(done):]:
            sha = sha256_hex(sha + message.sha256)
            tokens += _message_tokens(message, counter)
            chars += sum(len(text) for text in message_texts((message,)))
        if len(done) != len(state) and chars <= self.max_chars:
            # Past the bounds the oldest States go: sessions hold their messages anyway, but a request
            # without one brings a State that only this list would keep alive.
            kept = self._states[max(len(self._states) + 1 - self._max_states, 0):]
            self._states = [*kept, (state, sha, tokens, chars)]
            while sum(entry[3] for entry in self._states) > self.max_chars:
                self._states.pop(0)
        return Block(name="state", text="", tokens=tokens, sha256=sha)


STATE_ROOT = sha256_hex("ahc-state")


def _same_prefix(prefix: tuple[Message, ...], state: tuple[Message, ...]) -> bool:
    return all(a is b or a == b for a, b in zip(prefix, state))


@dataclass(frozen=True)
class _TextPart:
    """One of the system message's blocks: its render-cache key, how to render it, and how many
    characters of content it holds (to decide, before rendering, whether counting it is slow)."""

    name: str
    key: tuple[Hashable, ...]
    render: Callable[[], str]
    size: int


def _text_parts(inp: AssemblyInput, formatter: Formatter) -> list[_TextPart]:
    """Identity, Codex (absent in RAG mode) and Karma, exactly as `assemble` renders and caches them."""
    name = formatter.name
    parts = [_TextPart("identity", (name, "identity", inp.identity), lambda: formatter.identity(inp.identity),
                       len(inp.identity))]
    if inp.include_codex:
        parts.append(_TextPart("codex", (name, "codex", inp.codex), lambda: formatter.codex(inp.codex),
                               sum(len(doc.text) for doc in inp.codex)))
    parts.append(_TextPart("karma", (name, "karma", inp.karma, inp.summary),
                           lambda: formatter.karma(inp.karma, inp.summary),
                           sum(len(entry.text) for entry in inp.karma) + len(inp.summary or "")))
    return parts


def _query_text(inp: AssemblyInput, formatter: Formatter) -> str:
    return formatter.query(inp.query, inp.excerpts, inp.staged_karma) if inp.query is not None else ""


async def prefetch(inp: AssemblyInput, formatter: Formatter, counter: TokenCounter, cache: RenderCache) -> None:
    """Count, on a worker thread, the long texts `assemble(inp, formatter, counter, cache)` will count,
    so that the synchronous assembly does not hold the event loop for seconds (a 20 MB Codex); its
    result is the same with or without this."""
    for part in _text_parts(inp, formatter):
        await cache.prefetch_text_block(part.key, part.render, counter, part.name, part.size)
    await counter.prefetch(message_texts(inp.state))
    await counter.prefetch([_query_text(inp, formatter)])


def message_texts(messages: Sequence[Message]) -> list[str]:
    """The texts the State block's tokens are counted from (`_message_tokens`)."""
    return [text for message in messages for text in (message.content, *(a for _, _, a in message.tool_calls))]


def assemble(inp: AssemblyInput, formatter: Formatter, counter: TokenCounter,
             cache: RenderCache | None = None) -> AssembledPrompt:
    cache = cache if cache is not None else RenderCache()
    blocks = [cache.text_block(part.key, part.render, counter, part.name) for part in _text_parts(inp, formatter)]
    if not inp.include_codex:
        blocks.insert(1, _text_block("codex", "", counter))
    texts = {block.name: block.text for block in blocks}
    blocks.append(cache.state_block(inp.state, counter))
    query = _query_text(inp, formatter)
    blocks.append(_text_block("query", query, counter))

    system = "\n\n".join(text for text in texts.values() if text)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages += [message.message for message in inp.state]
    if inp.query is not None:
        messages.append({"role": "user", "content": query})
    return AssembledPrompt(messages=messages, blocks=blocks)


def _text_block(name: str, text: str, counter: TokenCounter) -> Block:
    sha, tokens = counter.stats(text)
    return Block(name=name, text=text, tokens=tokens, sha256=sha)


def _message_tokens(message: Message, counter: TokenCounter) -> int:
    return counter.count(message.content) + sum(counter.count(a) for _, _, a in message.tool_calls)
