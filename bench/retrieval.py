"""Measure the RAG path: chunking, embedding throughput, sync, and search latency.

    ahc bench retrieval [--json]          # ~500 chunks, 100 queries
    python -m bench.retrieval --chunks 2000 [--device cpu] [--db PATH] [--queries 200]

The corpus is synthetic (seeded sentences over a fixed vocabulary), sized to about --chunks chunks at
the default 200-token chunk size, so runs are comparable across machines. The reference is the
embedding model alone on the same chunks: a sync (chunk, embed, insert, index) is measured against it,
and a search's database half against the whole search.

`ahc bench retrieval` runs `LOADS` (bench/load.py): `BENCH_RETRIEVAL_LOAD="smoke"` or e.g.
`"chunks=20,queries=5"`: ~`chunks` chunks synced, `queries` searches timed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.load import DEFAULT, SMOKE, Loads
from bench.result import BenchResult
from orchestrator.retrieval.codex_index import CodexIndex, _fuse
from orchestrator.retrieval.embedder import Embedder

CHUNKS, QUERIES = 2000, 200
_WORDS = ("engine valve pressure rotor sensor bearing seal pump turbine filter controller manual "
          "schedule operator shift supervisor fault reset logbook coolant gasket flange torque "
          "calibration voltage relay breaker inverter battery cable conduit alarm threshold sample "
          "river harbour market village forest mountain winter summer lantern signal bridge "
          "chapter reader author letter archive library record ledger merchant voyage").split()


@dataclass(frozen=True)
class RetrievalLoad:
    """`ahc bench retrieval`'s corpus and searches. A quarter of the standalone run's corpus: embedding
    dominates and scales with the chunks, and 2,000 of them take minutes on a small CPU."""

    chunks: int = 500
    queries: int = 100


LOADS = Loads("retrieval", {DEFAULT: RetrievalLoad(), SMOKE: RetrievalLoad(chunks=20, queries=5)})


def corpus(chunks: int, seed: int = 0) -> list[tuple[str, str]]:
    """~`chunks` chunks: a paragraph is ~110 word pieces, so a 200-token chunk holds one paragraph
    plus the overlap, and a 20-paragraph document gives ~20 chunks."""
    rng = random.Random(seed)
    docs = []
    for d in range(max(1, chunks // 20)):
        paragraphs = []
        for p in range(20):
            sentences = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 18))).capitalize()
                         + f" (ref {d}-{p}-{s})." for s in range(5)]
            paragraphs.append(" ".join(sentences))
        docs.append((f"doc{d:05d}", "\n\n".join(paragraphs)))
    return docs


def measure(chunks: int = CHUNKS, queries: int = QUERIES, device: str = "cpu", threads: int | None = None,
            db: Path | None = None) -> dict[str, Any]:
    """Every figure of one run over a corpus of ~`chunks` chunks and `queries` searches."""
    docs = corpus(chunks)
    embedder = Embedder(device=device, threads=threads)
    started = time.perf_counter()
    embedder.embed(["warm-up"])
    load_s = time.perf_counter() - started

    db = db or Path(tempfile.mkdtemp()) / "rag.duckdb"
    index = CodexIndex(db, embedder=embedder, threads=threads)
    started = time.perf_counter()
    chunked = [c for doc_id, text in docs for c in index._chunk(doc_id, text)]
    chunk_s = time.perf_counter() - started
    before = embedder.texts_embedded
    stats = index.sync(docs)  # chunk + embed every chunk + insert + build the fts and HNSW indexes
    embedded = embedder.texts_embedded - before
    resync = index.sync(docs)
    # Pure model throughput on a sample, apart from the database work.
    sample = [c.text for c in chunked[:256]]
    started = time.perf_counter()
    embedder.embed(sample)
    embed_s = time.perf_counter() - started

    rng = random.Random(1)
    texts = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 8))) for _ in range(queries)]
    # search = query embedding + HNSW top-n + BM25 top-n + fusion; the embedding is also timed alone.
    search_ms, embed_ms, db_ms = [], [], []
    for q in texts:
        t0 = time.perf_counter()
        vector = embedder.embed([q])[0]
        t1 = time.perf_counter()
        index.search(q, k=4)
        t2 = time.perf_counter()
        with index._db:  # the database half alone: HNSW top-n, BM25 top-n, fusion
            _fuse(index._vector_top(vector, index.candidates), index._bm25_top(q, index.candidates))
        t3 = time.perf_counter()
        embed_ms.append((t1 - t0) * 1e3)
        search_ms.append((t2 - t1) * 1e3)
        db_ms.append((t3 - t2) * 1e3)
    figures = {
        "device": device, "documents": len(docs), "chunks": stats.chunks,
        "chars": sum(len(t) for _, t in docs), "model_load_s": round(load_s, 2),
        "chunking_s": round(chunk_s, 2), "sync_s": round(stats.seconds, 2), "sync_embedded": embedded,
        "sync_chunks_per_s": round(embedded / stats.seconds, 1),
        "embed_chunks_per_s": round(len(sample) / embed_s, 1),
        "resync_unchanged_s": round(resync.seconds, 3), "queries": len(texts),
        "search_p50_ms": round(statistics.median(search_ms), 2),
        "search_p95_ms": round(float(np.percentile(search_ms, 95)), 2),
        "query_embed_p50_ms": round(statistics.median(embed_ms), 2),
        "db_and_fusion_p50_ms": round(statistics.median(db_ms), 2),
        "db_and_fusion_p95_ms": round(float(np.percentile(db_ms, 95)), 2), "threads": threads,
        "hnsw_used": index.vector_plan_uses_hnsw(), "db_bytes": db.stat().st_size,
    }
    index.close()
    return figures


def run(load: RetrievalLoad) -> BenchResult:
    """`ahc bench retrieval`: the numeric figures, their ratios to the reference, the rest as notes."""
    with tempfile.TemporaryDirectory(prefix="ahc-bench-retrieval-") as work:
        measured = measure(load.chunks, load.queries, db=Path(work) / "rag.duckdb")
    notes = {key: str(measured.pop(key)) for key in ("device", "threads", "hnsw_used")}
    notes["sync"] = "chunk + embed every chunk + insert + build the fts and HNSW indexes"
    notes["embed"] = "the model alone on 256 of the same chunks (the reference)"
    ratios = {"sync_over_embed": round(measured["sync_chunks_per_s"] / measured["embed_chunks_per_s"], 3),
              "db_and_fusion_share_of_search": round(measured["db_and_fusion_p50_ms"]
                                                     / measured["search_p50_ms"], 3)}
    return BenchResult("retrieval", measured, ratios, notes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=CHUNKS)
    parser.add_argument("--queries", type=int, default=QUERIES)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch and DuckDB threads")
    parser.add_argument("--db", type=Path, default=None, help="database file (default: a temp file)")
    args = parser.parse_args()
    print(json.dumps(measure(args.chunks, args.queries, args.device, args.threads, args.db), indent=1))


if __name__ == "__main__":
    main()
