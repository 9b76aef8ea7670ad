"""The XDB service: a process of its own that owns the experience database and the audit log while a
server runs, so their cost (Arrow conversion, the audit's SHA-256 chain, DuckDB's commits) and their
threads' hold on the GIL stay out of the processes that stream tokens — the way vLLM keeps its engine
out of its API servers.

One process owns the service (spawns each run of it, and starts another when a run dies); any number of
others attach to it (`ahc serve --api-server-count N`: every API process). Every run listens at the
owner's one address with its one key (`ServiceSpec`), so an attached process reaches the next run where
it reached the last. They talk over Unix-socket connections (`multiprocessing.connection`, pickled
messages); a connection's first message says what it is:
    a stream, ("stream", "owner") for the owner's and ("stream",) for any other, at any time, before the
        owner's or after: rows in, ("rows", parts, resent) and ("flush",) (commit what is queued now);
        commit counts out, ("committed", rows of THIS stream committed since it connected), sent after
        every commit of its rows. The writer commits rows in the order it was given them (a batch waiting
        for its activations holds those behind it), so the service keeps the parts it submitted, with their
        stream, in that order, and credits each commit to the streams of its rows. Rows resent after a
        restart may have been committed before the crash: those already stored are skipped and counted as
        committed. The owner's stream closing (or ("close",) on it) ends the service: what is queued is
        committed first. Another stream closing (its process stopped, or was killed) ends only its own
        thread: the rows it had handed over are committed all the same.
    calls, any other first message: (method, args, kwargs) → ("ok", result) | ("error", exception);
        a keyword argument given as CALLBACK is a function of the caller's, run there on request
        (("callback", name, args) → ("ok", value) | ("error", message)): compaction's summarizer is one.
    `vacuum`, a call of the service's own: the experience file rewritten whole (xdb/storage/vacuum.py) while
        every other call and the rows wait: XDB is closed (its queue committed), the file rewritten, and
        XDB opened again.
The API processes' token batches come as ids, without texts: the writer here decodes them
(xdb/token_decoder.py) with the tokenizer a process gave (`decode_tokens_with`, kept across a vacuum and
told again to every run by each process); the activations side channel (`capture_activations`) is kept
the same way, and told again unchanged it stays bound. Both are the service's, not a stream's.
A writer that dies ends the service at once (every stream is told ("exit", code) first, since only the
owner sees the exit code), so the owner starts it again; the part it died on is found and dropped over
the next two runs (xdb/writer_failure.py). A stream whose rows cannot be taken at all ends it too.

Each connection proves the key (multiprocessing's challenge) on a thread of its own, within
HANDSHAKE_TIMEOUT_S: a connection that closes at once or never answers costs only its own thread, and
the accept loop survives anything one connection does. The socket is the owner's processes' alone (a
0700 directory, a key made per owner): the method marks (xdb/interface.py) keep them from calling what
was not meant to be served, but they are no security boundary, since a message is unpickled on receipt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from core.config import XDBConfig
from core.errors import Conflict
from xdb.interface import service_methods
from xdb.rows import TimestepRow, TokenBatch
from xdb.schema import EXPERIENCE_FILE, DatabaseInUse
from xdb.storage.vacuum import vacuum_experience
from xdb.store import XDB
from xdb.writer import PartSpan
from xdb.writer_failure import WriterFailure, is_disk_fault, rows_of, without

log = logging.getLogger("ahc.xdb.service")

# The XDB methods a caller may run in the service (everything but opening and closing it).
# The calls the service accepts: the methods XDB marks as served (xdb/interface.py).
METHODS = frozenset(service_methods(XDB))
CALLBACK = "<callback>"
PROCESS_TITLE = "AHC::XDB"
# The server never sends more than the writer's queue holds (it counts what is uncommitted), so a
# submit here waits only while a batch is being cut; this bound is for a writer that has hung.
SUBMIT_TIMEOUT_S = 600.0
LOCK_WAIT_S = 10.0
HANDSHAKE_TIMEOUT_S = 10.0
LISTEN_BACKLOG = 64  # every API process connects to a restarted run at once
EXIT_WRITER_DIED = 3
EXIT_DISK_FAULT = 4  # the disk failed under the writer: the server pauses, nothing is dropped

Part = list[TimestepRow] | TokenBatch


@dataclass(frozen=True)
class ServiceSpec:
    data_dir: str
    config: dict[str, Any]  # XDBConfig's fields
    address: str            # the Unix socket the service listens on
    authkey: bytes


def main(spec: ServiceSpec, status: Connection) -> None:
    """The process's entry point: open XDB, report ("ready", None) or ("error", exception) on `status`,
    then serve until the owner's stream closes."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The server stops this process itself, after its last rows: Ctrl-C in a terminal reaches the
    # whole process group, and must not close the database under requests still finishing.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Every file this process makes is XDB's, every tenant's prompts and replies: its user's alone,
    # DuckDB's write-ahead logs included (DuckDB makes them with the process's umask).
    os.umask(0o077)
    name_process()
    service = Service(spec.authkey)
    try:
        service.failure = WriterFailure.take(Path(spec.data_dir))
        service.open(spec)
        # Every run listens at the same address: a run killed outright leaves its socket file behind (its
        # owner has ended that run before starting this one). Bound once XDB is open, so a process that
        # connects to it is answered at once.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.address)
        # Each connection's key is checked on its own thread.
        listener = Listener(spec.address, "AF_UNIX", backlog=LISTEN_BACKLOG)
    except BaseException as exc:
        if service.xdb is not None:
            with contextlib.suppress(Exception):
                service.xdb.close()
        status.send(("error", portable(exc)))
        return
    status.send(("ready", None))
    status.close()
    try:
        service.serve(listener)
    finally:
        listener.close()


class _Timed:
    """A connection whose reads give up after `timeout_s` (what the handshake reads through)."""

    def __init__(self, conn: Connection, timeout_s: float) -> None:
        self.conn, self.timeout_s = conn, timeout_s

    def send_bytes(self, data: bytes) -> None:
        self.conn.send_bytes(data)

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        if not self.conn.poll(self.timeout_s):
            raise TimeoutError(f"no answer in {self.timeout_s:.0f} s")
        return self.conn.recv_bytes(maxlength)


def handshake(conn: Connection, authkey: bytes, *, client: bool = False) -> None:
    """Both sides prove the key, as Listener.accept and Client do (the client answers first), each
    read within HANDSHAKE_TIMEOUT_S."""
    timed: Any = _Timed(conn, HANDSHAKE_TIMEOUT_S)
    steps = (answer_challenge, deliver_challenge) if client else (deliver_challenge, answer_challenge)
    for step in steps:
        step(timed, authkey)


def open_when_free(spec: ServiceSpec, service: Service) -> XDB:
    """XDB.open, waiting up to LOCK_WAIT_S while another process holds the files: a server killed
    outright leaves its service committing its last rows for a moment, and a restart must not fail on it."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return XDB.open(Path(spec.data_dir), XDBConfig(**spec.config), on_commit=service.committed)
        except DatabaseInUse:
            if time.monotonic() > deadline:
                raise
            log.info("%s is held by another process; waiting for it to close", spec.data_dir)
            time.sleep(0.5)


def name_process() -> None:
    """`AHC::XDB` in ps and top, as vLLM names its engine `VLLM::EngineCore` (with the same package)."""
    from setproctitle import setproctitle

    setproctitle(PROCESS_TITLE)


def portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class Gate:
    """Many holders at once (`shared`), or one alone (`exclusive`), which new holders wait behind."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holders = 0
        self._closed = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._holders += 1
        try:
            yield
        finally:
            with self._cond:
                self._holders -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._closed = True
            self._cond.wait_for(lambda: self._holders == 0)
        try:
            yield
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


class Stream:
    """One stream connection: rows in, this stream's commit count out."""

    def __init__(self, conn: Connection, owner: bool) -> None:
        self.conn, self.owner = conn, owner
        self.committed = 0  # rows of this stream committed since it connected (under the service's _counts)
        self._send = threading.Lock()  # the connection's sending side
        self._open = True

    def report(self) -> None:
        """Send the stream its count as it is now (read under the send lock, so the counts a stream is sent
        never go down, whichever threads credit it)."""
        with self._send:
            if not self._open:
                return
            try:
                self.conn.send(("committed", self.committed))
            except OSError:  # its process is gone; the rows are committed all the same
                self._open = False

    def announce_exit(self, code: int) -> None:
        """Best effort, from a thread that is about to end the process: why it ends (an attached process
        cannot see the exit code)."""
        if self._send.acquire(timeout=1.0):
            try:
                if self._open:
                    self.conn.send(("exit", code))
            except OSError:
                pass
            finally:
                self._send.release()

    def close(self) -> None:
        with self._send:
            self._open = False
            self.conn.close()


class Service:
    def __init__(self, authkey: bytes) -> None:
        self.authkey = authkey
        self.xdb: XDB | None = None
        self.spec: ServiceSpec | None = None
        self._gate = Gate()  # every call and every part of rows shares it; a vacuum holds it alone
        self._capture: tuple[str, int, float] | None = None  # the activations side channel, kept across a vacuum
        self._tokenizer: str | None = None  # what token ids are decoded with, kept across a vacuum
        self._streams: list[Stream] = []  # every stream connected and not yet ended
        # Submissions to the writer, one at a time: held across `writer.submit` (which may wait on
        # back-pressure), so that `_queue` is in the writer's order. `committed` never takes it.
        self._submitting = threading.Lock()
        # Short: the rows in the writer's queue, as (stream, rows) in the order submitted, and the counts.
        # The writer commits in that order (xdb/writer.py: one queue, batches cut off its front, each stage
        # one thread; a batch waiting for its activations (`join_by`) holds those behind it, never passed),
        # so each commit of n rows is the queue's first n.
        self._counts = threading.Lock()
        self._queue: deque[list[Any]] = deque()  # [Stream, rows not yet committed]
        self._ended = threading.Event()  # the owner's stream ended, or a stream's thread failed
        self._ending = False
        self._failure: BaseException | None = None
        self.failure: WriterFailure | None = None  # where the previous run's writer died, if it did
        self._alone = False  # a part sent again under suspicion is being committed alone

    def open(self, spec: ServiceSpec) -> None:
        self.spec = spec
        self.xdb = open_when_free(spec, self)
        assert self.xdb.writer is not None
        self.xdb.writer.on_failure = self.writer_died
        if self._capture is not None:
            self.xdb.capture_activations(*self._capture)
        if self._tokenizer is not None:
            self.xdb.decode_tokens_with(self._tokenizer)

    def vacuum(self) -> dict[str, Any]:
        """Erase deleted sessions from the files: the segments holding their timesteps rewritten while
        everything goes on (`erase_pass`), then experience.duckdb rewritten whole (deleted rows leave its
        blocks), every call and row waiting meanwhile (`held_s`)."""
        assert self.spec is not None and self.xdb is not None
        started = time.monotonic()
        erased = self.xdb.erase_pass()
        path = Path(self.spec.data_dir) / EXPERIENCE_FILE
        bound = XDBConfig(**self.spec.config).vacuum_max_bytes
        if bound is not None and path.stat().st_size > bound:
            raise Conflict(f"{path} is {path.stat().st_size:,} bytes, over xdb.vacuum_max_bytes ({bound:,}): a live "
                           "vacuum would hold recording too long; stop the server and run `ahc xdb vacuum --data-dir "
                           f"{self.spec.data_dir}`")
        with self._gate.exclusive():
            held = time.monotonic()
            self.xdb.close()  # its queue committed, every commit reported
            try:
                result = vacuum_experience(Path(self.spec.data_dir))
            finally:
                self.open(self.spec)
            log.info("XDB service: erased (%d segments rewritten), vacuumed the experience file (%d → %d bytes) "
                     "in %.1f s, %.2f s of it holding recording", erased["rewritten"], result["bytes_before"],
                     result["bytes_after"], time.monotonic() - started, time.monotonic() - held)
            return {**result, "segments": erased, "seconds": round(time.monotonic() - started, 3),
                    "held_s": round(time.monotonic() - held, 3)}

    def serve(self, listener: Listener) -> None:
        """Accept connections until the owner's stream ends; then commit what is queued and return."""
        assert self.xdb is not None
        threading.Thread(target=self._accept, args=(listener,), name="xdb-accept", daemon=True).start()
        self._ended.wait()
        with self._counts:
            self._ending = True
        listener.close()  # no new connection reaches a service that is ending (its socket is unlinked)
        try:
            self.xdb.close()  # commits what is queued; each commit is still reported on the streams
        finally:
            with self._counts:
                streams, self._streams = self._streams, []
            for stream in streams:
                stream.close()
        if self._failure is not None:
            raise self._failure

    def _accept(self, listener: Listener) -> None:
        while True:
            try:
                conn = listener.accept()
            except OSError:  # the listener closed: the service is stopping
                return
            except Exception as exc:  # one connection's failure ends nothing
                log.warning("XDB service: accepting a connection failed: %r", exc)
                continue
            threading.Thread(target=self._serve_connection, args=(conn,), name="xdb-conn", daemon=True).start()

    def _serve_connection(self, conn: Connection) -> None:
        """A connection's own thread: the handshake, then its first message says what it is: ("stream",),
        ("stream", "owner"), or the first call."""
        try:
            handshake(conn, self.authkey)
            first = conn.recv()
        except (EOFError, OSError):
            conn.close()
            return
        except Exception as exc:  # a stray or stalled connection: closed, and nothing else changes
            log.warning("XDB service: a connection failed its handshake: %r", exc)
            conn.close()
            return
        if first in (("stream",), ("stream", "owner")):
            self._serve_stream(Stream(conn, owner=first == ("stream", "owner")))
        else:
            self._serve_calls(conn, first)

    def committed(self, n: int) -> None:
        """The writer committed n rows (XDB's on_commit hook), the first n of its queue: each stream hears
        of its own at once."""
        credited: dict[Stream, None] = {}
        with self._counts:
            while n and self._queue:
                entry = self._queue[0]
                taken = min(n, entry[1])
                entry[0].committed += taken
                credited[entry[0]] = None
                entry[1] -= taken
                n -= taken
                if not entry[1]:
                    self._queue.popleft()
        if n:
            log.error("XDB service: the writer committed %d rows no stream had submitted", n)
        for stream in credited:
            stream.report()

    def _credit(self, stream: Stream, n: int) -> None:
        """Rows of `stream` counted as committed without the writer (already stored, or dropped)."""
        with self._counts:
            stream.committed += n
        stream.report()

    def _submit(self, stream: Stream, part: Part) -> None:
        """Hand a part to the writer, its rows recorded as the stream's in the writer's order (with
        `_submitting` held)."""
        assert self.xdb is not None and self.xdb.writer is not None
        with self._counts:
            self._queue.append([stream, len(part)])
        try:
            self.xdb.writer.submit(part, timeout=SUBMIT_TIMEOUT_S)
        except BaseException:
            with self._counts:  # never queued: it is the last entry, as no other submission came after it
                self._queue.pop()
            raise

    # -- rows ------------------------------------------------------------------------------------
    def _serve_stream(self, stream: Stream) -> None:
        with self._counts:
            if self._ending:
                stream.close()
                return
            self._streams.append(stream)
        try:
            self._take_rows(stream)
        except BaseException as exc:
            if not self._ending:
                log.exception("XDB service: taking a stream's rows failed; ending the service")
                self._failure = self._failure or exc
                self._ended.set()
            return
        if stream.owner:
            self._ended.set()  # its connection stays open: the last commits are reported on it
            return
        with self._counts:
            if stream in self._streams:
                self._streams.remove(stream)
        stream.close()  # what it had handed to the writer is committed all the same

    def _take_rows(self, stream: Stream) -> None:
        assert self.xdb is not None
        while True:
            try:
                message = stream.conn.recv()
            except (EOFError, OSError):
                return
            if message[0] == "rows":
                with self._gate.shared():  # a vacuum reopens XDB: the rows wait for it
                    for part in message[1]:
                        self._take_part(stream, part, message[2])
            elif message[0] == "flush":
                with self._gate.shared():
                    assert self.xdb.writer is not None
                    self.xdb.writer.request_flush()
            elif message[0] == "close":
                return

    def _take_part(self, stream: Stream, part: Part, resent: bool) -> None:
        with self._submitting:
            if resent:
                part = self._unstored(stream, part)
                if isinstance(part, TokenBatch):  # its activations went to the service that died
                    part.join_by = 0.0
                if len(part) and self.failure is not None and self.failure.holds(part):
                    self._suspect(stream, part)
                    return
            if len(part):
                self._submit(stream, part)

    def _suspect(self, stream: Stream, part: Part) -> None:
        """A part sent again that lies where the previous run's writer died (xdb/writer_failure.py): the row
        that killed it alone is dropped and the rest kept; a part that killed it alone is committed a row a
        batch; any other part in a batch of its own."""
        assert self.xdb is not None and self.xdb.writer is not None and self.failure is not None
        if self.failure.alone and self.failure.one_row:
            self._drop(stream, part, self.failure.spans)
            return
        pieces = rows_of(part) if self.failure.alone else [part]
        self.xdb.writer.flush()
        self._alone = True
        for piece in pieces:
            self._submit(stream, piece)
            self.xdb.writer.flush()
        self._alone = False

    def _drop(self, stream: Stream, part: Part, gone: tuple[PartSpan, ...]) -> None:
        assert self.xdb is not None and self.xdb.writer is not None
        kept = without(part, gone)
        dropped = len(part) - sum(len(p) for p in kept)
        log.error("XDB service: dropped %d row(s) (%s) that killed the writer twice, the second time alone; "
                  "kept the other %d of the part", dropped, list(gone), len(part) - dropped)
        self.xdb.audit_event("rows_dropped", {"reason": "the writer died storing them, twice, the second time alone",
                                              "rows": dropped, "spans": [list(span) for span in gone]})
        # Counted once the rows sent before them are committed: the stream's count never runs ahead of them.
        self.xdb.writer.flush()
        self._credit(stream, dropped)  # the server holds them until they are counted
        for piece in kept:
            self._submit(stream, piece)

    def writer_died(self) -> None:
        """The writer's `on_failure`: write down where its batch's rows sit (unless the disk failed: no
        row is to blame), and end this run at once (a service without a writer would accept rows it can
        never commit; the owner starts another). Every stream is told the exit code first."""
        assert self.xdb is not None and self.xdb.writer is not None
        if is_disk_fault(self.xdb.writer.error):
            log.error("XDB service: the disk failed under the writer (%r); exiting, nothing dropped",
                      self.xdb.writer.error)
            self._announce_exit(EXIT_DISK_FAULT)
            logging.shutdown()
            os._exit(EXIT_DISK_FAULT)
        failed = self.xdb.writer.failed_spans
        if failed:
            WriterFailure(tuple(failed), self._alone).write(self.xdb.data_dir)
        log.error("XDB service: the writer died; exiting so that the owner starts the service again")
        self._announce_exit(EXIT_WRITER_DIED)
        logging.shutdown()
        os._exit(EXIT_WRITER_DIED)

    def _announce_exit(self, code: int) -> None:
        with self._counts:
            streams = list(self._streams)
        for stream in streams:
            stream.announce_exit(code)

    def _unstored(self, stream: Stream, part: Part) -> Part:
        """A resent part without the rows the previous process had already committed, which are
        counted as committed now. Parts are committed in order, so those rows are its first ones."""
        assert self.xdb is not None
        session_id = part.session_id if isinstance(part, TokenBatch) else part[0].session_id
        ticks = [int(t) for t in part.ticks] if isinstance(part, TokenBatch) else [r.tick for r in part]
        if isinstance(part, list) and any(r.session_id != session_id for r in part):
            stored = sum(self._stored(r.session_id, r.tick, r.tick) for r in part)
        else:
            stored = self._stored(session_id, min(ticks), max(ticks))
        if not stored:
            return part
        self._credit(stream, stored)
        return part.slice(stored, len(part)) if isinstance(part, TokenBatch) else part[stored:]

    def _stored(self, session_id: str, first: int, last: int) -> int:
        assert self.xdb is not None
        with self.xdb.cursor() as cur:
            row = cur.execute("SELECT count(*) FROM timesteps WHERE session_id = ? AND tick BETWEEN ? AND ?",
                              [session_id, first, last]).fetchone()
        return int(row[0]) if row else 0

    # -- calls -----------------------------------------------------------------------------------
    def _serve_calls(self, conn: Connection, first: Any) -> None:
        with conn:
            message = first
            while True:
                name, args, kwargs = message
                try:
                    result = self._call(conn, name, args, kwargs)
                except Exception as exc:
                    conn.send(("error", portable(exc)))
                else:
                    conn.send(("ok", result))
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return

    def _call(self, conn: Connection, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name == "vacuum":
            return self.vacuum()
        if name not in METHODS:
            raise ValueError(f"the XDB service has no method {name!r}")
        kwargs = {key: _callback(conn, key) if value == CALLBACK else value for key, value in kwargs.items()}
        if name == "capture_activations":
            capture = (args[0], args[1], args[2]) if len(args) == 3 else (
                kwargs["address"], kwargs["k"], kwargs["wait_s"])
            if capture == self._capture and self.xdb is not None and self.xdb.activations_receiving():
                return None  # told again by another process after a restart: the channel stays bound
            self._capture = capture
        if name == "decode_tokens_with":
            self._tokenizer = args[0] if args else kwargs["tokenizer"]
        with self._gate.shared():
            return getattr(self.xdb, name)(*args, **kwargs)


def _callback(conn: Connection, name: str) -> Any:
    """A function that runs the caller's `name` argument in the caller's process."""
    def call(*args: Any) -> Any:
        conn.send(("callback", name, args))
        status, value = conn.recv()
        if status != "ok":
            raise RuntimeError(f"the server's {name} failed: {value}")
        return value
    return call
