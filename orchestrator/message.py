"""One State message in canonical form, hashed and counted once when it is created.

The server keeps a session's State as these, so an unchanged history costs nothing to re-hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from core.errors import InvalidRequest
from orchestrator.blocks import canonical_json, sha256_hex

ROLES = ("user", "assistant", "tool")

# Acknowledgements that carry no fact. "yes", "no", "done" and "right" are left out: each may answer a
# question ("Does A move left or right?").
ACKNOWLEDGEMENTS = frozenset(tuple(phrase.split()) for phrase in (
    "ok", "okay", "k", "kk", "sure", "sure thing", "of course", "fine", "alright", "all right",
    "thanks", "thank you", "thanks a lot", "thanks so much", "thank you so much", "thanks very much",
    "thank you very much", "many thanks", "thx", "ty", "cheers", "you're welcome", "welcome",
    "got it", "gotcha", "understood", "noted", "ack", "roger", "roger that", "i see", "makes sense",
    "sounds good", "sounds great", "looks good", "good", "very good", "great", "cool", "nice", "perfect",
    "awesome", "excellent", "no problem", "np", "will do", "let me check", "let me see", "let me look",
    "let me think", "one moment", "one sec", "hold on", "hi", "hello", "hey", "hmm", "hm", "ah", "oh",
))
ACK_MAX_WORDS = max(len(phrase) for phrase in ACKNOWLEDGEMENTS)
# Longer than this, a message says something, whatever its words.
FILLER_MAX_CHARS = 64
# Sentence punctuation may sit between acknowledgements; any other ASCII symbol reads as code or data.
SOFT_PUNCTUATION = frozenset(" \t\n\r.,!?;:-\"'")


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[tuple[str, str, str], ...] = ()  # (id, name, arguments JSON)
    tool_call_id: str | None = None
    name: str | None = None
    # An assistant message's reasoning (vLLM's `reasoning`, once `reasoning_content`): kept so that a chat
    # template that takes reasoning back (interleaved thinking) gets it on the next turn.
    reasoning: str | None = None

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Message:
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"messages: role {role!r} cannot be part of the State (use {', '.join(ROLES)})",
                                 param="messages")
        calls = tuple((str(c.get("id", "")), str(c["function"]["name"]), _arguments(c["function"].get("arguments")))
                      for c in message.get("tool_calls") or [])
        reasoning = message.get("reasoning") or message.get("reasoning_content") if role == "assistant" else None
        return cls(role=role, content=_text(message.get("content")), tool_calls=calls,
                   tool_call_id=message.get("tool_call_id"), name=message.get("name"),
                   reasoning=reasoning if isinstance(reasoning, str) and reasoning else None)

    def to_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                     for i, n, a in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        if self.reasoning is not None:
            message["reasoning"] = self.reasoning
        return message

    @cached_property
    def message(self) -> dict[str, Any]:
        """The message, built once; callers must not mutate it."""
        return self.to_message()

    @cached_property
    def canonical(self) -> str:
        return canonical_json(self.to_message())

    @cached_property
    def sha256(self) -> str:
        return sha256_hex(self.canonical)

    @property
    def chars(self) -> int:
        return len(self.content) + sum(len(a) for _, _, a in self.tool_calls) + len(self.reasoning or "")

    @cached_property
    def is_filler(self) -> bool:
        """Small talk that carries no fact: the first thing the CTC governor prunes."""
        return is_filler(self.role, self.content, bool(self.tool_calls))


def is_filler(role: str, content: str, has_tool_calls: bool = False) -> bool:
    """True for an acknowledgement or empty chatter: a user or assistant message of nothing but
    acknowledgement phrases, punctuation or emoji. Never for a message that calls a tool or answers one
    (a call left without its result is a conversation the model and the API reject, however empty the
    result), or that holds a digit, code or any other word: pruning it could lose a fact."""
    if has_tool_calls or role == "tool" or len(content) > FILLER_MAX_CHARS:
        return False
    words: list[str] = []
    word: list[str] = []
    for char in content.lower():
        if char.isalpha() or (word and char in "'\u2019"):
            word.append("'" if char == "\u2019" else char)
            continue
        if char.isalnum() or (char.isascii() and char not in SOFT_PUNCTUATION):
            return False  # a number, or a symbol of code or data
        if word:  # whitespace, sentence punctuation or an emoji ends a word
            words.append("".join(word).rstrip("'"))
            word = []
    if word:
        words.append("".join(word).rstrip("'"))
    return _acknowledgements(words)


def _acknowledgements(words: list[str]) -> bool:
    """Whether the words are a run of acknowledgement phrases ("ok thanks", "got it let me check");
    no words at all (punctuation, emoji, nothing) counts too."""
    ends = {0}  # word positions a run of phrases reaches
    for start in range(len(words)):
        if start in ends:
            ends.update(start + n for n in range(1, ACK_MAX_WORDS + 1)
                        if tuple(words[start:start + n]) in ACKNOWLEDGEMENTS)
    return len(words) in ends


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts, in order
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise InvalidRequest("messages: content must be a string or a list of content parts", param="messages")


def _arguments(arguments: Any) -> str:
    if arguments is None:
        return "{}"
    return arguments if isinstance(arguments, str) else canonical_json(arguments)
