"""The KV cache the agents bench gives its servers: too small for every session's context by the load's
multiple, never too small for one session's last turn."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from bench.agents.load import AgentLoad
from bench.agents.scripts import scripts, session_tokens_estimate
from bench.models import model_max_len
from server.emulation.profiles import profile

NULL_BLOCKS = 1  # vLLM keeps one block of the pool back for itself
SLACK_BLOCKS = 2  # the session-size estimate is from the tokenizer, not the rendered prompt


@dataclass(frozen=True)
class CacheSize:
    """The KV cache the servers get, and the window that still lets one session's turn fit in it."""

    blocks: int
    block_size: int
    max_model_len: int
    blocks_for_all: int = 0  # every session's last context at once: the cache that holds everything


def cache_size(sessions: int, session_tokens: int, block_size: int, cache_multiple: float,
               model_max_len: int) -> CacheSize:
    """Blocks so that `sessions` contexts of `session_tokens` are `cache_multiple` times the cache, but
    never fewer than one session's last turn needs (vLLM refuses a window the cache cannot hold)."""
    per_session = math.ceil(session_tokens / block_size)
    blocks = max(math.ceil(sessions * per_session / cache_multiple), per_session + NULL_BLOCKS + SLACK_BLOCKS)
    max_model_len = min(model_max_len, (blocks - NULL_BLOCKS) * block_size)
    if max_model_len < session_tokens:
        raise ValueError(f"a session of {session_tokens} tokens does not fit the model's {model_max_len}-token "
                         "window; shorten the load")
    return CacheSize(blocks, block_size, max_model_len, 2 * sessions * per_session + NULL_BLOCKS + SLACK_BLOCKS)


def sizing(model_dir: Path, load: AgentLoad, block_size: int) -> tuple[CacheSize, int]:
    """The cache for this load, and the estimated tokens of one session's last turn it is sized from."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    tokens = max(session_tokens_estimate(s, load.max_tokens, count) for s in scripts(load, 0))
    window = profile(load.emulate).model.max_position if load.emulate else model_max_len(model_dir)
    return cache_size(load.sessions, tokens, block_size, load.cache_multiple, window), tokens
