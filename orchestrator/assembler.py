"""Assembly: blocks in, prompt out, as a pure function.

Identity, Codex and Karma become the one system message (in that order); State is the turn history;
Query is the last user message, with the karma entries it stages and, in RAG mode, retrieved excerpts.
Identical inputs give identical messages, hence identical prompt text and token ids through the
(prefix-stable) chat template.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from orchestrator.blocks import Block, prefix_sha256, sha256_hex
from orchestrator.context_spec import CodexDoc, KarmaEntry
from orchestrator.formatters import Excerpt, Formatter
from orchestrator.token_counter import TokenCounter
from orchestrator.turn import Turn


@dataclass(frozen=True)
class AssemblyInput:
    identity: str
    codex: tuple[CodexDoc, ...]
    karma: tuple[KarmaEntry, ...]
    summary: str | None
    state: tuple[Turn, ...]
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
    State digest is a hash chain over turn hashes, so a State that grew by one turn extends the
    previous digest instead of re-hashing the whole history.
    """

    def __init__(self, capacity: int = 256) -> None:
        self._texts: dict[tuple[Hashable, ...], Block] = {}
        self._states: list[tuple[tuple[Turn, ...], str, int]] = []
        self._capacity = capacity

    def text_block(self, key: tuple[Hashable, ...], render: Callable[[], str], counter: TokenCounter,
                   name: str) -> Block:
        block = self._texts.get(key)
        if block is None:
            if len(self._texts) >= self._capacity:
                self._texts.pop(next(iter(self._texts)))
            block = self._texts[key] = _text_block(name, render(), counter)
        return block

    def state_block(self, state: tuple[Turn, ...], counter: TokenCounter) -> Block:
        best: tuple[tuple[Turn, ...], str, int] = ((), STATE_ROOT, 0)
        for entry in self._states:
            turns = entry[0]
            if len(best[0]) < len(turns) <= len(state) and _same_prefix(turns, state):
                best = entry
        done, sha, tokens = best
        for turn in state[len(done):]:
            sha = sha256_hex(sha + turn.sha256)
            tokens += _turn_tokens(turn, counter)
        if len(done) != len(state):
            self._states = [*self._states[-7:], (state, sha, tokens)]
        return Block(name="state", text="", tokens=tokens, sha256=sha)


STATE_ROOT = sha256_hex("ahc-state")


def _same_prefix(prefix: tuple[Turn, ...], state: tuple[Turn, ...]) -> bool:
    return all(a is b or a == b for a, b in zip(prefix, state))


def assemble(inp: AssemblyInput, formatter: Formatter, counter: TokenCounter,
             cache: RenderCache | None = None) -> AssembledPrompt:
    cache = cache if cache is not None else RenderCache()
    name = formatter.name
    blocks = [
        cache.text_block((name, "identity", inp.identity), lambda: formatter.identity(inp.identity),
                         counter, "identity"),
        cache.text_block((name, "codex", inp.codex), lambda: formatter.codex(inp.codex), counter, "codex")
        if inp.include_codex else _text_block("codex", "", counter),
        cache.text_block((name, "karma", inp.karma, inp.summary), lambda: formatter.karma(inp.karma, inp.summary),
                         counter, "karma"),
    ]
    texts = {block.name: block.text for block in blocks}
    blocks.append(cache.state_block(inp.state, counter))
    query = formatter.query(inp.query, inp.excerpts, inp.staged_karma) if inp.query is not None else ""
    blocks.append(_text_block("query", query, counter))

    system = "\n\n".join(text for text in texts.values() if text)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages += [turn.message for turn in inp.state]
    if inp.query is not None:
        messages.append({"role": "user", "content": query})
    return AssembledPrompt(messages=messages, blocks=blocks)


def _text_block(name: str, text: str, counter: TokenCounter) -> Block:
    sha, tokens = counter.stats(text)
    return Block(name=name, text=text, tokens=tokens, sha256=sha)


def _turn_tokens(turn: Turn, counter: TokenCounter) -> int:
    return counter.count(turn.content) + sum(counter.count(a) for _, _, a in turn.tool_calls)
