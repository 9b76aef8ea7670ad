"""Rows written as a reply's are, and a session recorded on a thread while something else runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from xdb import XDB, RemoteXDB, TimestepRow


def say(xdb: XDB | RemoteXDB, session: str, text: str, n: int = 3) -> None:
    """`n` output rows of `session`, `text` with its tick, at its next ticks."""
    xdb.writer.submit([TimestepRow(session, t, "output", "assistant", f"{text}{t}", token_id=t)
                       for t in xdb.next_ticks(session, n)])


@contextmanager
def recording(xdb: XDB | RemoteXDB, session: str, every_s: float = 0.01) -> Iterator[list[int]]:
    """Record a row of `session` every `every_s` until the block ends; yields [rows sent], counted on."""
    stop, sent = threading.Event(), [0]

    def keep_recording() -> None:
        while not stop.wait(every_s):
            say(xdb, session, "more", 1)
            sent[0] += 1

    recorder = threading.Thread(target=keep_recording)
    recorder.start()
    try:
        yield sent
    finally:
        stop.set()
        recorder.join()
