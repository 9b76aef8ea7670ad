"""The XDB writer's CPU per generated token under a server-shaped load: STREAMS concurrent replies of
REPLY tokens, each arriving as 32-token TokenBatches with top-10 activations, paced like an engine
(the streams' batches spread over each engine round), the replies' ends staggered so that a flush is
asked for every few batches (the server waits for one at every reply's end), and a lens hierarchy
whose thresholds make auto tags fire.

    .venv/bin/python -m bench.xdb_cpu [rounds]

CPU is the whole process's (time.process_time, every thread, DuckDB's included) from the first submit
to the last commit; the batches are built beforehand, so it counts the writer's work.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from xdb import XDB
from xdb.rows import TokenBatch
from xdb.schema import TOP_K

STREAMS, REPLY, CHUNK = 64, 256, 32
PARENTS, CHILDREN = 16, 15
STEP_S = 0.2  # an engine round: every stream's next CHUNK tokens (~10k tokens/s)
WORDS = np.array(["the", " cat", "ing", " sat", ".", " on", " mat", " A", " moves", " right"], dtype=object)


def hierarchy() -> list[dict[str, object]]:
    """PARENTS concepts without thresholds, each with CHILDREN that fire at 0.97."""
    out: list[dict[str, object]] = []
    for p in range(PARENTS):
        out.append({"id": f"p{p}", "name": f"Parent {p}", "parent": None, "threshold": None})
        out += [{"id": f"c{p}-{c}", "name": f"Child {p}.{c}", "parent": f"p{p}", "threshold": 0.97}
                for c in range(CHILDREN)]
    return out


def load(xdb: XDB, names: list[str], rounds: int) -> list[list[tuple[TokenBatch, bool]]]:
    """Per engine round, each stream's batch and whether it ends the stream's reply (staggered)."""
    rng = np.random.default_rng(0)
    per_reply = REPLY // CHUNK
    out: list[list[tuple[TokenBatch, bool]]] = []
    for r in range(rounds):
        step = []
        for s in range(STREAMS):
            session, reply = f"s{s}", (r + s) // per_reply
            index = np.argpartition(rng.random((CHUNK, len(names))), TOP_K, axis=1)[:, :TOP_K]
            batch = TokenBatch(
                session, xdb.next_ticks(session, CHUNK), WORDS[rng.integers(0, len(WORDS), CHUNK)].tolist(),
                rng.integers(0, 32000, CHUNK), request_id=f"{session}-r{reply}", concept_names=names,
                concept_index=index, concept_values=rng.random((CHUNK, TOP_K), dtype=np.float32),
                activation_source="hidden_state")
            step.append((batch, (r + s + 1) % per_reply == 0))
        out.append(step)
    return out


def run(rounds: int = 32) -> tuple[float, int, int, int]:
    """(CPU µs a token, tokens, batches committed, tag applications made)."""
    concepts = hierarchy()
    names = [str(c["id"]) for c in concepts]
    commits: list[int] = []
    with tempfile.TemporaryDirectory() as tmp, XDB.open(Path(tmp) / "x", on_commit=commits.append) as xdb:
        xdb.register_concepts(concepts)
        writer = xdb.writer
        assert writer is not None
        steps = load(xdb, names, rounds)
        start_cpu, start = time.process_time(), time.monotonic()
        for r, step in enumerate(steps):
            for s, (batch, ends) in enumerate(step):
                writer.submit(batch)
                if ends:
                    writer.request_flush()
                time.sleep(max(0.0, start + (r + (s + 1) / STREAMS) * STEP_S - time.monotonic()))
        writer.flush()
        cpu = time.process_time() - start_cpu
        tokens = writer.rows_written
        tags = xdb.conn.execute("SELECT count(*) FROM tag_applications").fetchone()
        return cpu / tokens * 1e6, tokens, len(commits), int(tags[0]) if tags else 0


if __name__ == "__main__":
    us, n, batches, tags = run(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
    print(f"{us:.2f} us CPU a token ({n} tokens in {batches} batches, {tags} tag applications)")
