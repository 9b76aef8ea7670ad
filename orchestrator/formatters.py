"""Formatters: how each block's content becomes prompt text.

A registry of named formatters, extensible by Python entry points in the group `ahc.formatters`
(each entry point names a zero-argument factory returning a `Formatter` whose `name` is the entry point's;
orchestrator/plugins.py loads and checks them). Formatters must be pure: same inputs, same text — the
prefix cache depends on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol, cast

from core.errors import InvalidRequest
from orchestrator.context_spec import CodexDoc, KarmaEntry
from orchestrator.plugins import check_methods, load_group

ENTRY_POINT_GROUP = "ahc.formatters"


@dataclass(frozen=True)
class Excerpt:
    """A retrieved Codex chunk placed in the Query block (RAG)."""

    doc_id: str
    chunk_index: int
    text: str


class Formatter(Protocol):
    name: str

    def identity(self, text: str) -> str: ...
    def codex(self, docs: Sequence[CodexDoc]) -> str: ...
    def karma(self, entries: Sequence[KarmaEntry], summary: str | None) -> str: ...
    # `karma`: entries staged by this request (orchestrator/karma.py); they stay in State with the turn.
    def query(self, text: str, excerpts: Sequence[Excerpt], karma: Sequence[KarmaEntry] = ()) -> str: ...


class MarkdownFormatter:
    """The default: Markdown headings, one section per block."""

    name = "default"

    def identity(self, text: str) -> str:
        return text.strip()

    def codex(self, docs: Sequence[CodexDoc]) -> str:
        if not docs:
            return ""
        return "# Codex\n\n" + "\n\n".join(f"## {doc.id}\n{doc.text.strip()}" for doc in docs)

    def karma(self, entries: Sequence[KarmaEntry], summary: str | None) -> str:
        lines = [self._fact(e) for e in entries]
        if summary:
            lines.append(f"- [summary of earlier turns] {summary.strip()}")
        return "# Karma\n\n" + "\n".join(lines) if lines else ""

    def query(self, text: str, excerpts: Sequence[Excerpt], karma: Sequence[KarmaEntry] = ()) -> str:
        parts = []
        if karma:
            parts.append("New karma:\n" + "\n".join(self._fact(e) for e in karma))
        if excerpts:
            found = "\n\n".join(f"[{e.doc_id}#{e.chunk_index}]\n{e.text.strip()}" for e in excerpts)
            parts.append(f"Archive excerpts relevant to the question:\n\n{found}")
        return "\n\n".join([*parts, f"Question: {text}"]) if parts else text

    @staticmethod
    def _fact(entry: KarmaEntry) -> str:
        return f"- [{entry.id}] {entry.text.strip()}"


class XmlFormatter:
    """Each document and fact as a tagged artifact, for models trained on XML-style context."""

    name = "xml"

    def identity(self, text: str) -> str:
        return f"<identity>\n{text.strip()}\n</identity>" if text.strip() else ""

    def codex(self, docs: Sequence[CodexDoc]) -> str:
        if not docs:
            return ""
        body = "\n".join(f'<document id="{_attr(d.id)}">\n{d.text.strip()}\n</document>' for d in docs)
        return f"<codex>\n{body}\n</codex>"

    def karma(self, entries: Sequence[KarmaEntry], summary: str | None) -> str:
        facts = [self._fact(e) for e in entries]
        if summary:
            facts.append(f"<summary>{summary.strip()}</summary>")
        return "<karma>\n" + "\n".join(facts) + "\n</karma>" if facts else ""

    def query(self, text: str, excerpts: Sequence[Excerpt], karma: Sequence[KarmaEntry] = ()) -> str:
        parts = []
        if karma:
            parts.append("<new_karma>\n" + "\n".join(self._fact(e) for e in karma) + "\n</new_karma>")
        if excerpts:
            found = "\n".join(f'<excerpt doc="{_attr(e.doc_id)}" chunk="{e.chunk_index}">\n{e.text.strip()}\n</excerpt>'
                              for e in excerpts)
            parts.append(f"<excerpts>\n{found}\n</excerpts>")
        return "\n".join([*parts, f"<question>{text}</question>"]) if parts else text

    @staticmethod
    def _fact(entry: KarmaEntry) -> str:
        return f'<fact id="{_attr(entry.id)}" verbatim="{str(entry.verbatim).lower()}">{entry.text.strip()}</fact>'


def _attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


FORMATTER_METHODS = ("identity", "codex", "karma", "query")


def _formatter(name: str, made: object) -> Formatter:
    check_methods("Formatter", name, made, FORMATTER_METHODS)
    return cast(Formatter, made)


class FormatterRegistry:
    """The built-in formatters and the `ahc.formatters` plug-ins, each made once when the registry is built
    (a plug-in that fails to load is named by the requests that ask for it)."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[[], Formatter]] = {"default": MarkdownFormatter, "xml": XmlFormatter}
        self._instances: dict[str, Formatter] = {}
        loaded = load_group(ENTRY_POINT_GROUP, _formatter)
        self.broken = {name: reason for name, reason in loaded.broken.items() if name not in self._factories}
        for name, formatter in loaded.plugins.items():
            if name not in self._factories:  # a plug-in never replaces a built-in formatter
                self._factories[name] = partial(_same, formatter)
                self._instances[name] = formatter

    def names(self) -> list[str]:
        return sorted(self._factories)

    def register(self, name: str, factory: Callable[[], Formatter]) -> None:
        self._factories[name] = factory
        self._instances.pop(name, None)
        self.broken.pop(name, None)

    def get(self, name: str, param: str = "context.formatter") -> Formatter:
        if name in self.broken:
            raise InvalidRequest(f"{param}: formatter plug-in {name!r} failed to load ({self.broken[name]})",
                                 param=param)
        if name not in self._factories:
            raise InvalidRequest(f"{param}: unknown formatter {name!r}; known: {', '.join(self.names())}",
                                 param=param)
        if name not in self._instances:
            self._instances[name] = self._factories[name]()
        return self._instances[name]


def _same(formatter: Formatter) -> Formatter:
    return formatter
