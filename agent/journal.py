"""Tier 3, the rolling journal: the raw turns since the last compaction.

A turn is the message that opened it, the agent's LAB NOTE (its reasoning), the tool calls it made
and their results. The journal renders turns as chat messages (the session's State on the server),
as interaction_log rows (the permanent record, results in full) and as a transcript (for the
compaction summary). Results in the prompt are cut to `max_result_chars`: the full text stays in
interaction_log, where query_log finds it again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

CHARS_PER_TOKEN = 3  # a conservative estimate for JSON-heavy text; the server's report has exact counts


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: str  # the JSON text exactly as the policy emitted it

    def parsed(self) -> Any:
        try:
            return json.loads(self.arguments)
        except (json.JSONDecodeError, TypeError):
            return None


@dataclass
class JournalEntry:
    turn: int
    query: str
    note: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # the reply held no usable tool call

    def result_text(self, k: int, max_chars: int) -> str:
        return clip(json.dumps(self.results[k], sort_keys=True), max_chars)

    def messages(self, max_result_chars: int) -> list[dict[str, Any]]:
        """The turn as chat messages: the opening user message, the reply, the tool results."""
        out: list[dict[str, Any]] = [{"role": "user", "content": self.query}, self.reply_message()]
        return out + self.result_messages(max_result_chars)

    def reply_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.note}
        if self.calls:
            message["tool_calls"] = [{"id": c.call_id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in self.calls]
        return message

    def result_messages(self, max_result_chars: int) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": call.call_id, "content": self.result_text(k, max_result_chars)}
                for k, call in enumerate(self.calls)]

    def tokens(self, max_result_chars: int) -> int:
        """Estimated tokens this turn holds in the prompt."""
        return sum(estimate_tokens(json.dumps(m, sort_keys=True)) for m in self.messages(max_result_chars))

    def transcript(self, max_result_chars: int) -> str:
        lines = [f"turn {self.turn}: {clip(self.note, 400)}" if self.note else f"turn {self.turn}:"]
        for k, call in enumerate(self.calls):
            lines.append(f"  {call.name}({clip(call.arguments, 300)}) -> {self.result_text(k, max_result_chars)}")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)

    def rows(self, attempt: int) -> list[dict[str, Any]]:
        """interaction_log rows: one per tool call (the note on the first), or one for a reply with
        no usable call. The turn and attempt ride in tool_call_json, so a resumed run can tell a
        completed turn's rows from those of a turn cut off by a kill."""
        rows = []
        for k, call in enumerate(self.calls):
            call_json = {"turn": self.turn, "attempt": attempt, "id": call.call_id, "name": call.name,
                         "arguments": call.arguments}
            result = json.dumps(self.results[k], sort_keys=True)
            rows.append(_row(self.note if k == 0 else None, call_json, result))
        if not self.calls:
            call_json = {"turn": self.turn, "attempt": attempt, "id": None, "name": None, "arguments": None}
            rows.append(_row(self.note, call_json, json.dumps({"error": self.error or "no tool call"})))
        return rows

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JournalEntry:
        return cls(**{**data, "calls": [ToolCall(**c) for c in data.get("calls", [])]})


def _row(note: str | None, call_json: dict[str, Any], result_json: str) -> dict[str, Any]:
    call = json.dumps(call_json, sort_keys=True)
    return {"journal_entry": note, "tool_call_json": call, "tool_result_json": result_json,
            "token_count": estimate_tokens((note or "") + call + result_json)}


@dataclass
class Journal:
    """The turns since the last compaction, oldest first."""

    entries: list[JournalEntry] = field(default_factory=list)
    max_result_chars: int = 1500

    def append(self, entry: JournalEntry) -> None:
        self.entries.append(entry)

    def tokens(self) -> int:
        return sum(entry.tokens(self.max_result_chars) for entry in self.entries)

    def messages(self) -> list[dict[str, Any]]:
        return [m for entry in self.entries for m in entry.messages(self.max_result_chars)]

    def transcript(self, entries: list[JournalEntry] | None = None) -> str:
        return "\n".join(entry.transcript(self.max_result_chars) for entry in
                         (self.entries if entries is None else entries))

    def oldest(self, keep: int) -> list[JournalEntry]:
        """All but the `keep` most recent turns."""
        return self.entries[:max(len(self.entries) - keep, 0)]

    def drop_oldest(self, count: int) -> list[JournalEntry]:
        gone, self.entries = self.entries[:count], self.entries[count:]
        return gone

    def to_json(self) -> list[dict[str, Any]]:
        return [entry.to_json() for entry in self.entries]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]], max_result_chars: int) -> Journal:
        return cls([JournalEntry.from_json(e) for e in data], max_result_chars)


def clip(text: str, max_chars: int) -> str:
    """Cut text to max_chars, saying how much was left out."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... [{len(text) - max_chars} more chars in interaction_log]"
