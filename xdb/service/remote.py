"""The API processes' side of the XDB service (xdb/service/service.py): the same interface as an in-process XDB,
with the database, its writer and the audit chain in a child process.

`RemoteWriter` takes rows exactly as the in-process writer does (validated on the caller's thread,
never waiting on disk) and a sender thread ships what has gathered every few milliseconds as one
message on its stream. The service reports every commit of this stream's rows back, so the count of
rows not yet committed — the queue depth that back-pressure reads — and `flush` need no round trip.
Rows stay held here until the service says they are committed: if it dies, the next run is told the
tokenizer and side channel again, the held rows are sent again, those it already stored are skipped,
and no accepted row is lost or written twice. `RemoteXDB` (xdb/service/remote_xdb.py) runs every other call in
the service over a pool of connections.

Two modes, one service. The owner (`RemoteXDB(data_dir, config)`) makes the service's `ServiceSpec`
(address and key) once, spawns each run there (`ServiceProcess`), starts another when one dies, and
stops it on closing; the socket's directory goes with its last close. An attached process
(`RemoteXDB(data_dir, config, attach=owner.service_spec)`, any number of them) connects to the run
there (`ServiceLink`) with a stream of its own; when the run dies it kills and spawns nothing but tries
the address until the owner's next run answers (up to `reconnect_timeout_s`, else recording stops), and
on closing commits what it accepted and closes its stream alone.

A disk fault (the service exits with EXIT_DISK_FAULT) pauses recording rather than stopping it, waiting
with a doubling interval for the disk to mend; `xdb.on_disk_full` chooses where rows wait meanwhile: in
memory (`pause`: past max_queue_rows the server answers 503), or in files under `xdb.spill_dir` (`spill`,
xdb/service/spill_sender.py: sent in order once the service commits again, or at the next start).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from core.config import XDBConfig
from xdb.interface import service_methods
from xdb.rows import TimestepRow, TokenBatch
from xdb.schema import TOP_K
from xdb.service import service
from xdb.service.link import START_TIMEOUT_S, ServiceLink, ServiceProcess, new_spec, remove_spec
from xdb.service.service import ServiceSpec
from xdb.service.spill_sender import SpillSender
from xdb.store import XDB
from xdb.writer import WriterBackpressure, WriterStopped, accepted, wait_committed
from xdb.writer_failure import is_disk_fault

log = logging.getLogger("ahc.xdb")

Part = list[TimestepRow] | TokenBatch
RESTART_ATTEMPTS = 5
RECONNECT_INTERVAL_S = 0.1  # how often an attached writer tries the address while the owner restarts the service
# A service that dies this often is failing on what it is sent (a full disk, a broken file), not
# crashing by accident: recording stops (the server answers 503) rather than restarting it forever.
MAX_RESTARTS, RESTART_WINDOW_S = 3, 60.0
# A disk fault is waited out instead (it is no row's fault and no restart mends it): first retry after this,
# doubling up to the maximum.
DISK_RETRY_FIRST_S, DISK_RETRY_MAX_S = 1.0, 60.0
RECORDING_STATES = ("recording", "paused", "stopped")
SERVED = service_methods(XDB)


class _LeftSpilled(Exception):
    """Closing while the disk still fails, with a spill dir that works: the rows are left there for the next
    start rather than waiting for the disk."""


class RemoteWriter:
    """The writer's interface over one stream to the service. The owner (no `attach`) spawns each run of
    the service at `spec`, made here; an attached writer (`attach`: an owner's `spec`) connects to the run
    there, and after the run dies waits up to `reconnect_timeout_s` for the owner's next one."""

    def __init__(self, data_dir: Path, config: XDBConfig, on_commit: Callable[[int], None] | None = None,
                 on_restart: Callable[[], None] | None = None, k: int = TOP_K, send_interval_s: float = 0.05,
                 *, attach: ServiceSpec | None = None, reconnect_timeout_s: float = START_TIMEOUT_S) -> None:
        self._data_dir, self._config, self._k = data_dir, config, k
        self.attached = attach is not None
        self.spec: ServiceSpec = attach or new_spec(data_dir, config)
        self.reconnect_timeout_s = reconnect_timeout_s
        self.max_queue_rows, self.submit_timeout_s = config.max_queue_rows, config.submit_timeout_s
        self.on_commit, self.on_restart = on_commit, on_restart
        self.send_interval_s = send_interval_s
        self.restarts = 0
        self._restarted_at: deque[float] = deque(maxlen=MAX_RESTARTS)
        self.paused: str | None = None  # why recording waits on a failed disk
        self._paused_at = 0.0
        self._pause_cause: BaseException | None = None
        self._disk_faults = 0  # in a row, since the last commit
        # `on_disk_full: spill`: rows gathered while paused go to files (xdb/service/spill_sender.py), not memory.
        self._spiller: SpillSender | None = None
        self._cond = threading.Condition()
        self._pending: deque[Part] = deque()   # accepted, not sent yet
        self._held: deque[tuple[int, Part]] = deque()  # sent, not known committed: (rows sent up to it, part)
        self._accepted = 0     # rows accepted since open
        self._sent = 0         # rows sent to a service since open
        self._credited = 0     # rows committed by services that have since died
        self._acked = 0        # rows the current service reports committed
        self._flush_asked = False
        self._dead = False     # the current service's stream broke
        self._closing = False
        self._error: BaseException | None = None
        self._capture: tuple[str, int, float] | None = None  # the side channel, told to every service run
        self._tokenizer: str | None = None  # what the service decodes token ids with, told to every run
        if config.on_disk_full == "spill":
            assert config.spill_dir is not None  # XDBConfig requires it
            self._spiller = SpillSender(Path(config.spill_dir), data_dir, self.attached, self._cond)
            if not self.attached:  # what a stopped or killed server left: sent before anything new
                self._accepted = self._spiller.adopt_leftovers()
        self.process: ServiceLink
        if self.attached:
            self.process = self._attach()
        else:
            try:
                self.process = ServiceProcess(data_dir, config, self.spec)
            except BaseException:
                remove_spec(self.spec)
                raise
        self._listen(self.process)
        self._sender = threading.Thread(target=self._send_loop, name="xdb-sender", daemon=True)
        self._sender.start()
        if self._accepted:
            self._replay_leftovers()

    def _replay_leftovers(self) -> None:
        """Commit the rows a stopped or killed server spilled, before this one takes any: new rows' ticks are
        reserved after the committed ones."""
        rows = self._accepted
        log.info("XDB: sending %d rows spilled to %s by a server that stopped before they were committed",
                 rows, self._config.spill_dir)
        try:
            with self._cond:
                self._flush_asked = True
                self._cond.notify_all()
                wait_committed(self._cond, rows, lambda: self.rows_written, self._check_alive, None)
        except BaseException:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self.process.kill()
            if not self.attached:
                remove_spec(self.spec)
            raise
        log.info("XDB: the %d spilled rows are committed", rows)

    # -- the caller's side (as xdb.writer.Writer) --------------------------------------------------
    @property
    def rows_written(self) -> int:
        return self._credited + self._acked

    def queue_depth(self) -> int:
        return self._accepted - self.rows_written

    @property
    def _spilled(self) -> int:
        """Rows in the spill files not read back yet: accepted, in no deque here."""
        return self._spiller.unread if self._spiller is not None else 0

    @property
    def alive(self) -> bool:
        return self._error is None and not self._closing

    def try_submit(self, rows: Part) -> bool:
        return self._offer(accepted(rows, self._k, self._tokenizer is not None))

    def submit(self, rows: Part, timeout: float | None = None) -> None:
        timeout = self.submit_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        rows = accepted(rows, self._k, self._tokenizer is not None)
        while not self._offer(rows):
            with self._cond:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WriterBackpressure(f"XDB writer queue full ({self.queue_depth()} rows) for {timeout} s")
                self._cond.wait(min(remaining, 0.1))

    def _offer(self, rows: Part) -> bool:
        """Queue validated rows if the uncommitted count leaves room; an oversized part still goes
        into an empty queue, so it can never wait forever."""
        n = len(rows)
        if not n:
            return True
        with self._cond:
            self._check_alive()
            in_memory = self.queue_depth() - self._spilled  # spilled rows wait on another disk
            if in_memory and in_memory + n > self.max_queue_rows:
                return False
            self._pending.append(rows)
            self._accepted += n
            if len(self._pending) == 1:
                self._cond.notify_all()
        return True

    def capture_activations(self, address: str, k: int, wait_s: float) -> None:
        """As Writer.capture_activations, in the service (and again in each service started after)."""
        self._capture = (address, k, wait_s)
        self.process.call("capture_activations", self._capture, {})

    def decode_tokens_with(self, tokenizer: str) -> None:
        """As Writer.decode_tokens_with, in the service (and again in each service started after): token
        batches are shipped as ids and their texts decoded there, off this process."""
        self._tokenizer = tokenizer
        self.process.call("decode_tokens_with", (tokenizer,), {})

    def flush(self, timeout: float | None = None) -> None:
        with self._cond:
            target = self._accepted
            if self.rows_written >= target:
                return
            self._flush_asked = True
            self._cond.notify_all()
            wait_committed(self._cond, target, lambda: self.rows_written,
                           lambda: self._check_alive(closing_ok=True), timeout)

    def request_flush(self) -> None:
        with self._cond:
            self._flush_asked = True
            self._cond.notify_all()

    def close(self) -> None:
        """Send and commit everything accepted, then stop the service (the owner's), or close this
        writer's stream alone (an attached one's: the service goes on)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._sender.join()
        try:
            code = self.process.stop()
        finally:
            if not self.attached:
                remove_spec(self.spec)
            if self._spiller is not None:
                self._spiller.close()
        if self._error is not None:
            raise WriterStopped(f"XDB writer failed: {self._error!r}") from self._error
        if self.rows_written < self._accepted and not (self._spiller and self._spiller.left):
            raise WriterStopped(f"the XDB service stopped (exit code {code}) with "
                                f"{self._accepted - self.rows_written} rows uncommitted")

    def _check_alive(self, closing_ok: bool = False) -> None:
        if self._error is not None:
            raise WriterStopped(f"XDB writer failed: {self._error!r}") from self._error
        if self._closing and not closing_ok:
            raise WriterStopped("XDB writer is closed")

    # -- the service's side ----------------------------------------------------------------------
    def _listen(self, process: ServiceLink) -> None:
        threading.Thread(target=self._ack_loop, args=(process,), name="xdb-acks", daemon=True).start()

    def _ack_loop(self, process: ServiceLink) -> None:
        """The service's commit counts for this stream; a broken stream marks the service dead (the sender
        restarts it, or waits for the owner to)."""
        while True:
            try:
                kind, total = process.stream.recv()
            except (EOFError, OSError):
                with self._cond:
                    if process is self.process:
                        self._dead = True
                        self._cond.notify_all()
                return
            if kind == "exit":  # the run is ending with this code (what an attached writer cannot see)
                process.announced_exit = total
            if kind != "committed":
                continue
            spiller = self._spiller
            with self._cond:
                if process is not self.process:
                    return
                delta, self._acked = total - self._acked, total
                if delta and self.paused is not None:
                    log.info("XDB recording resumed after a disk fault (paused %.0f s)%s",
                             time.monotonic() - self._paused_at,
                             f"; {self._spilled} spilled rows to send" if self._spilled else "")
                    self.paused, self._disk_faults = None, 0
                    if spiller is not None:
                        spiller.failed = None
                while self._held and self._held[0][0] <= self.rows_written:
                    self._held.popleft()
                done = spiller.committed(self.rows_written) if spiller is not None else []
                self._cond.notify_all()
            if spiller is not None:
                spiller.remove(done)
            if self.on_commit is not None and delta:
                try:
                    self.on_commit(delta)
                except Exception:  # a metrics hook must not stop recording
                    log.exception("XDB on_commit callback failed")

    def _send_loop(self) -> None:
        try:
            while self._send_once():
                pass
        except BaseException as exc:
            log.exception("the XDB sender failed")
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _send_once(self) -> bool:
        """Send what has gathered; False once closing and everything accepted is committed or given up."""
        with self._cond:
            while not (self._pending or self._flush_asked or self._dead or self._closing or self._replay_ready()):
                self._cond.wait()
            if not (self._dead or self._flush_asked or self._closing or self._spilled):
                self._cond.wait(self.send_interval_s)  # let a few more steps' rows gather
            if not self._dead and self._spilled:  # spilled rows go first, in order
                if not self._replay_ready():
                    self._cond.wait(self.send_interval_s)  # until the service has committed more of them
                    return True
                replay = True
            else:
                replay = False
        if replay:
            self._send_spilled()
            return True
        with self._cond:
            if self._dead:
                parts = None
            else:
                parts = list(self._pending)
                self._pending.clear()
                for part in parts:
                    self._sent += len(part)
                    self._held.append((self._sent, part))
                flush, self._flush_asked = self._flush_asked or self._closing, False
            done = self._closing and not self._pending and not self._spilled
        if parts is None:
            return self._restart()
        try:
            if parts:
                self.process.stream.send(("rows", parts, False))
            if flush:
                self.process.stream.send(("flush",))
        except OSError:  # the service died: these parts are held and go again to the next one
            with self._cond:
                self._dead = True
            return True
        if done:
            return self._wait_committed()
        return True

    def _wait_committed(self) -> bool:
        """Closing: wait until the service has committed everything; a service that dies meanwhile is
        restarted and sent the held rows again."""
        with self._cond:
            while self.rows_written < self._accepted and not self._dead:
                self._cond.wait(1.0)
            return self._dead

    def _restart(self) -> bool:
        """A new run (or, attached, the owner's next) for the dead one. With a spill dir, while recording is
        paused meanwhile, a thread of its own moves the rows gathered to the spill, since starting a run
        takes a while; it has stopped by the time this returns, so the sender alone decides what goes next.
        False: closed while the disk failed, every row left in the spill dir (`_leave_spilled`)."""
        if self._spiller is None:
            self._restart_now()
            return True
        try:
            with self._spiller.meanwhile(self._spill_pending):
                self._restart_now()
        except _LeftSpilled:
            return self._leave_spilled()
        return True

    def _leave_spilled(self) -> bool:
        """Closing while the disk fails: the rows held in memory go to the spill dir (`SpillSender.leave`), so
        the next start sends them all in order (skipping any a run committed). False once they are there;
        True if the spill dir failed (closing then waits for the disk, as with `pause`)."""
        assert self._spiller is not None
        with self._cond:
            held = [part for _, part in self._held]
            pending = list(self._pending)
        if not self._spiller.leave(held, pending):
            return True
        with self._cond:
            self._held.clear()
            self._pending.clear()
            self._spiller.left = self._accepted - self.rows_written
        log.warning("XDB closed while the disk under %s fails: %d uncommitted rows left in %s, sent at the next "
                    "start", self._data_dir, self._spiller.left, self._spiller.dir)
        return False

    def _restart_now(self) -> None:
        dead = self.process
        dead.kill()
        disk = dead.exitcode == service.EXIT_DISK_FAULT
        if disk:
            self._pause_for_disk()
        elif len(self._restarted_at) == MAX_RESTARTS and time.monotonic() - self._restarted_at[0] < RESTART_WINDOW_S:
            raise WriterStopped(f"the XDB service died {MAX_RESTARTS + 1} times in {RESTART_WINDOW_S:.0f} s (last exit "
                                f"code {dead.exitcode}); {self._sent - self.rows_written} rows uncommitted")
        else:
            self._restarted_at.append(time.monotonic())
            log.error("the XDB service died (exit code %s); %s with %d uncommitted rows",
                      "unknown" if dead.exitcode is None else dead.exitcode,
                      "waiting for its owner to start it again" if self.attached else "starting it again",
                      self._sent - self.rows_written)
        process = self._reattach() if self.attached else self._respawn(disk)
        with self._cond:
            # Credit the rows before the first part still held: the new run counts again the rows of a
            # part the dead one committed only in part (it skips them as already stored, xdb/service/service.py).
            self._credited = self._held[0][0] - len(self._held[0][1]) if self._held else self._credited + self._acked
            self._acked = 0
            self.process, self._dead = process, False
            held = [part for _, part in self._held]
        self._listen(process)
        if held:
            try:
                process.stream.send(("rows", held, True))
            except OSError:  # this one died at once too: the rows stay held for the next
                with self._cond:
                    self._dead = True
        self.restarts += 1
        if self.on_restart is not None:
            self.on_restart()

    def _respawn(self, disk: bool) -> ServiceProcess:
        """The owner's: a new run of the service, at the same address, told what the last one was."""
        attempt = 0
        while True:
            attempt += 1
            try:
                process = ServiceProcess(self._data_dir, self._config, self.spec)
                self._tell(process)
                return process
            except Exception as exc:
                if disk or is_disk_fault(exc):  # a full or failing disk: wait for it as long as it takes
                    disk = True
                    self._pause_for_disk(exc)
                    continue
                if attempt == RESTART_ATTEMPTS:
                    raise
                log.exception("starting the XDB service again failed (attempt %d)", attempt)
                time.sleep(attempt)

    def _reattach(self) -> ServiceLink:
        """An attached writer's: the owner's next run, once it listens, told what this writer told the last."""
        link = self._attach()
        try:
            self._tell(link)
        except BaseException:
            link.kill()
            raise
        return link

    def _tell(self, link: ServiceLink) -> None:
        if self._capture is not None:  # before the held rows: they join what comes from now on
            link.call("capture_activations", self._capture, {})
        if self._tokenizer is not None:  # before the held rows, which it decodes
            link.call("decode_tokens_with", (self._tokenizer,), {})

    def _attach(self) -> ServiceLink:
        """A stream to the run listening at `spec`, trying again until one answers (a restarted run opens XDB
        before it listens) or `reconnect_timeout_s` has passed."""
        deadline = time.monotonic() + self.reconnect_timeout_s
        while True:
            try:
                return ServiceLink(self.spec)
            except Exception as exc:
                if time.monotonic() >= deadline:
                    raise WriterStopped(f"no XDB service answered at {self.spec.address} in "
                                        f"{self.reconnect_timeout_s:.0f} s (last: {exc!r})") from exc
                if self.paused is not None:
                    self._wait_paused(RECONNECT_INTERVAL_S)
                else:
                    time.sleep(RECONNECT_INTERVAL_S)

    def _replay_ready(self) -> bool:
        """Spilled rows wait to be sent and the service has room for them: what is sent and not committed
        stays under half of max_queue_rows, so replaying never holds more in memory than that."""
        return (self._spilled > 0 and not self._dead
                and self._sent - self.rows_written < max(self.max_queue_rows // 2, 1))

    def _send_spilled(self) -> None:
        """The oldest spilled segment, read back and sent (held, like any row sent, until committed); its file
        goes once the service has committed its last row."""
        assert self._spiller is not None
        taken = self._spiller.take()
        if taken is None:
            return
        segment, parts = taken
        with self._cond:
            for part in parts:
                self._sent += len(part)
                self._held.append((self._sent, part))
            self._accepted -= self._spiller.sending(segment, parts, self._sent)  # rows a crash cut short are gone
            dead = self._dead
        if not parts:
            return
        try:
            if not dead:  # else the restart sends the held parts
                self.process.stream.send(("rows", parts, segment.resend))
                self.process.stream.send(("flush",))
        except OSError:
            with self._cond:
                self._dead = True

    def _pause_for_disk(self, cause: BaseException | None = None) -> None:
        """Recording paused: the disk failed under the service. `on_disk_full: pause`: every row is held (new
        ones wait in the queue, and past its bound the server answers 503); `spill`: the rows gathered go to
        the spill dir meanwhile (xdb/service/spill_sender.py), and the server serves on. The service starts
        again after a wait that doubles up to DISK_RETRY_MAX_S, and recording goes on once it commits. One
        ERROR line when it pauses, a WARNING a retry, one INFO when it resumes."""
        wait = min(DISK_RETRY_FIRST_S * 2 ** self._disk_faults, DISK_RETRY_MAX_S)
        first = self._disk_faults == 0
        self._disk_faults += 1
        with self._cond:
            if first:
                self._paused_at = time.monotonic()
            self._pause_cause = cause
            self.paused = self._paused_reason(cause, wait)
            reason = self.paused
        if first:
            log.error("XDB recording paused: %s", reason)
        else:
            log.warning("XDB recording still paused: %s", reason)
        self._wait_paused(wait)  # with a spill dir, `_restart`'s thread spills meanwhile

    def _wait_paused(self, seconds: float) -> None:
        """Wait while recording is paused; with a working spill dir, a close ends the wait (`_LeftSpilled`)."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while True:
                if self._closing and self._spiller is not None and self._spiller.failed is None:
                    raise _LeftSpilled
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def _paused_reason(self, cause: BaseException | None, wait: float) -> str:
        held = self._sent - self.rows_written
        why = f"the disk under the data dir {self._data_dir} failed{f' ({cause})' if cause else ''}"
        spiller = self._spiller
        if spiller is not None and spiller.failed is None:
            return (f"{why}; new rows are spilled to {spiller.dir} ({spiller.unread} so far) and {held} "
                    f"held in memory, retrying in {wait:.0f} s; free space under {self._data_dir}")
        spill = f"; the spill dir failed too ({spiller.failed})" if spiller and spiller.failed else ""
        return (f"{why}{spill}; {held + sum(len(p) for p in self._pending)} rows held in memory, retrying in "
                f"{wait:.0f} s (past xdb.max_queue_rows new requests get 503); free space under {self._data_dir}"
                + ("" if spiller is not None else " or set xdb.on_disk_full: spill with xdb.spill_dir on "
                   "another disk"))

    def _spill_pending(self) -> None:
        """While paused, the rows accepted and not sent go to the spill (`SpillSender.spill_pending`); if the
        spill dir fails, recording pauses with them in memory."""
        assert self._spiller is not None
        if self.paused is not None and not self._spiller.spill_pending(self._pending):
            with self._cond:
                self.paused = self._paused_reason(self._pause_cause, DISK_RETRY_FIRST_S)

    def recording_state(self) -> tuple[str, str | None]:
        """("recording", None), ("paused", why) while the disk fails, or ("stopped", why): for /health and
        the `ahc_xdb_recording` gauge."""
        with self._cond:
            if self._error is not None:
                return "stopped", str(self._error)
            if self.paused is not None:
                return "paused", self.paused
            return "recording", None
