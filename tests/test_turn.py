"""A turn's commit when the client leaves while its State is being saved."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest

from orchestrator.prepared import Prepared
from orchestrator.turn import Turn
from orchestrator.turn_request import TurnRequest


class SlowSave:
    """A driver whose commit's save finishes on a worker thread when the test says how."""

    def __init__(self) -> None:
        self.saving: concurrent.futures.Future[int] = concurrent.futures.Future()
        self.abandoned = 0

    async def prepare(self, request: TurnRequest, force_compaction: bool = False) -> Prepared:
        return Prepared.__new__(Prepared)  # the turn only hands it back to this driver

    async def shrink(self, prepared: Prepared) -> Prepared | None:
        return None

    def commit(self, prepared: Prepared, reply: dict[str, Any]) -> Any:
        return self.saving

    def abandon(self, prepared: Prepared) -> None:
        self.abandoned += 1

    def delivered(self, prepared: Prepared) -> None:
        pass

    def rollback(self, prepared: Prepared) -> None:
        raise AssertionError("a committed turn is not rolled back")


@pytest.mark.parametrize("outcome", ["saved", "failed"])
def test_a_client_leaving_during_the_save_neither_cancels_it_nor_hides_its_failure(outcome: str) -> None:
    async def run() -> SlowSave:
        driver = SlowSave()
        turn = Turn(driver, TurnRequest(None), asyncio.Lock())

        async def request() -> None:
            async with turn:
                await turn.commit({"role": "assistant", "content": "done"})

        task = asyncio.create_task(request())
        await asyncio.sleep(0.01)  # the commit waits on the save
        task.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not driver.saving.cancelled()  # the save goes on
        if outcome == "saved":
            driver.saving.set_result(1)
        else:
            driver.saving.set_exception(OSError("the XDB service died"))
        await asyncio.sleep(0.01)
        return driver

    driver = asyncio.run(run())
    assert driver.abandoned == (outcome == "failed")
