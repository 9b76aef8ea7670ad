"""One run of the XDB service (xdb/service/service.py) as a process of the server sees it: where it listens
(`ServiceSpec`, made once by the owner with `new_spec` and kept across runs), the connections to it (a
stream, and a pool for calls, each proving the run's key), and, for the owner, the process itself
(`ServiceProcess`: spawned, waited for, stopped, killed). An attached process holds a `ServiceLink` to the
owner's run and never touches the process."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from core.config import XDBConfig
from core.errors import Unavailable
from xdb.service import service
from xdb.service.service import CALLBACK, ServiceSpec

log = logging.getLogger("ahc.xdb")

START_TIMEOUT_S = 600.0   # opening replays from the audit what the experience file missed: can take a while
STOP_TIMEOUT_S = 120.0    # the last commits after the stream closes
# The longest a call waits for a word from the service (an answer, or a callback's request): longer than
# any call takes (an export or backup of a large file, a storage pass between its summaries).
CALL_TIMEOUT_S = 900.0


class ServiceUnavailable(Unavailable):
    """The XDB service died during the call (it is being started again): retry."""


def new_spec(data_dir: Path, config: XDBConfig) -> ServiceSpec:
    """Where every run of one owner's service listens, and its key: a socket in a 0700 directory of its
    own (removed by `remove_spec`) and a key made for the owner's life."""
    socket_dir = Path(tempfile.mkdtemp(prefix="ahc-xdb-"))
    return ServiceSpec(str(data_dir), config.model_dump(), str(socket_dir / "xdb.sock"), secrets.token_bytes(32))


def remove_spec(spec: ServiceSpec) -> None:
    shutil.rmtree(Path(spec.address).parent, ignore_errors=True)


class ServiceLink:
    """This process's connections to one run of the service: its stream (opened on construction) and a
    pool of call connections. Made as it is by an attached process; `kill()` closes the connections and
    never touches the service, which is its owner's."""

    def __init__(self, spec: ServiceSpec, *, owner: bool = False, connect: bool = True) -> None:
        self.spec = spec
        self.announced_exit: int | None = None  # the exit code the run said it was ending with
        self._pool: list[Connection] = []  # idle call connections
        self._pool_lock = threading.Lock()
        self._opened: list[Connection] = []  # every connection made to this run, closed by kill()
        self._owner = owner
        if connect:
            self._open_stream()

    def _open_stream(self) -> None:
        try:
            self.stream = self.connect()
            self.stream.send(("stream", "owner") if self._owner else ("stream",))
        except BaseException:
            self.kill()
            raise

    @property
    def exitcode(self) -> int | None:
        """How the run ended, as far as this process can tell."""
        return self.announced_exit

    def connect(self) -> Connection:
        conn = Client(self.spec.address, "AF_UNIX")
        self._opened.append(conn)
        try:
            service.handshake(conn, self.spec.authkey, client=True)
        except TimeoutError:
            conn.close()
            self._unanswered("a new connection")
            raise
        except BaseException:
            conn.close()
            raise
        return conn

    def _unanswered(self, what: str) -> None:
        """The run did not answer `what` in time (an attached process waits for its owner to act)."""
        log.error("the XDB service did not answer %s", what)

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        callbacks = {k: v for k, v in kwargs.items() if callable(v)}
        sent = {k: CALLBACK if k in callbacks else v for k, v in kwargs.items()}
        with self._pool_lock:
            conn = self._pool.pop() if self._pool else None
        try:
            conn = conn or self.connect()
            conn.send((name, args, sent))
            while True:
                if not conn.poll(CALL_TIMEOUT_S):
                    self._unanswered(f"{name} in {CALL_TIMEOUT_S:.0f} s")
                    raise TimeoutError(f"no answer in {CALL_TIMEOUT_S:.0f} s")
                kind, *rest = conn.recv()
                if kind != "callback":
                    break
                conn.send(_run_callback(callbacks[rest[0]], rest[1]))
        except (EOFError, OSError) as exc:  # TimeoutError too
            if conn is not None:
                conn.close()
            raise ServiceUnavailable(f"the XDB service stopped during {name}: {exc!r}") from exc
        with self._pool_lock:
            self._pool.append(conn)
        if kind == "error":
            raise rest[0]
        return rest[0]

    def stop(self) -> int | None:
        """Close this process's stream (the service commits what it took; an ordinary stream's closing ends
        nothing else) and every connection. A message, not closing the socket: another thread is reading
        it, and Linux does not end a connection while a read on it is blocked."""
        with contextlib.suppress(OSError):  # already gone: nothing to ask
            self.stream.send(("close",))
        self.kill()
        return None

    def kill(self) -> None:
        for conn in self._opened:
            conn.close()


class ServiceProcess(ServiceLink):
    """One run of the service process, spawned by its owner (this process): started, connected by the
    owner's stream, stopped. It listens at `spec` (a new one, removed by kill(), when none is given)."""

    def __init__(self, data_dir: Path, config: XDBConfig, spec: ServiceSpec | None = None) -> None:
        self._own_spec = spec is None
        super().__init__(spec or new_spec(data_dir, config), owner=True, connect=False)
        ctx = multiprocessing.get_context("spawn")
        status, child_status = ctx.Pipe(duplex=False)
        # Daemonic: if this process exits without stopping it, the service does not keep it waiting.
        self.process: BaseProcess = ctx.Process(target=service.main, args=(self.spec, child_status),
                                                name="ahc-xdb", daemon=True)
        self.process.start()
        child_status.close()
        try:
            self._wait_ready(status)
        except BaseException:
            self.kill()
            raise
        self._open_stream()

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def _wait_ready(self, status: Connection) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not status.poll(0.2):
            if not self.process.is_alive():
                raise RuntimeError(f"the XDB service exited during start-up (exit code {self.process.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the XDB service did not open {self.spec.data_dir} in {START_TIMEOUT_S:.0f} s")
        kind, error = status.recv()
        status.close()
        if kind == "error":
            raise error

    def _unanswered(self, what: str) -> None:
        # A service that does not answer is as good as dead: killed, so the writer starts a new one
        # (which takes the rows not yet committed again).
        log.error("the XDB service did not answer %s; killing it", what)
        self.process.kill()

    def stop(self) -> int | None:
        """Tell the service to stop (it commits what it holds and exits) and wait for it."""
        with contextlib.suppress(OSError):
            self.stream.send(("close",))
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            log.error("the XDB service did not stop in %.0f s; killing it", STOP_TIMEOUT_S)
        self.kill()
        return self.process.exitcode

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        super().kill()
        if self._own_spec:
            remove_spec(self.spec)


def _run_callback(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # the service's call fails with this message; nothing is stored half-way
        return "error", repr(exc)
