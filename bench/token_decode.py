"""The XDB service's cost of decoding generated tokens' texts (xdb/token_decoder.py): µs a token for a
256-token reply in the recorder's 32-token batches, each decoded alone after its context ids, with the
tokenizer of the model `ahc model pull smollm2-135m` sets up (or the directory given).

    python -m bench.token_decode [MODEL_DIR]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.servers import REAL_MODEL
from xdb.rows import DECODE_CONTEXT
from xdb.token_decoder import TokenDecoder

REPLY_TOKENS = 256
BATCH = 32  # TokenStream.CHUNK
TEXT = "The agent reads the file, then 你好世界 — naïve café 😀; it writes the patch and runs the tests. "


def us_per_token(model: Path, rounds: int = 200) -> float:
    decoder = TokenDecoder.from_str((model / "tokenizer.json").read_text())
    ids = decoder.tokenizer.encode(TEXT * 64, add_special_tokens=False).ids[:REPLY_TOKENS]
    batches = [(ids[start:start + BATCH], ids[max(start - DECODE_CONTEXT, 0):start])
               for start in range(0, len(ids), BATCH)]
    started = time.perf_counter()
    for _ in range(rounds):
        for batch, context in batches:
            decoder.texts(batch, context)
    return (time.perf_counter() - started) / rounds / len(ids) * 1e6


def main() -> None:
    model = Path(sys.argv[1]) if len(sys.argv) > 1 else REAL_MODEL
    print(f"decoding in XDB: {us_per_token(model):.2f} µs/token ({model.name}, {REPLY_TOKENS}-token reply, "
          f"{BATCH}-token batches with {DECODE_CONTEXT} context ids)")


if __name__ == "__main__":
    main()
