"""The VRAM governor's arithmetic for one request: prompt blocks once, completion blocks per choice."""

from __future__ import annotations

from server.admission.turn import choices, request_blocks
from server.admission.vram_governor import KVStats, VramGovernor


def governor() -> VramGovernor:
    return VramGovernor(KVStats(total_blocks=1000, block_size=16, usage=0.0), queue_timeout_s=0.05, retry_after_s=3)


def test_one_choice_counts_the_uncached_prompt_and_the_completion() -> None:
    # 100 prompt tokens, 32 cached, 20 new: ceil(88 / 16)
    assert request_blocks(governor(), {"max_tokens": 20}, 4096, 100, 32) == 6
    assert request_blocks(governor(), {"max_tokens": 20, "n": 1}, 4096, 100, 32) == 6


def test_n_choices_share_the_prompt_and_each_pays_its_completion() -> None:
    # 100 prompt tokens (6 full blocks + 4 tokens), 64-token completions: the first sequence needs
    # ceil((100 + 64) / 16) = 11 blocks; each other one its copy of the partial block plus its
    # completion, ceil((4 + 64) / 16) = 5
    assert request_blocks(governor(), {"max_tokens": 64, "n": 4}, 4096, 100, 0) == 11 + 3 * 5
    # with no budget asked, each choice may fill what the window leaves
    assert request_blocks(governor(), {"n": 2}, 356, 100, 0) == 23 + 17  # 256 new tokens each
    # a prompt that ends on a block boundary leaves nothing partial to copy
    assert request_blocks(governor(), {"max_tokens": 32, "n": 3}, 4096, 96, 96) == 2 + 2 * 2


def test_choices_reads_n_and_defaults_to_one() -> None:
    assert [choices(b) for b in ({}, {"n": None}, {"n": 1}, {"n": 5}, {"n": True}, {"n": 0})] == [1, 1, 1, 5, 1, 1]
