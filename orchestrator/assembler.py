"""Assembly: blocks in, prompt out, as a pure function.

Identity, Codex and Karma become the one system message (in that order); State is the turn history;
Query is the last user message, with retrieved excerpts in RAG mode. Identical inputs give identical
messages, hence identical prompt text and token ids through the (prefix-stable) chat template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from orchestrator.blocks import Block, canonical_json, prefix_sha256, sha256_hex
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


def assemble(inp: AssemblyInput, formatter: Formatter, counter: TokenCounter) -> AssembledPrompt:
    texts = {
        "identity": formatter.identity(inp.identity),
        "codex": formatter.codex(inp.codex) if inp.include_codex else "",
        "karma": formatter.karma(inp.karma, inp.summary),
    }
    blocks = [_text_block(name, text, counter) for name, text in texts.items()]
    blocks.append(_state_block(inp.state, counter))
    query = formatter.query(inp.query, inp.excerpts) if inp.query is not None else ""
    blocks.append(_text_block("query", query, counter))

    system = "\n\n".join(text for text in texts.values() if text)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages += [turn.to_message() for turn in inp.state]
    if inp.query is not None:
        messages.append({"role": "user", "content": query})
    return AssembledPrompt(messages=messages, blocks=blocks)


def _text_block(name: str, text: str, counter: TokenCounter) -> Block:
    sha, tokens = counter.stats(text)
    return Block(name=name, text=text, tokens=tokens, sha256=sha)


def _state_block(state: Sequence[Turn], counter: TokenCounter) -> Block:
    # Hash of the turn hashes: each turn was hashed once, when it joined the State.
    sha = sha256_hex(canonical_json([turn.sha256 for turn in state]))
    tokens = sum(counter.count(turn.content) + sum(counter.count(a) for _, _, a in turn.tool_calls)
                 for turn in state)
    return Block(name="state", text="", tokens=tokens, sha256=sha)
