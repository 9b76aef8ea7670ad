"""What an ideal prefix cache could serve of a turn: the ceiling the benches measure hit ratios against."""

from __future__ import annotations


def reusable_tokens(prompt: int, prev_prompt: int, prev_completion: int, block_size: int) -> int:
    """The previous request's prompt and reply in whole KV blocks (the reply's last token is never
    written to the cache), at most the whole prompt."""
    return min(prompt, (prev_prompt + prev_completion - 1) // block_size * block_size)
