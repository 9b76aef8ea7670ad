"""The Codex as a hybrid search index in DuckDB: HNSW (vss, cosine) over chunk embeddings plus BM25
(fts) over chunk text, fused by reciprocal rank fusion.

`sync` makes the index hold exactly the given documents. It is incremental: an unchanged document costs
one hash, and a changed one re-embeds only chunks whose text (sha256) is not in the index already.
Every result order is total — ties fall to (doc_id, chunk_index) — so a query gives byte-identical
results for as long as the index holds the same documents.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from orchestrator.retrieval.chunking import Chunk, chunk_document
from orchestrator.retrieval.duckdb_ext import load_extensions
from orchestrator.retrieval.embedder import DIMENSION, Embedder
from orchestrator.retrieval.limits import RagLimits
from orchestrator.retrieval.sql import one_int

# Bump when chunk_document's output changes for the same input: stored documents then re-chunk.
CHUNKER_VERSION = 2
RRF_K = 60  # the constant from Cormack et al.; damps the weight of top ranks

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS documents (doc_id VARCHAR, sha256 VARCHAR, chars BIGINT, chunking VARCHAR);
CREATE TABLE IF NOT EXISTS chunks (
    id BIGINT, doc_id VARCHAR, chunk_index INTEGER, text VARCHAR,
    start_char BIGINT, end_char BIGINT, sha256 VARCHAR, embedding FLOAT[{DIMENSION}]);
CREATE INDEX IF NOT EXISTS chunks_hnsw ON chunks USING HNSW (embedding) WITH (metric = 'cosine');
"""
# BM25 tokens keep digits (the default pattern drops them, and "zebra7" or "E-1042" are exactly the
# rare keywords vectors miss); Porter stemming and English stopwords as usual.
_FTS = ("PRAGMA create_fts_index('chunks', 'id', 'text', stemmer = 'porter', stopwords = 'english', "
        "ignore = '(\\.|[^a-z0-9])+', strip_accents = 1, lower = 1, overwrite = 1)")
_CHUNK_COLUMNS = "doc_id, chunk_index, text, start_char, end_char, sha256"
_CHUNK_COLUMNS_C = ", ".join(f"c.{name}" for name in _CHUNK_COLUMNS.split(", "))
# BM25 top-n straight from the fts tables: the same formula as fts's match_bm25 (k1 = 1.2, b = 0.75),
# but scored once for the query and joined to chunks for the top n only, where the macro is evaluated
# for every row (~10x slower at 2k chunks). Scores are rounded before ordering so a parallel sum's
# last bits cannot swap two equal chunks; ties then fall to (doc_id, chunk_index).
_BM25_SQL = f"""
WITH tokens AS (SELECT DISTINCT stem(unnest(fts_main_chunks.tokenize(?)), 'porter') AS term),
tf AS (
    SELECT t.docid, t.termid, count(*) AS tf
    FROM fts_main_chunks.terms AS t JOIN fts_main_chunks.dict AS d USING (termid)
    JOIN tokens ON d.term = tokens.term
    GROUP BY t.docid, t.termid),
scores AS (
    SELECT tf.docid, round(sum(
        ln((st.num_docs - d.df + 0.5) / (d.df + 0.5) + 1)
        * (tf.tf * 2.2) / (tf.tf + 1.2 * (0.25 + 0.75 * docs.len / st.avgdl))), 9) AS score
    FROM tf JOIN fts_main_chunks.dict AS d USING (termid)
    JOIN fts_main_chunks.docs AS docs USING (docid), fts_main_chunks.stats AS st
    GROUP BY tf.docid)
SELECT {_CHUNK_COLUMNS_C}
FROM scores JOIN fts_main_chunks.docs AS docs USING (docid) JOIN chunks AS c ON c.id = docs.name
ORDER BY scores.score DESC, c.doc_id, c.chunk_index
LIMIT {{limit}}
"""


@dataclass(frozen=True)
class IndexStats:
    documents: int
    chunks: int
    docs_added: int
    docs_updated: int
    docs_removed: int
    docs_unchanged: int
    chunks_embedded: int  # texts sent to the model by this sync
    chunks_reused: int  # new chunks whose embedding was already in the index
    seconds: float


@dataclass(frozen=True)
class RetrievedChunk:
    chunk: Chunk
    score: float  # reciprocal rank fusion: sum of 1 / (RRF_K + rank) over the retrievers
    retrievers: tuple[str, ...]  # which found it, of ("bm25", "vector"), sorted
    vector_rank: int | None  # 1-based; None when outside the vector top-n
    bm25_rank: int | None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self.chunk)
        out.update(score=self.score, retrievers=list(self.retrievers), vector_rank=self.vector_rank,
                   bm25_rank=self.bm25_rank)
        return out


class CodexIndex:
    """One DuckDB database (a file, or in memory when `db_path` is None) and one connection.

    `_db` guards the connection (DuckDB connections are not thread-safe); `_sync` serialises syncs so
    two cannot diff against the same state, while searches go on during a sync's embedding."""

    def __init__(self, db_path: Path | str | None = None, *, embedder: Embedder | None = None,
                 limits: RagLimits = RagLimits(), max_tokens: int = 200, overlap: int = 40,
                 candidates: int = 20, threads: int | None = None) -> None:
        self.db_path = Path(db_path) if db_path is not None else None
        self.embedder = embedder or Embedder()
        self.limits = limits
        self.max_tokens, self.overlap, self.candidates = max_tokens, overlap, candidates
        self._chunking = json.dumps({"chunker": CHUNKER_VERSION, "max_tokens": max_tokens,
                                     "overlap": overlap, "model": self.embedder.name}, sort_keys=True)
        self._db = threading.Lock()
        self._sync = threading.Lock()
        if self.db_path is not None:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(str(self.db_path) if self.db_path else ":memory:")
        load_extensions(self._con)
        if threads is not None:
            # Searches are small queries: on a small, busy CPU one DuckDB thread is steadier (measured
            # at 2k chunks on 2 loaded cores: BM25 p50 16 ms with 1 thread, 25 ms with 2).
            self._con.execute(f"SET threads = {int(threads)}")
        # HNSW in a database file is "experimental" because its WAL replay is fragile; every sync
        # ends in a CHECKPOINT so the WAL never holds index changes across a restart.
        self._con.execute("SET hnsw_enable_experimental_persistence = true")
        self._con.execute(_SCHEMA)
        self._check_model()
        if not self._has_fts():
            self._con.execute(_FTS)  # so a search before the first sync finds nothing, not an error

    # --- public API -------------------------------------------------------------------------------

    def sync(self, docs: Sequence[tuple[str, str]]) -> IndexStats:
        """Make the index hold exactly `docs` ([(doc_id, text)]); idempotent, and a repeat of the same
        docs writes nothing. Raises CodexTooLarge over the limits, ValueError for bad or duplicate ids."""
        started = time.perf_counter()
        docs = list(docs)
        _validate(docs)
        self.limits.check(docs)
        with self._sync:
            wanted = {doc_id: _sha256(text) for doc_id, text in docs}
            stored = self._stored_documents()
            changed = [(d, t) for d, t in docs if stored.get(d) != (wanted[d], self._chunking)]
            removed = sorted(set(stored) - set(wanted))
            chunks = [c for doc_id, text in changed for c in self._chunk(doc_id, text)]
            vectors, embedded, reused = self._vectors_for(chunks)
            self._replace(sorted({d for d, _ in changed} | set(removed)), chunks, vectors,
                          [(d, wanted[d], len(t)) for d, t in changed])
            added = sum(1 for d, _ in changed if d not in stored)
            return IndexStats(len(docs), self.chunk_count(), added, len(changed) - added, len(removed),
                              len(docs) - len(changed), embedded, reused, time.perf_counter() - started)

    def search(self, query: str, k: int = 4) -> list[RetrievedChunk]:
        """The k best chunks for `query`: vector top-n and BM25 top-n (n = max(candidates, k)) fused."""
        if not query.strip():
            raise ValueError("query must be a non-empty string")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        n = max(self.candidates, k)
        vector = self.embedder.embed([query])[0]  # outside the lock: the model is the slow part
        with self._db:
            by_vector = self._vector_top(vector, n)
            by_bm25 = self._bm25_top(query, n)
        return _fuse(by_vector, by_bm25)[:k]

    def chunk_count(self) -> int:
        with self._db:
            return one_int(self._con.execute("SELECT count(*) FROM chunks"))

    def chunks(self, doc_id: str | None = None) -> list[Chunk]:
        """The stored chunks, in (doc_id, chunk_index) order."""
        where, params = ("WHERE doc_id = ?", [doc_id]) if doc_id is not None else ("", [])
        with self._db:
            rows = self._con.execute(f"SELECT {_CHUNK_COLUMNS} FROM chunks {where} "
                                     "ORDER BY doc_id, chunk_index", params).fetchall()
        return [Chunk(*row) for row in rows]

    def vector_plan_uses_hnsw(self) -> bool:
        """Whether DuckDB answers the vector query from the HNSW index (not a full scan)."""
        with self._db:
            plan = self._con.execute(f"EXPLAIN {self._vector_sql(self.candidates)}",
                                     [[0.0] * DIMENSION]).fetchall()
        return any("HNSW_INDEX_SCAN" in row[1] for row in plan)

    def close(self) -> None:
        with self._db:
            if self.db_path is not None:
                self._con.execute("CHECKPOINT")
            self._con.close()

    def __enter__(self) -> CodexIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sync steps -------------------------------------------------------------------------------

    def _check_model(self) -> None:
        """Embeddings of another model are not comparable: drop them all if the model changed."""
        with self._db:
            row = self._con.execute("SELECT value FROM meta WHERE key = 'model'").fetchone()
            if row is not None and row[0] != self.embedder.name:
                self._con.execute("DELETE FROM chunks; DELETE FROM documents;")
            self._con.execute("INSERT OR REPLACE INTO meta VALUES ('model', ?)", [self.embedder.name])

    def _has_fts(self) -> bool:
        return one_int(self._con.execute("SELECT count(*) FROM duckdb_schemas() "
                                         "WHERE schema_name = 'fts_main_chunks'")) > 0

    def _stored_documents(self) -> dict[str, tuple[str, str]]:
        with self._db:
            rows = self._con.execute("SELECT doc_id, sha256, chunking FROM documents").fetchall()
        return {doc_id: (sha, chunking) for doc_id, sha, chunking in rows}

    def _chunk(self, doc_id: str, text: str) -> list[Chunk]:
        return chunk_document(doc_id, text, self.max_tokens, self.overlap, self.embedder.count_tokens)

    def _vectors_for(self, chunks: list[Chunk]) -> tuple[np.ndarray, int, int]:
        """Embeddings for `chunks`: reused from the index by sha256 where present (an edited document
        keeps most of its chunks), the rest embedded once per distinct text."""
        shas = sorted({c.sha256 for c in chunks})
        known = self._stored_vectors(shas)
        missing = [sha for sha in shas if sha not in known]
        text_of = {c.sha256: c.text for c in chunks}
        fresh = self.embedder.embed([text_of[sha] for sha in missing])
        known.update(zip(missing, fresh))
        vectors = np.stack([known[c.sha256] for c in chunks]) if chunks else np.zeros((0, DIMENSION))
        fresh_shas = set(missing)
        reused = sum(1 for c in chunks if c.sha256 not in fresh_shas)
        return vectors.astype(np.float32), len(missing), reused

    def _stored_vectors(self, shas: list[str]) -> dict[str, np.ndarray]:
        if not shas:
            return {}
        wanted = pa.table({"sha256": shas})
        with self._db:
            self._con.register("wanted_shas", wanted)
            try:
                result = self._con.execute(
                    "SELECT sha256, any_value(embedding) AS embedding FROM chunks "
                    "WHERE sha256 IN (SELECT sha256 FROM wanted_shas) GROUP BY sha256").arrow()
                # DuckDB 1.5 streams a RecordBatchReader: drain it while the view is still registered.
                table = result.read_all() if isinstance(result, pa.RecordBatchReader) else result
            finally:
                self._con.unregister("wanted_shas")
        flat = table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        rows = flat.reshape(-1, DIMENSION).astype(np.float32)
        return dict(zip(table.column("sha256").to_pylist(), rows))

    def _replace(self, drop_docs: list[str], chunks: list[Chunk], vectors: np.ndarray,
                 doc_rows: list[tuple[str, str, int]]) -> None:
        """Delete the chunks of changed/removed documents and insert the new ones in one transaction,
        then rebuild the BM25 index (fts indexes do not follow inserts) and compact the HNSW graph."""
        if not drop_docs:
            return
        with self._db:
            con = self._con
            con.execute("BEGIN")
            try:
                con.register("dropped", pa.table({"doc_id": drop_docs}))
                deleted = one_int(con.execute(
                    "DELETE FROM chunks WHERE doc_id IN (SELECT doc_id FROM dropped)"))
                con.execute("DELETE FROM documents WHERE doc_id IN (SELECT doc_id FROM dropped)")
                next_id = one_int(con.execute("SELECT coalesce(max(id), 0) + 1 FROM chunks"))
                con.register("new_chunks", _chunk_table(chunks, vectors, next_id))
                con.execute("INSERT INTO chunks SELECT * FROM new_chunks")
                con.executemany("INSERT INTO documents VALUES (?, ?, ?, ?)",
                                [(d, sha, chars, self._chunking) for d, sha, chars in doc_rows])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            finally:
                con.unregister("dropped")
                con.unregister("new_chunks")
            con.execute(_FTS)
            if deleted:
                con.execute("PRAGMA hnsw_compact_index('chunks_hnsw')")  # deletes are only marked
            if self.db_path is not None:
                con.execute("CHECKPOINT")

    # --- search steps -----------------------------------------------------------------------------

    @staticmethod
    def _vector_sql(limit: int) -> str:
        # ORDER BY the distance alone with a constant LIMIT: the shape vss rewrites to an HNSW scan.
        # The vector comes as a VARCHAR parameter cast in SQL: binding a 384-element Python list
        # costs ~50 ms, the string ~1 ms, and repr() round-trips float32 exactly.
        return (f"SELECT {_CHUNK_COLUMNS}, array_cosine_distance(embedding, "
                f"?::VARCHAR::FLOAT[{DIMENSION}]) AS distance FROM chunks ORDER BY distance "
                f"LIMIT {int(limit)}")

    def _vector_top(self, vector: np.ndarray, n: int) -> list[Chunk]:
        # Fetch twice n, then order by (distance, doc_id, chunk_index) in Python: equal distances
        # (the same text in two documents) are then cut at n in a fixed order.
        literal = "[" + ",".join(map(repr, vector.tolist())) + "]"
        rows = self._con.execute(self._vector_sql(2 * n), [literal]).fetchall()
        rows.sort(key=lambda r: (r[-1], r[0], r[1]))
        return [Chunk(*row[:-1]) for row in rows[:n]]

    def _bm25_top(self, query: str, n: int) -> list[Chunk]:
        rows = self._con.execute(_BM25_SQL.format(limit=int(n)), [query]).fetchall()
        return [Chunk(*row) for row in rows]


def _fuse(by_vector: list[Chunk], by_bm25: list[Chunk]) -> list[RetrievedChunk]:
    """Reciprocal rank fusion; ties by (doc_id, chunk_index)."""
    ranks: dict[tuple[str, int], dict[str, int]] = {}
    chunk_of: dict[tuple[str, int], Chunk] = {}
    for name, ranked in (("bm25", by_bm25), ("vector", by_vector)):
        for rank, chunk in enumerate(ranked, start=1):
            key = (chunk.doc_id, chunk.chunk_index)
            ranks.setdefault(key, {})[name] = rank
            chunk_of[key] = chunk
    fused = []
    for key, found in ranks.items():
        # Sum in a fixed retriever order so the float is the same bit for bit every time.
        score = sum(1.0 / (RRF_K + found[name]) for name in sorted(found))
        fused.append(RetrievedChunk(chunk_of[key], score, tuple(sorted(found)), found.get("vector"),
                                    found.get("bm25")))
    fused.sort(key=lambda r: (-r.score, r.chunk.doc_id, r.chunk.chunk_index))
    return fused


def _chunk_table(chunks: list[Chunk], vectors: np.ndarray, first_id: int) -> pa.Table:
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel(), type=pa.float32())
    return pa.table({
        "id": pa.array(range(first_id, first_id + len(chunks)), type=pa.int64()),
        "doc_id": [c.doc_id for c in chunks],
        "chunk_index": pa.array([c.chunk_index for c in chunks], type=pa.int32()),
        "text": [c.text for c in chunks],
        "start_char": pa.array([c.start_char for c in chunks], type=pa.int64()),
        "end_char": pa.array([c.end_char for c in chunks], type=pa.int64()),
        "sha256": [c.sha256 for c in chunks],
        "embedding": pa.FixedSizeListArray.from_arrays(flat, DIMENSION),
    })


def _validate(docs: Sequence[tuple[str, str]]) -> None:
    seen: set[str] = set()
    for doc_id, text in docs:
        if not isinstance(doc_id, str) or not doc_id:
            raise ValueError(f"doc_id must be a non-empty string, got {doc_id!r}")
        if not isinstance(text, str):
            raise ValueError(f"text of {doc_id!r} must be a string")
        if doc_id in seen:
            raise ValueError(f"duplicate doc_id {doc_id!r}")
        seen.add(doc_id)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
