"""The API processes of one `ahc serve --api-server-count N`, as each of them sees the group: its index,
how many there are, and the files they share (made by the supervisor, in one private directory)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.config import AHCConfig
from server.capture.capture_setup import CaptureSetup
from xdb.service.service import ServiceSpec


@dataclass(frozen=True)
class GroupFiles:
    """The files the API processes share, in one directory only this server's user can read."""

    directory: str

    @property
    def leases(self) -> Path:
        return Path(self.directory) / "leases"

    @property
    def board(self) -> Path:
        return Path(self.directory) / "admission.board"

    @property
    def conversations(self) -> Path:
        return Path(self.directory) / "conversations.sqlite"


@dataclass(frozen=True)
class ApiGroup:
    index: int  # this process's, 0..count-1; process 0 also gets the engine's scheduler stats
    count: int
    files: GroupFiles
    xdb: ServiceSpec  # the one XDB service, run by the supervisor; every API process attaches to it

    @property
    def primary(self) -> bool:
        """Process 0 runs the server-wide loops (retention and the quota)."""
        return self.index == 0


@dataclass(frozen=True)
class WorkerSpec:
    """What each API process is started with, besides vLLM's own namespace (it travels in it)."""

    config: AHCConfig
    capture: CaptureSetup | None
    events_endpoint: str | None
    files: GroupFiles
    xdb: ServiceSpec  # the XDB service every API process attaches to
