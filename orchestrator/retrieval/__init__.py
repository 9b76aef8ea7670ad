"""RAG over the Codex: deterministic chunking, all-MiniLM-L6-v2 embeddings, and hybrid (HNSW + BM25)
search in DuckDB, plus the `query_archive` tool: what a Codex too large for the prompt (RAG mode) is
searched with."""

from orchestrator.retrieval.chunking import Chunk, approx_token_count, chunk_document
from orchestrator.retrieval.codex_index import CodexIndex, IndexStats, RetrievedChunk
from orchestrator.retrieval.embedder import DIMENSION, Embedder
from orchestrator.retrieval.limits import CodexTooLarge, RagLimits
from orchestrator.retrieval.retriever import CodexRetriever
from orchestrator.retrieval.scoped_indexes import ScopedIndexes
from orchestrator.retrieval.tool import QUERY_ARCHIVE_TOOL, query_archive

__all__ = [
    "DIMENSION", "QUERY_ARCHIVE_TOOL", "Chunk", "CodexIndex", "CodexRetriever", "CodexTooLarge",
    "Embedder", "IndexStats", "RagLimits", "RetrievedChunk", "ScopedIndexes", "approx_token_count", "chunk_document",
    "query_archive",
]
