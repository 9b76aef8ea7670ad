"""A warm start for servers: one process imports the server's modules once (torch, vLLM, the app: ~10 s of
CPU on a small machine) and forks each command started through it from itself, so a server's start costs a
fork instead of that import. The test suite starts dozens of servers, the benches and a local cluster several
at a time; each reaches the fork server whose socket AHC_FORK_SERVER names, where it is set.

A forked command runs as it would in a fresh interpreter: its own argv, environment, working directory and log on
stdout and stderr, its script or module as `__main__`, and an exit status its starter reads as subprocess.Popen's.
It is `ahc ...`, or `python -m MODULE ...` or `python SCRIPT ...` on the fork server's own interpreter (vLLM's
server, which the benches compare with, is one). What a fork cannot make the same, the fork server refuses, and the
starter runs the command itself: any other command, or an environment whose import-time settings (vLLM's, torch's,
OpenMP's, Python's ...: those the modules read as they were imported) differ from the fork server's.

    python -m server.cluster.fork_server SOCKET COMMAND [MODULE ...]    # serves until its parent exits

It listens before it imports, so a start asked for in the meantime waits for the imports rather than
running them a second time beside them.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

import setproctitle

ENV = "AHC_FORK_SERVER"
# Settings read as a module is imported, not when it is used: a child whose value differs would run with the
# fork server's.
IMPORT_TIME = ("VLLM_", "TORCH", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "HF_", "TRANSFORMERS_", "TOKENIZERS_",
               "PROMETHEUS_", "OTEL_", "TRITON_", "CUDA_", "PYTHON", "LD_", "MALLOC_", "PATH")
PRELOAD = ("ahc.cli.app", "server.app")  # what `ahc serve` imports
MESSAGE = 1 << 20  # the largest request: an environment of a few kB, well within it
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Preloaded:
    """What the fork server imported: `command`'s modules, on `python`, under `env` (as it started, before the
    imports set their own variables, as they do in a fresh process too)."""

    command: str
    python: str
    env: dict[str, str]


@dataclass(frozen=True)
class Job:
    """A command to run in a forked child."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    out: int  # stdout's fd
    err: int  # stderr's (the same one, or another)
    session: bool = False  # a session of its own (setsid), as Popen's start_new_session


def refusal(argv: Sequence[str], env: Mapping[str, str], server: Preloaded) -> str | None:
    """Why `argv` under `env` cannot be forked from this process, or None."""
    python = argv[:1] == [server.python] and len(argv) > 1 and (argv[1] == "-m" and len(argv) > 2
                                                                or not argv[1].startswith("-"))
    if not (argv[:1] == [server.command] or python):
        return f"neither {server.command} nor {server.python} with a module or a script: {argv[:2]}"
    differ = sorted(key for key in {*env, *server.env} if key.startswith(IMPORT_TIME)
                    and env.get(key) != server.env.get(key))
    return f"import-time settings differ: {', '.join(differ)}" if differ else None


def serve(listener: socket.socket, server: Preloaded, parent: int) -> Job | None:
    """Answer start requests on `listener` until `parent` exits. Returns in a forked child
    alone, with the job it is to run; None in the fork server once it stops."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below through the pipe
    running: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        ready, _, _ = select.select([listener.fileno(), wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        reap(running)
        if listener.fileno() not in ready:
            continue
        conn, _ = listener.accept()
        job = receive(conn, server)
        if job is None:
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for sock in (listener, conn, *running.values()):
                sock.close()
            os.close(wake_r)
            os.close(wake_w)
            return job
        os.close(job.out)
        os.close(job.err)
        conn.send(json.dumps({"pid": pid}).encode())
        running[pid] = conn
    for pid in running:
        os.kill(pid, signal.SIGKILL)
    return None


def receive(conn: socket.socket, server: Preloaded) -> Job | None:
    """The job a request asks for, or None once its refusal is sent."""
    data, fds, _, _ = socket.recv_fds(conn, MESSAGE, 2)
    request = json.loads(data)
    why = refusal(request["argv"], request["env"], server)
    if why is not None or len(fds) not in (1, 2):
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"refused": why or "no output files"}).encode())
        return None
    err = fds[-1] if len(fds) == 2 else os.dup(fds[0])
    return Job(request["argv"], request["env"], request["cwd"], fds[0], err, bool(request.get("session")))


def reap(running: dict[int, socket.socket]) -> None:
    """Tell each finished child's starter its exit status."""
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is None:
            continue
        try:
            conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
        except OSError:  # its starter is gone (its handle dropped): nobody is left to tell
            pass
        conn.close()


def run(job: Job) -> NoReturn:
    """In the child: become the command, as a fresh process would be, and exit with its status."""
    # What `ps` shows: the command, not the fork server (set while the environment is still the one
    # setproctitle found: it moves the environment's strings to make room).
    setproctitle.setproctitle(" ".join(job.argv))
    os.chdir(job.cwd)
    os.environ.clear()
    os.environ.update(job.env)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(job.out, 1)
    os.dup2(job.err, 2)
    os.close(job.out)
    os.close(job.err)
    if job.session:
        os.setsid()
    status = 0
    try:
        # sys.path[0] as the interpreter sets it: the working directory for `-m`, else the script's own
        # (`ahc`'s, or a Python script's after the interpreter).
        if job.argv[1:2] == ["-m"]:  # argv[0] becomes the module's file
            sys.path[0] = job.cwd
            sys.argv = [job.argv[0], *job.argv[3:]]
            runpy.run_module(job.argv[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = job.argv[1:] if job.argv[0] == sys.executable else list(job.argv)
            sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
            runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exit_:
        status = exit_status(exit_.code)
    except BaseException:  # as the interpreter reports an uncaught one
        traceback.print_exc()
        status = 1
    exit_forked(status)


def exit_status(code: object) -> int:
    """What the interpreter exits with for `sys.exit(code)` (a message is printed, and is a failure)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def exit_forked(status: int) -> NoReturn:
    """The interpreter's own shutdown (its threads joined, atexit's functions run, output flushed) short of
    the native libraries' static destructors: a library imported in the fork server started threads of its
    own there, which the child does not have, and C++ aborts destroying their handles ("terminate called
    without an active exception"). multiprocessing ends its forked children the same way."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx does first: wait for the non-daemon threads
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@dataclass
class ForkedProcess:
    """A command the fork server started, handled as subprocess.Popen handles its own child."""

    args: list[str]
    pid: int
    conn: socket.socket
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            self._read_exit()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_exit()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_exit(self) -> None:
        data = self.conn.recv(MESSAGE)
        self.conn.close()
        if not data:
            raise RuntimeError(f"the fork server stopped before process {self.pid} ended")
        self.returncode = int(json.loads(data)["exit"])


def start(path: str, argv: Sequence[str], out: IO[Any], cwd: Path | None, env: Mapping[str, str],
          err: IO[Any] | None = None, session: bool = False, timeout: float = 120) -> ForkedProcess | None:
    """`argv` forked by the fork server at `path`, its stdout to `out` and its stderr to `err` (else `out`
    too), in a session of its own with `session`; None where that server refuses it, is not there, or does
    not answer within `timeout` (its own imports included), so that the caller starts the command itself."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.settimeout(timeout)
    try:
        conn.connect(path)
        request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd or os.getcwd()), "session": session}
        fds = [out.fileno(), *([err.fileno()] if err is not None else [])]
        socket.send_fds(conn, [json.dumps(request).encode()], fds)
        reply = json.loads(conn.recv(MESSAGE) or b"{}")
    except OSError:  # no fork server there (any longer), or a hung one: the caller starts it
        conn.close()
        return None
    if "pid" not in reply:
        conn.close()
        return None
    conn.settimeout(None)
    return ForkedProcess(list(argv), int(reply["pid"]), conn)


def spawn(path: str, command: str, log: Path, env: Mapping[str, str], preload: Sequence[str] = PRELOAD
           ) -> subprocess.Popen[bytes]:
    """A fork server for `command` on the socket at `path`, under `env`, importing `preload`, once it listens
    (its imports go on behind); it stops when this process does."""
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "server.cluster.fork_server", path, command, *preload],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=dict(env))
    while not os.path.exists(path):
        if process.poll() is not None:
            raise RuntimeError(f"the fork server exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    return process


def main() -> None:
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)  # stop with whoever started it
    path, command, *preload = sys.argv[1:]
    server = Preloaded(command, sys.executable, dict(os.environ))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    for module in preload:
        __import__(module)
    job = serve(listener, server, parent)
    if job is None:
        listener.close()
        os.unlink(path)
        return
    run(job)


if __name__ == "__main__":
    main()
