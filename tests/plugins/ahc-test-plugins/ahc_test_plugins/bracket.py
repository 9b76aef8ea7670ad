"""A formatter that marks each block with double brackets: text no built-in formatter writes."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.context_spec import CodexDoc, KarmaEntry
from orchestrator.formatters import Excerpt


class BracketFormatter:
    name = "bracket"

    def identity(self, text: str) -> str:
        return f"[[identity]]\n{text.strip()}" if text.strip() else ""

    def codex(self, docs: Sequence[CodexDoc]) -> str:
        return "\n".join(f"[[codex {doc.id}]]\n{doc.text.strip()}" for doc in docs)

    def karma(self, entries: Sequence[KarmaEntry], summary: str | None) -> str:
        facts = [f"[[fact {e.id}]] {e.text.strip()}" for e in entries]
        if summary:
            facts.append(f"[[summary]] {summary.strip()}")
        return "\n".join(facts)

    def query(self, text: str, excerpts: Sequence[Excerpt], karma: Sequence[KarmaEntry] = ()) -> str:
        found = [f"[[excerpt {e.doc_id}#{e.chunk_index}]]\n{e.text.strip()}" for e in excerpts]
        staged = [f"[[new fact {e.id}]] {e.text.strip()}" for e in karma]
        return "\n".join([*staged, *found, f"[[question]] {text}"]) if found or staged else text
