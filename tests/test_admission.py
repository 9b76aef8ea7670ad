"""The VRAM governor's arithmetic for one request: prompt blocks once, completion blocks per choice."""

from __future__ import annotations

from server.admission.turn_admission import Asked, request_blocks
from server.admission.vram_governor import KVStats, VramGovernor


def governor() -> VramGovernor:
    return VramGovernor(KVStats(total_blocks=1000, block_size=16, usage=0.0), queue_timeout_s=0.05, retry_after_s=3)


def test_one_choice_counts_the_uncached_prompt_and_the_completion() -> None:
    # 100 prompt tokens, 32 cached, 20 new: ceil(88 / 16)
    assert request_blocks(governor(), Asked.of(20, None), 4096, 100, 32) == 6
    assert request_blocks(governor(), Asked.of(20, 1), 4096, 100, 32) == 6


def test_n_choices_share_the_prompt_and_each_pays_its_completion() -> None:
    # 100 prompt tokens (6 full blocks + 4 tokens), 64-token completions: the first sequence needs
    # ceil((100 + 64) / 16) = 11 blocks; each other one its copy of the partial block plus its
    # completion, ceil((4 + 64) / 16) = 5
    assert request_blocks(governor(), Asked.of(64, 4), 4096, 100, 0) == 11 + 3 * 5
    # with no budget asked, each choice may fill what the window leaves
    assert request_blocks(governor(), Asked.of(None, 2), 356, 100, 0) == 23 + 17  # 256 new tokens each
    # a prompt that ends on a block boundary leaves nothing partial to copy
    assert request_blocks(governor(), Asked.of(32, 3), 4096, 96, 96) == 2 + 2 * 2


def test_asked_reads_n_and_defaults_to_one() -> None:
    assert [Asked.of(None, n).choices for n in (None, 1, 5, 0, -2)] == [1, 1, 5, 1, 1]


def test_asked_reads_a_budget_under_one_as_none() -> None:
    assert [Asked.of(tokens, None).completion_tokens for tokens in (None, 0, -1, 7)] == [None, None, None, 7]


def test_a_chat_request_asks_max_completion_tokens_before_max_tokens() -> None:
    from starlette.datastructures import Headers

    from server.chat.protocol import ChatCall, ChatRequest
    from server.tenancy.tenants import LOCAL

    def asked(**fields: object) -> Asked:
        body = {"messages": [{"role": "user", "content": "hi"}], **fields}
        return ChatCall.read(ChatRequest.model_validate(body), body, Headers(), LOCAL).asked

    assert asked() == Asked(None, 1)
    assert asked(max_tokens=30, n=2) == Asked(30, 2)
    assert asked(max_tokens=30, max_completion_tokens=12) == Asked(12, 1)
    assert asked(max_tokens=30, max_completion_tokens=0) == Asked(30, 1)



def test_waiting_requests_get_blocks_in_priority_order() -> None:
    """Short of blocks, the governor gives freed ones to the waiters of the lowest priority (the oldest
    sessions) first, whatever order they came in: a younger waiter does not take what an older one waits
    for, even when it would fit."""
    import asyncio

    async def scenario() -> None:
        governor = VramGovernor(KVStats(total_blocks=100, block_size=16), queue_timeout_s=5, retry_after_s=1,
                                poll_s=0.001)
        first, second = await governor.admit(60), await governor.admit(30)  # 10 blocks left
        admitted: list[str] = []

        async def ask(name: str, blocks: int, priority: int) -> None:
            await governor.admit(blocks, priority=priority)
            admitted.append(name)

        waiters = [asyncio.create_task(ask(*args)) for args in (("young", 20, 9), ("old", 20, 1), ("mid", 15, 5))]
        await asyncio.sleep(0.02)
        assert admitted == []
        second.release()  # 40 free: old's 20 and mid's 15; young's 20 would be more than is left
        await asyncio.wait_for(asyncio.gather(waiters[1], waiters[2]), 1)
        await asyncio.sleep(0.02)
        assert sorted(admitted) == ["mid", "old"] and not waiters[0].done()
        first.release()
        await asyncio.wait_for(waiters[0], 1)
        assert admitted[-1] == "young"

    asyncio.run(scenario())
