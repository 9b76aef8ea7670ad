"""XDB's interface, served by the XDB service process (xdb/service/service.py): rows through a `RemoteWriter`
(xdb/service/remote.py), every other call in the service over a pool of connections, the session tick book here."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.config import XDBConfig
from xdb.interface import service_methods
from xdb.lake.session import ResumableTickBook, TickCalls
from xdb.service.link import START_TIMEOUT_S
from xdb.service.remote import RemoteWriter
from xdb.service.service import ServiceSpec
from xdb.store import XDB

SERVED = service_methods(XDB)


class RemoteXDB(TickCalls):
    """XDB's interface, served by the XDB service process."""

    def __init__(self, data_dir: Path | str, config: XDBConfig | None = None, *,
                 on_commit: Callable[[int], None] | None = None, on_restart: Callable[[], None] | None = None,
                 attach: ServiceSpec | None = None, reconnect_timeout_s: float = START_TIMEOUT_S) -> None:
        config = config or XDBConfig()
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.writer = RemoteWriter(self.data_dir, config, on_commit, on_restart, attach=attach,
                                   reconnect_timeout_s=reconnect_timeout_s)
        self._ticks = ResumableTickBook(self.committed_tick, config.max_tick_sessions)
        self.has_lake = config.backend == "ducklake"  # the service ships to it; `lake_*` read it there
        self._closed = False

    @property
    def service_spec(self) -> ServiceSpec:
        """Where the service listens, and its key: what another process attaches with (`attach=`)."""
        return self.writer.spec

    def close(self) -> None:
        """Commit every row accepted; the owner's closing stops the service, an attached one's its stream."""
        if not self._closed:
            self._closed = True
            self.writer.close()

    def __enter__(self) -> RemoteXDB:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def capture_activations(self, address: str, k: int, wait_s: float) -> None:
        """Through the writer, which tells every later run of the service too."""
        self.writer.capture_activations(address, k, wait_s)

    def decode_tokens_with(self, tokenizer: str) -> None:
        """Through the writer, which tells every later run of the service too."""
        self.writer.decode_tokens_with(tokenizer)

    def vacuum(self) -> dict[str, Any]:
        """The service rewrites the experience file whole, every other call and the rows waiting."""
        result: dict[str, Any] = self._call("vacuum")
        return result

    def _call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        return self.writer.process.call(method, args, kwargs)

    def _call_after_flush(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """For calls that must see every row submitted before them (as the in-process XDB's do)."""
        self.writer.flush()
        return self._call(method, *args, **kwargs)

    # -- recording -----------------------------------------------------------------------------
    def committed_tick(self, session_id: str) -> int:
        return int(self._call("committed_tick", session_id))

    # -- everything else runs in the service ------------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., Any]:
        """XDB's served methods (marked on XDB and its bases), called in the service; those that must see the
        rows submitted before them flush the writer first. Methods with logic of their own here (ticks,
        the writer's figures in `state`) are defined above and below and never reach this."""
        kind = SERVED.get(name)
        if kind is None:
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
        call = self._call_after_flush if kind == "after_flush" else self._call
        return functools.partial(call, name)

    def load_session_state_verified(self, session_id: str) -> Any:
        found = self._call("load_session_state_verified", session_id)
        self._resume_ticks(session_id)
        return found

    def state(self) -> Any:
        state = self._call("state")
        state["writer"] = {"queue_depth": self.writer.queue_depth(), "rows_written": self.writer.rows_written,
                           "process_restarts": self.writer.restarts}
        return state

    def load_session_state(self, session_id: str, version: int | None = None) -> Any:
        state = self._call("load_session_state", session_id, version)
        if version is None:
            self._resume_ticks(session_id)
        return state

    def _resume_ticks(self, session_id: str) -> None:
        """In ducklake mode loading a State may have learnt (in the service) that another replica went
        further in the session's ticks: this process's tick book moves past them too."""
        if self.has_lake:
            self._ticks.advance(session_id, self.committed_tick(session_id))

    def audit_head(self) -> tuple[int, str]:
        seq, head = self._call("audit_head")
        return int(seq), str(head)

