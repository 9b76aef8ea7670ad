"""Codex by reference and condensed renditions, engine-free: the `context.codex` forms, the XDB lookup,
the resolver, the condenser (with a stand-in model), and the orchestrator's choice of rendition."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from turn_requests import asking

from core.config import OrchestratorConfig
from core.errors import InvalidRequest, NotFound
from orchestrator.codex_renditions import CONDENSE_ACTION
from orchestrator.context_spec import CodexDoc, CodexRef, StoredCodexDoc, parse_context
from orchestrator.orchestrator import Orchestrator
from orchestrator.session import SessionStore
from orchestrator.token_counter import TokenCounter
from server.codex.codex_condenser import CodexCondenser
from server.codex.codex_resolver import CONDENSED_TAG, CodexResolver, rendition_path, text_sha256
from xdb import XDB
from xdb.documents import find_document, get_document
from xdb.owner import EVERY

MODEL = "tiny"
LONG = " ".join(f"Rule {i}: a particle of kind {i % 7} moves {i % 3} cells to the right each step." for i in range(90))


def run(coro):
    return asyncio.run(coro)


# -- the `context.codex` forms ---------------------------------------------------------------------
def test_codex_entries_may_name_a_document_by_name_version_or_hash() -> None:
    spec = parse_context({"codex": [{"id": "a", "text": "inline"}, {"document": "rules", "version": 3},
                                    {"sha256": "ab" * 32, "id": "pinned", "verbatim": True}]})
    inline, by_version, by_hash = spec.codex
    assert isinstance(inline, CodexDoc) and inline.text == "inline"
    assert isinstance(by_version, CodexRef) and (by_version.document, by_version.version) == ("rules", 3)
    assert isinstance(by_hash, CodexRef) and by_hash.verbatim and by_hash.id == "pinned"


@pytest.mark.parametrize("entry, field", [
    ({"document": "rules", "version": 0}, "context.codex.0.version"),
    ({"document": "rules", "version": True}, "context.codex.0.version"),
    ({"sha256": "not-a-hash"}, "context.codex.0.sha256"),
    ({"document": "rules", "version": 2, "sha256": "ab" * 32}, "context.codex.0"),
    ({"sha256": "ab" * 32, "version": 2}, "context.codex.0"),
    ({"document": "rules", "nope": 1}, "context.codex.0.nope"),
    ({"id": "x"}, "context.codex.0.text"),
])
def test_a_bad_reference_names_its_field(entry: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_context({"codex": [entry]})
    assert str(info.value).startswith(field + ":"), str(info.value)


def test_an_unresolved_reference_is_refused_by_the_orchestrator(counter) -> None:
    orch = Orchestrator(OrchestratorConfig(), 2048, counter, SessionStore())
    with pytest.raises(InvalidRequest, match="resolved by the server"):
        run(orch.prepare(asking(parse_context({"codex": [{"document": "rules"}]}), "q")))


# -- finding a stored version ----------------------------------------------------------------------
def test_find_document_by_id_name_version_and_hash(xdb: XDB) -> None:
    doc = xdb.add_document("rules", "v1 text", owner=EVERY)
    xdb.update_document(doc["id"], "v2 text")
    assert xdb.read(find_document, "rules", owner=EVERY)["content"] == "v2 text"
    assert xdb.read(find_document, doc["id"], version=1, owner=EVERY)["content"] == "v1 text"
    assert xdb.read(find_document, sha256=hashlib.sha256(b"v1 text").hexdigest(), owner=EVERY)["version"] == 1
    assert "content" not in xdb.read(find_document, "rules", with_content=False, owner=EVERY)
    with pytest.raises(NotFound, match="version 9"):
        xdb.read(find_document, "rules", version=9, owner=EVERY)
    xdb.add_document("rules", "another document with the same name", owner=EVERY)
    with pytest.raises(InvalidRequest, match="shared by"):
        xdb.read(find_document, "rules", owner=EVERY)
    assert xdb.read(find_document, doc["id"], owner=EVERY)["version"] == 2  # its id still names it


def test_find_document_stays_within_the_tenant(xdb: XDB) -> None:
    xdb.add_document("secret", "tenant b's", owner="b/")
    with pytest.raises(NotFound):
        xdb.read(find_document, "secret", owner="a/")
    assert xdb.read(find_document, "secret", owner="b/")["content"] == "tenant b's"


# -- the resolver ----------------------------------------------------------------------------------
class Counting:
    """The XDB, counting the full-content reads the resolver makes."""

    def __init__(self, xdb: XDB) -> None:
        self.xdb = xdb
        self.reads = 0

    def read(self, fn, *args, **kwargs):
        self.reads += fn is get_document
        return self.xdb.read(fn, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.xdb, name)


def test_a_reference_renders_the_stored_version_byte_for_byte_and_reads_it_once(xdb: XDB) -> None:
    text = "Line one.\r\n\tIndented — ünïcode ✓\n\n"
    doc = xdb.add_document("spec", text, owner=EVERY)
    xdb.update_document(doc["id"], "newer")
    counting = Counting(xdb)
    resolver = CodexResolver(counting, MODEL)  # type: ignore[arg-type]
    spec = parse_context({"codex": [{"document": "spec", "version": 1}, {"document": doc["id"], "id": "latest"}]})
    for _ in range(3):
        resolved = run(resolver.resolve(spec, ""))
        first, latest = resolved.codex
        assert isinstance(first, StoredCodexDoc) and first.text == text and first.id == "spec"
        digest = hashlib.sha256(text.encode()).hexdigest()
        assert (first.document, first.version, first.sha256) == (doc["id"], 1, digest)
        assert latest.text == "newer" and latest.id == "latest"
    assert counting.reads == 2  # each version's text read once, then served from memory


def test_resolver_errors_name_the_entry(xdb: XDB) -> None:
    xdb.add_document("spec", "text", owner=EVERY)
    resolver = CodexResolver(xdb, MODEL)
    with pytest.raises(InvalidRequest) as info:
        run(resolver.resolve(parse_context({"codex": [{"id": "a", "text": "x"}, {"document": "missing"}]}), ""))
    assert info.value.param == "context.codex.1" and "not found" in str(info.value)
    with pytest.raises(InvalidRequest, match="named 'spec'"):
        run(resolver.resolve(parse_context({"codex": [{"id": "spec", "text": "x"}, {"document": "spec"}]}), ""))


# -- condensed renditions --------------------------------------------------------------------------
class Model:
    """A stand-in for the served model: returns a fixed text and counts its calls."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.calls: list[int] = []

    async def __call__(self, messages, max_tokens: int) -> str:
        self.calls.append(max_tokens)
        return self.reply


def condenser(xdb: XDB, model: Model, resolver: CodexResolver | None = None) -> CodexCondenser:
    return CodexCondenser(model, lambda text: len(text.split()), xdb, resolver or CodexResolver(xdb, MODEL),
                          0.3, 4096)


def test_a_rendition_is_made_once_stored_as_a_document_and_found_by_the_next_request(xdb: XDB) -> None:
    model = Model("Particles move right by kind.")
    doc = xdb.add_document("rules", LONG, owner=EVERY)

    async def scenario() -> None:
        resolver = CodexResolver(xdb, MODEL)
        maker = condenser(xdb, model, resolver)
        spec = parse_context({"codex": [{"document": "rules"}, {"id": "inline", "text": LONG + " inline"}]})
        before = await resolver.resolve(spec, "")
        assert all(d.condensed is None for d in before.codex)
        maker.want(tuple(before.codex), "")
        maker.want(tuple(before.codex), "")  # asked twice while running: made once
        await asyncio.gather(*list(maker._running.values()))
        after = await resolver.resolve(spec, "")
        assert [d.condensed for d in after.codex] == [model.reply] * 2
        assert after.codex[0].condensed_version is not None
        # A new resolver (a restarted server) finds them in XDB.
        again = await CodexResolver(xdb, MODEL).resolve(spec, "")
        assert [d.condensed for d in again.codex] == [model.reply] * 2

    run(scenario())
    assert model.calls == [int(len(LONG.split()) * 0.3), int(len(LONG.split() + ["inline"]) * 0.3)]
    stored = xdb.read(find_document, path=rendition_path(MODEL, text_sha256(LONG)), owner=EVERY)
    assert stored["content"] == model.reply and CONDENSED_TAG in stored["tags"]
    assert stored["source"] == f"{doc['id']}@1"


def test_a_rendition_no_shorter_than_its_source_is_not_stored(xdb: XDB) -> None:
    made = run(condenser(xdb, Model(LONG + " and more")).condense(CodexDoc(id="r", text=LONG), ""))
    assert made is None
    with pytest.raises(NotFound):
        xdb.read(find_document, path=rendition_path(MODEL, text_sha256(LONG)), owner=EVERY)


def test_verbatim_documents_never_get_a_rendition(xdb: XDB) -> None:
    resolver = CodexResolver(xdb, MODEL)
    run(condenser(xdb, Model("short"), resolver).condense(CodexDoc(id="r", text=LONG), ""))
    spec = parse_context({"codex": [{"id": "r", "text": LONG, "verbatim": True}]})
    assert run(resolver.resolve(spec, "")).codex[0].condensed is None


# -- the orchestrator's choice ---------------------------------------------------------------------
def prepare(counter: TokenCounter, codex: list[dict], session: str = "s", mode: str = "auto"):
    orch = Orchestrator(OrchestratorConfig(), 2048, counter, SessionStore())
    spec = parse_context({"session_id": session, "identity": "You study a ring of cells.", "codex": codex,
                          "mode": mode})
    return run(orch.prepare(asking(spec, "What moves?")))


def test_a_codex_too_large_for_cag_goes_condensed_before_rag(counter: TokenCounter) -> None:
    assert counter.count(LONG) > 0.7 * 2048  # the full Codex would push auto mode to RAG
    without = prepare(counter, [{"id": "rules", "text": LONG}])
    assert without.report.mode == "rag" and [d.id for d in without.condense_wanted] == ["rules"]
    assert without.report.to_json("s")["codex"][0]["rendition"] == "excerpts"

    condensed = prepare(counter, [{"id": "rules", "text": LONG, "condensed": "Kinds move right by kind mod 3."}])
    report = condensed.report.to_json("s")
    assert report["mode"] == "cag" and CONDENSE_ACTION in report["governor"]
    assert report["codex"] == [{"id": "rules", "rendition": "condensed", "verbatim": False}]
    assert "Kinds move right by kind mod 3." in condensed.messages[0]["content"]
    assert "Rule 89" not in condensed.messages[0]["content"]
    assert condensed.condense_wanted == ()


def test_verbatim_entries_are_never_condensed(counter: TokenCounter) -> None:
    prepared = prepare(counter, [{"id": "rules", "text": LONG, "condensed": "short", "verbatim": True}])
    assert prepared.report.mode == "rag" and CONDENSE_ACTION not in prepared.report.governor
    assert prepared.condense_wanted == ()


def test_a_codex_that_fits_is_sent_whole_even_with_a_rendition(counter: TokenCounter) -> None:
    prepared = prepare(counter, [{"id": "rules", "text": "A moves right.", "condensed": "A: right."}])
    report = prepared.report.to_json("s")
    assert report["mode"] == "cag" and report["codex"][0]["rendition"] == "full"
    assert "A moves right." in prepared.messages[0]["content"]


def test_forced_cag_over_the_budget_uses_the_rendition(counter: TokenCounter) -> None:
    big = LONG + " " + LONG  # over the 1,536-token budget whole
    prepared = prepare(counter, [{"id": "rules", "text": big, "condensed": "Kinds move right."}], mode="cag")
    assert prepared.report.mode == "cag" and CONDENSE_ACTION in prepared.report.governor
