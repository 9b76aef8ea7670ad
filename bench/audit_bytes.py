"""Bytes on disk a generated token: the experience file and the audit log, written through XDB's real
writer (sealing, hashing, checkpoints and anchors included) into a temporary data dir. STREAMS sessions
each get 32-token TokenBatches with top-10 activations over a concept set (as bench/xdb_cpu.py, but
unpaced: only the bytes are measured), then XDB is closed (its files checkpointed) and every file's size
is summed.

    .venv/bin/python -m bench.audit_bytes [tokens] [--batch-rows N] [--keep DIR]

`--batch-rows`: the writer's batch size (XDBConfig.batch_rows; unpaced, every batch is full): a server's
batches are what a second of tokens brings (max_latency_s), ~1k rows at 100M tokens a day.

Prints bytes a token for the experience file, the audit files (each one, and together) and the audit's
share of the total.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from core.config import XDBConfig
from xdb import XDB
from xdb.rows import TokenBatch
from xdb.schema import TOP_K

STREAMS, CHUNK, CONCEPTS, REPLY = 64, 32, 256, 512
WORDS = np.array(["the", " cat", "ing", " sat", ".", " on", " mat", " A", " moves", " right"], dtype=object)


def write(data_dir: Path, tokens: int, batch_rows: int | None = None) -> float:
    """Write `tokens` generated tokens; returns the seconds it took."""
    rng = np.random.default_rng(0)
    names = [f"c{i}" for i in range(CONCEPTS)]
    started = time.monotonic()
    config = XDBConfig() if batch_rows is None else XDBConfig(batch_rows=batch_rows)
    with XDB.open(data_dir, config) as xdb:
        xdb.register_concepts([{"id": n, "name": n, "parent": None, "threshold": None} for n in names])
        writer = xdb.writer
        assert writer is not None
        written, r = 0, 0
        while written < tokens:
            for s in range(STREAMS):
                n = min(CHUNK, tokens - written)
                if n <= 0:
                    break
                session = f"session-{s:04d}-{'x' * 24}"  # a server's session ids are ~36 characters
                index = np.argpartition(rng.random((n, CONCEPTS)), TOP_K, axis=1)[:, :TOP_K]
                writer.submit(TokenBatch(
                    session, xdb.next_ticks(session, n), WORDS[rng.integers(0, len(WORDS), n)].tolist(),
                    rng.integers(0, 32000, n), request_id=f"{session}-r{(r * CHUNK) // REPLY}",
                    concept_names=names, concept_index=index,
                    concept_values=rng.random((n, TOP_K), dtype=np.float32), activation_source="hidden_state"))
                written += n
            r += 1
        writer.flush()
    return time.monotonic() - started


def sizes(data_dir: Path) -> dict[str, int]:
    return {str(f.relative_to(data_dir)): f.stat().st_size for f in sorted(data_dir.rglob("*")) if f.is_file()}


def report(data_dir: Path, tokens: int, seconds: float) -> None:
    files = sizes(data_dir)
    audit = {k: v for k, v in files.items() if k.startswith("audit/")}
    experience = sum(v for k, v in files.items() if k.startswith("experience.duckdb"))
    audit_total = sum(audit.values())
    total = experience + audit_total
    print(f"{tokens} tokens written in {seconds:.1f} s")
    print(f"experience: {experience / tokens:7.1f} bytes a token ({experience / 1e6:.1f} MB)")
    for name, size in audit.items():
        print(f"  {name}: {size / tokens:7.1f} bytes a token ({size / 1e6:.1f} MB)")
    print(f"audit:      {audit_total / tokens:7.1f} bytes a token ({audit_total / 1e6:.1f} MB)")
    share = 100 * audit_total / max(total, 1)
    print(f"total:      {total / tokens:7.1f} bytes a token; the audit's share {share:.0f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokens", nargs="?", type=int, default=2_000_000)
    parser.add_argument("--batch-rows", type=int, help="the writer's batch size (default: XDBConfig's)")
    parser.add_argument("--keep", type=Path, help="write into this (new) data dir and keep it")
    args = parser.parse_args()
    if args.keep is not None:
        seconds = write(args.keep, args.tokens, args.batch_rows)
        report(args.keep, args.tokens, seconds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        seconds = write(Path(tmp) / "x", args.tokens, args.batch_rows)
        report(Path(tmp) / "x", args.tokens, seconds)


if __name__ == "__main__":
    main()
