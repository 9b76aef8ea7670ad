"""A command run to its end with its output captured, as subprocess.run(capture_output=True, text=True) runs it,
in a session of its own: forked by the session's fork server (server/cluster/fork_server.py) where there is
one and it takes the command, else started afresh. For the tests' Python commands that import vLLM (a bench,
an engine script), whose imports are most of their start."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from core.config import CHECKOUT
from server.cluster import fork_server
from server.cluster.fork_server import ForkedProcess
from server.cluster.server_process import child_env


def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` under os.environ plus `env`; past `timeout` it and every process it started are killed and
    subprocess.TimeoutExpired is raised with what they had written."""
    merged = child_env(env)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        path = os.environ.get(fork_server.ENV)
        process: subprocess.Popen[bytes] | ForkedProcess | None = (
            fork_server.start(path, argv, out, cwd or CHECKOUT, merged, err=err, session=True) if path else None)
        if process is None:
            process = subprocess.Popen(list(argv), stdout=out, stderr=err, cwd=cwd or CHECKOUT, env=merged,
                                       start_new_session=True)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise subprocess.TimeoutExpired(list(argv), timeout, read(out), read(err)) from None
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            raise
        return subprocess.CompletedProcess(list(argv), code, read(out), read(err))


def read(file: IO[str]) -> str:
    file.seek(0)
    return file.read()
