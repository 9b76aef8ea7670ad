"""orchestrator.retrieval against the real all-MiniLM-L6-v2 and real DuckDB (fts + vss)."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from orchestrator.retrieval import (
    QUERY_ARCHIVE_TOOL,
    CodexIndex,
    CodexRetriever,
    CodexTooLarge,
    Embedder,
    RagLimits,
    ScopedIndexes,
    chunk_document,
    query_archive,
)

CORPUS: list[tuple[str, str]] = [
    ("bees", "Honeybees share the position of flowers with their hive mates through a waggle dance. "
             "The angle of the run against gravity encodes the direction relative to the sun, and its "
             "duration encodes the distance.\n\nA colony holds one queen, thousands of workers and, in "
             "summer, a few hundred drones."),
    ("rockets", "A launch vehicle climbs by throwing mass backwards: Newton's third law. Kerosene and "
                "liquid oxygen burn in the combustion chamber and leave through a bell nozzle.\n\nStaging "
                "drops empty tanks so the remaining engines push less dead weight."),
    ("sourdough", "Sourdough relies on a starter of flour and water colonised by wild yeast and lactic "
                  "acid bacteria. The yeast releases carbon dioxide that is trapped by gluten.\n\nA long "
                  "cold proof in the refrigerator deepens the sour flavour of the loaf."),
    ("volcano", "Magma that reaches the surface becomes lava. Basaltic lava is runny and builds broad "
                "shield volcanoes such as those of Hawaii.\n\nSticky, gas-rich magma explodes instead, "
                "throwing ash columns kilometres into the stratosphere."),
    ("chess", "In chess the bishop moves any number of squares diagonally. Castling moves the king two "
              "squares toward a rook, which jumps over it.\n\nA pawn that reaches the last rank is "
              "promoted, usually to a queen."),
    ("tides", "Ocean tides come from the difference in the Moon's gravitational pull across the Earth. "
              "Spring tides, the largest, happen when Sun and Moon line up at new and full moon."),
    ("maintenance", "Routine maintenance of the pumping station follows the quarterly schedule. Operators "
                    "record pressures, inspect seals and lubricate bearings.\n\nIf the controller shows "
                    "fault code QX-7731, close valve four before resetting the controller; the manual "
                    "forbids a reset under pressure.\n\nFilters are replaced every six months, and the "
                    "logbook is signed by the shift supervisor."),
    ("violin", "A violin has four strings tuned in fifths. The bow is strung with horsehair coated in "
               "rosin so that it grips the string and sets it vibrating."),
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture(scope="module")
def index(embedder: Embedder) -> CodexIndex:
    # Small chunks so documents have several and the right one must be picked within a document.
    idx = CodexIndex(None, embedder=embedder, max_tokens=64, overlap=12)
    idx.sync(CORPUS)
    return idx


def covered(chunks, text: str) -> bool:
    """Every non-whitespace character of `text` lies inside some chunk."""
    mask = np.zeros(len(text), dtype=bool)
    for c in chunks:
        mask[c.start_char:c.end_char] = True
    return all(mask[i] or ch.isspace() for i, ch in enumerate(text))


# --- chunking ---------------------------------------------------------------------------------------

def test_chunking_is_deterministic_exact_and_covers_the_text(embedder: Embedder) -> None:
    text = ("\n\n".join(doc for _, doc in CORPUS) + "\n\nEnd. \"Quoted sentence.\" Next one!  "
            + "word " * 150 + "\n" + "Z" * 900 + "\n\n  trailing paragraph.  ")
    first = chunk_document("d", text, max_tokens=60, overlap=12, count_tokens=embedder.count_tokens)
    again = chunk_document("d", text, max_tokens=60, overlap=12, count_tokens=embedder.count_tokens)
    assert first == again and len(first) > 10
    assert [c.chunk_index for c in first] == list(range(len(first)))
    for c in first:
        assert c.text == text[c.start_char:c.end_char] and c.text == c.text.strip()
        assert embedder.count_tokens(c.text) <= 60
    assert covered(first, text)
    starts = [c.start_char for c in first]
    assert starts == sorted(set(starts))  # always advances
    assert any(b.start_char < a.end_char for a, b in zip(first, first[1:]))  # overlap happens


def test_chunks_end_on_paragraph_boundaries_when_they_can() -> None:
    paragraphs = [f"Paragraph {i} says something. " * 10 for i in range(8)]  # 40 tokens each
    text = "\n\n".join(p.strip() for p in paragraphs)
    count = lambda s: len(s.split())  # noqa: E731
    chunks = chunk_document("d", text, max_tokens=100, overlap=0, count_tokens=count)
    assert len(chunks) == 4
    for c in chunks:
        assert c.text.startswith("Paragraph") and (c.end_char == len(text) or text[c.end_char:c.end_char + 2] == "\n\n")


class MeteredCount:
    """A token counter that tallies what it tokenizes and fails once that passes `budget` characters,
    so a quadratic chunker fails fast instead of running for minutes."""

    def __init__(self, count, budget: int) -> None:
        self.count, self.budget, self.calls, self.chars = count, budget, 0, 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        self.chars += len(text)
        assert self.chars <= self.budget, f"tokenized {self.chars} characters, over {self.budget}"
        return int(self.count(text))


def test_chunking_a_blob_without_whitespace_is_linear() -> None:
    # ~1.3 characters a token, denser where the blob has punctuation, like WordPiece on base64
    pieces = re.compile(r"[A-Za-z0-9]{1,3}|[^A-Za-z0-9]")
    rng = random.Random(7)
    blob = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
                   for _ in range(2_000_000))
    count = MeteredCount(lambda s: len(pieces.findall(s)), budget=3 * len(blob))
    chunks = chunk_document("d", blob, max_tokens=200, overlap=40, count_tokens=count)
    assert count.chars <= 3 * len(blob)
    assert count.calls <= 2 * len(chunks) + 2  # about one count a piece
    assert "".join(c.text for c in chunks) == blob  # pieces of a blob do not overlap: each fills a chunk
    assert all(len(pieces.findall(c.text)) <= 200 for c in chunks)
    assert min(len(pieces.findall(c.text)) for c in chunks[:-1]) >= 100  # and fills it well


def test_chunking_a_blob_with_the_real_tokenizer_is_linear(embedder: Embedder) -> None:
    blob = base64.b64encode(random.Random(3).randbytes(75_000)).decode()
    count = MeteredCount(embedder.count_tokens, budget=3 * len(blob))
    chunks = chunk_document("d", blob, max_tokens=200, overlap=40, count_tokens=count)
    assert "".join(c.text for c in chunks) == blob
    assert all(embedder.count_tokens(c.text) <= 200 for c in chunks)


def test_chunking_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        chunk_document("d", "x", max_tokens=10, overlap=10)


# --- embedder ---------------------------------------------------------------------------------------

def test_embedder_normalised_deterministic_and_order_free(embedder: Embedder) -> None:
    texts = ["a cat sat on the mat", "rockets burn kerosene", "short"]
    vecs = embedder.embed(texts)
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(embedder.embed(texts[::-1]), vecs[::-1])
    assert embedder.embed([]).shape == (0, 384)
    # Paraphrases are closer than unrelated text.
    cat, kitten, rocket = embedder.embed(["a cat sat on the mat", "a kitten rested on the rug", "rocket"])
    assert cat @ kitten > cat @ rocket + 0.2


# --- search -----------------------------------------------------------------------------------------

def test_paraphrased_query_finds_the_passage_by_meaning(index: CodexIndex) -> None:
    top = index.search("How do insects tell each other where to find nectar?", k=3)
    assert top[0].chunk.doc_id == "bees" and top[0].chunk.chunk_index == 0
    assert top[0].retrievers == ("vector",)  # no word in common: the vector side found it
    top = index.search("Why does the moon make the sea rise and fall?", k=1)
    assert top[0].chunk.doc_id == "tides"


def test_rare_keyword_ranks_its_chunk_first_by_bm25(index: CodexIndex) -> None:
    top = index.search("QX-7731", k=4)
    assert "QX-7731" in top[0].chunk.text and top[0].chunk.doc_id == "maintenance"
    assert top[0].bm25_rank == 1 and "bm25" in top[0].retrievers
    # Only chunks that contain the code are BM25 hits at all.
    assert all("QX-7731" in r.chunk.text for r in top if "bm25" in r.retrievers)


def test_bm25_ranks_like_the_fts_macro(index: CodexIndex) -> None:
    # Our one-pass BM25 query must rank as fts's own match_bm25 does.
    for query in ["queen workers drones", "lava magma ash", "valve controller reset QX-7731", "the of"]:
        ours = [(c.doc_id, c.chunk_index) for c in index._bm25_top(query, 50)]
        macro = index._con.execute(
            "SELECT doc_id, chunk_index FROM (SELECT *, fts_main_chunks.match_bm25(id, ?) AS s FROM chunks) "
            "WHERE s IS NOT NULL ORDER BY s DESC, doc_id, chunk_index", [query]).fetchall()
        assert ours == macro and (ours or query == "the of")


def test_same_query_gives_identical_results(index: CodexIndex) -> None:
    query = "what happens to lava and ash in an eruption"
    first = json.dumps([r.to_dict() for r in index.search(query, k=6)])
    with ThreadPoolExecutor(4) as pool:  # from worker threads too, as the server calls it
        others = list(pool.map(lambda _: json.dumps([r.to_dict() for r in index.search(query, k=6)]), range(4)))
    assert others == [first] * 4
    ranked = json.loads(first)
    assert ranked[0]["doc_id"] == "volcano"
    assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)


def test_empty_index_finds_nothing(embedder: Embedder) -> None:
    idx = CodexIndex(None, embedder=embedder)
    assert idx.search("anything at all", k=3) == []
    idx.sync([("a", "")])  # an empty document has no chunks
    assert idx.chunk_count() == 0 and idx.search("anything", k=3) == []


def test_search_rejects_empty_query_and_bad_k(index: CodexIndex) -> None:
    with pytest.raises(ValueError):
        index.search("   ")
    with pytest.raises(ValueError):
        index.search("bees", k=0)


# --- sync -------------------------------------------------------------------------------------------

def test_resync_without_changes_embeds_nothing(index: CodexIndex, embedder: Embedder) -> None:
    before, chunks = embedder.texts_embedded, index.chunks()
    stats = index.sync(CORPUS)
    assert embedder.texts_embedded == before
    assert (stats.chunks_embedded, stats.docs_unchanged, stats.docs_updated) == (0, len(CORPUS), 0)
    assert index.chunks() == chunks


def test_edited_doc_reembeds_only_what_changed_and_drops_old_chunks(embedder: Embedder) -> None:
    idx = CodexIndex(None, embedder=embedder, max_tokens=64, overlap=12)
    docs = dict(CORPUS)
    idx.sync(list(docs.items()))
    old = idx.chunks("maintenance")
    assert len(old) >= 2
    docs["maintenance"] = docs["maintenance"].replace("QX-7731", "ZR-5150")
    before = embedder.texts_embedded
    stats = idx.sync(list(docs.items()))
    changed = [c for c in idx.chunks("maintenance") if c not in old]
    assert stats.docs_updated == 1 and stats.docs_unchanged == len(docs) - 1
    assert 0 < stats.chunks_embedded == len(changed) == embedder.texts_embedded - before
    assert stats.chunks_reused == len(idx.chunks("maintenance")) - len(changed) > 0
    assert not any("QX-7731" in c.text for c in idx.chunks())
    assert all("bm25" not in r.retrievers for r in idx.search("QX-7731", k=3))
    assert "ZR-5150" in idx.search("ZR-5150", k=1)[0].chunk.text
    # A removed document takes its chunks with it; an added copy of a known text embeds nothing.
    docs.pop("violin")
    docs["violin-copy"] = dict(CORPUS)["violin"]
    stats = idx.sync(list(docs.items()))
    assert (stats.docs_removed, stats.docs_added, stats.chunks_embedded) == (1, 1, 0)
    assert idx.chunks("violin") == [] and idx.chunks("violin-copy")


def test_searches_run_while_another_thread_syncs(embedder: Embedder) -> None:
    idx = CodexIndex(None, embedder=embedder)
    idx.sync(CORPUS[:4])
    with ThreadPoolExecutor(3) as pool:
        syncing = pool.submit(idx.sync, CORPUS)
        found = list(pool.map(lambda q: idx.search(q, k=2)[0].chunk.doc_id,
                              ["honeybee dance", "liquid oxygen", "sourdough starter"] * 3))
        assert syncing.result().docs_added == len(CORPUS) - 4
    assert found == ["bees", "rockets", "sourdough"] * 3
    assert idx.search("horsehair rosin bow", k=1)[0].chunk.doc_id == "violin"


def test_persistent_file_reopens_with_its_indexes(tmp_path: Path, embedder: Embedder) -> None:
    path = tmp_path / "rag.duckdb"
    with CodexIndex(path, embedder=embedder) as idx:
        idx.sync(CORPUS)
        chunks = idx.chunks()
        semantic = [r.to_dict() for r in idx.search("rules for moving chess pieces", k=3)]
    assert path.is_file()
    before = embedder.texts_embedded
    with CodexIndex(path, embedder=embedder) as idx:
        assert idx.chunks() == chunks
        assert idx.vector_plan_uses_hnsw()
        assert [r.to_dict() for r in idx.search("rules for moving chess pieces", k=3)] == semantic
        assert idx.search("QX-7731", k=1)[0].bm25_rank == 1  # the BM25 index persisted too
        assert idx.sync(CORPUS).chunks_embedded == 0
    assert embedder.texts_embedded == before + 2  # the two queries only


# --- limits -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("limits, name, value", [
    (RagLimits(max_documents=3), "max_documents", "3"),
    (RagLimits(max_document_chars=300), "max_document_chars", "300"),
    (RagLimits(max_total_chars=1_000), "max_total_chars", "1,000"),
])
def test_limits_raise_codex_too_large_naming_the_limit(embedder: Embedder, limits: RagLimits, name: str,
                                                       value: str) -> None:
    idx = CodexIndex(None, embedder=embedder, limits=limits)
    with pytest.raises(CodexTooLarge) as err:
        idx.sync(CORPUS)
    assert isinstance(err.value, ValueError) and err.value.limit == name
    assert f"{name}={value}" in str(err.value)
    assert idx.chunk_count() == 0


def test_sync_rejects_duplicate_ids(index: CodexIndex) -> None:
    with pytest.raises(ValueError, match="duplicate"):
        index.sync([("a", "x"), ("a", "y")])


# --- the query_archive tool and the orchestrator adapter -------------------------------------------

def test_query_archive_tool_schema() -> None:
    fn = QUERY_ARCHIVE_TOOL["function"]
    assert QUERY_ARCHIVE_TOOL["type"] == "function" and fn["name"] == "query_archive"
    params = fn["parameters"]
    assert params["required"] == ["query"] and params["properties"]["query"]["type"] == "string"
    assert (params["properties"]["k"]["minimum"], params["properties"]["k"]["maximum"]) == (1, 10)
    json.dumps(QUERY_ARCHIVE_TOOL)


def test_query_archive_runs_and_validates(index: CodexIndex) -> None:
    out = query_archive(index, {"query": "How does a bow make a string sound?", "k": 2})
    assert len(out["results"]) == 2 and out["results"][0]["doc_id"] == "violin"
    assert json.loads(json.dumps(out)) == out
    assert query_archive(index, '{"query": "QX-7731"}')["results"][0]["doc_id"] == "maintenance"
    assert len(query_archive(index, {"query": "bees"})["results"]) == 4  # k defaults to 4
    bad = [{}, {"query": ""}, {"query": "  "}, {"query": 5}, {"query": "x", "k": 0},
           {"query": "x", "k": 11}, {"query": "x", "k": "3"}, {"query": "x", "k": True},
           {"query": "x", "k": 2.5}, {"query": "x", "extra": 1}, {"query": "x" * 2001}, "{not json", "[]"]
    for arguments in bad:
        out = query_archive(index, arguments)
        assert set(out) == {"error"} and out["error"]["type"] == "invalid_arguments", arguments
        assert out["error"]["message"]


@dataclass
class Doc:
    id: str
    text: str


def test_codex_retriever_syncs_and_returns_excerpts(embedder: Embedder) -> None:
    retriever = CodexRetriever(ScopedIndexes(None, embedder))
    docs = [Doc(d, t) for d, t in CORPUS]
    excerpts = asyncio.run(retriever.retrieve(docs, "shield volcanoes in Hawaii", 2))
    assert len(excerpts) == 2 and excerpts[0].doc_id == "volcano"
    assert "Hawaii" in excerpts[0].text
    assert retriever.tool() is QUERY_ARCHIVE_TOOL
    assert asyncio.run(retriever.run_tool({"query": "bishop", "k": 1}))["results"][0]["doc_id"] == "chess"
    with pytest.raises(CodexTooLarge):
        asyncio.run(CodexRetriever(ScopedIndexes(None, embedder, limits=RagLimits(max_documents=1)))
                    .retrieve(docs, "x", 1))


def test_sessions_with_different_codexes_keep_their_own_index(embedder: Embedder, tmp_path: Path) -> None:
    indexes = ScopedIndexes(tmp_path / "rag", embedder, max_open=1)
    retriever = CodexRetriever(indexes)
    science = [Doc(d, t) for d, t in CORPUS if d in ("bees", "volcano", "tides")]
    games = [Doc(d, t) for d, t in CORPUS if d in ("chess", "violin")]
    asyncio.run(retriever.retrieve(science, "x", 1, "s-science"))
    asyncio.run(retriever.retrieve(games, "x", 1, "s-games"))
    embedded = embedder.texts_embedded
    for _ in range(2):  # alternating sessions re-embed nothing, even with one index open at a time
        assert asyncio.run(retriever.retrieve(science, "lava", 1, "s-science"))[0].doc_id == "volcano"
        assert asyncio.run(retriever.retrieve(games, "bishop", 1, "s-games"))[0].doc_id == "chess"
    assert embedder.texts_embedded == embedded + 4  # the four queries, no chunk
    assert len(indexes.open_scopes()) == 1 and len(list((tmp_path / "rag").glob("*.duckdb"))) == 2
    # query_archive searches the session's own Codex; without a session, the last RAG request's.
    found = asyncio.run(retriever.run_tool({"query": "hive", "k": 5}, "s-games"))["results"]
    assert {r["doc_id"] for r in found} <= {"chess", "violin"}
    assert asyncio.run(retriever.run_tool({"query": "hive", "k": 1}, "s-science"))["results"][0]["doc_id"] == "bees"
    assert asyncio.run(retriever.run_tool({"query": "bishop", "k": 1}))["results"][0]["doc_id"] == "chess"
    unknown = asyncio.run(retriever.run_tool({"query": "hive"}, "s-never"))
    assert "s-never" in unknown["error"]["message"] and not (tmp_path / "rag" / "s-never").exists()
    assert len(list((tmp_path / "rag").glob("*.duckdb"))) == 2
    indexes.close()


def _files(root: Path) -> set[str]:
    return {p.name for p in root.glob("*.duckdb")}


def test_index_files_past_the_cap_go_least_recently_used_first(embedder: Embedder, tmp_path: Path) -> None:
    import os
    import time

    root = tmp_path / "rag"
    earlier = ScopedIndexes(root, embedder)  # a previous run's files: ranked by their modification time
    for scope in ("old-a", "old-b"):
        with earlier.using(scope):
            pass
    earlier.close()
    now = time.time()
    os.utime(earlier.path_of("old-a"), (now - 60, now - 60))
    os.utime(earlier.path_of("old-b"), (now - 30, now - 30))

    indexes = ScopedIndexes(root, embedder, max_open=1, max_files=3)
    name = {scope: indexes.path_of(scope).name for scope in ("old-a", "old-b", "s1", "s2", "s3", "s4")}
    with indexes.using("s1"):
        assert _files(root) == {name["old-a"], name["old-b"], name["s1"]}
        with indexes.using("s2"):  # one over: the oldest file goes
            assert _files(root) == {name["old-b"], name["s1"], name["s2"]}
    with indexes.using("old-b"):  # used again: now the most recent
        pass
    with indexes.using("s2"), indexes.using("s1"):  # s1 in use, s2 just used
        with indexes.using("s3"):  # old-b is the least recently used, and idle
            assert _files(root) == {name["s1"], name["s2"], name["s3"]}
        with indexes.using("s4"):  # s1, s2 in use: s3 goes though newer
            assert _files(root) == {name["s1"], name["s2"], name["s4"]}
    indexes.close()


def test_a_dropped_scope_loses_its_file_once_no_one_uses_it(embedder: Embedder, tmp_path: Path) -> None:
    indexes = ScopedIndexes(tmp_path / "rag", embedder)
    retriever = CodexRetriever(indexes)
    docs = [Doc(d, t) for d, t in CORPUS if d in ("chess", "violin")]
    asyncio.run(retriever.retrieve(docs, "bishop", 1, "gone"))
    asyncio.run(retriever.retrieve(docs, "bishop", 1, "kept"))
    path = indexes.path_of("gone")
    assert path.exists() and indexes.drop("gone")
    assert not path.exists() and not indexes.exists("gone") and "gone" not in indexes.open_scopes()
    assert indexes.exists("kept")
    with indexes.using("kept") as index:  # in use: deleted when its user is done
        assert not indexes.drop("kept") and index.chunk_count() > 0
    assert not indexes.exists("kept")
    with indexes.using("again"):
        assert not indexes.drop("again")
        with indexes.using("again"):  # used again after the drop: kept after all
            pass
    assert indexes.exists("again")
    # A dropped session that returns gets its index rebuilt from the Codex its request carries.
    assert asyncio.run(retriever.retrieve(docs, "bishop", 1, "gone"))[0].doc_id == "chess"
    indexes.close()
