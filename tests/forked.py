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
from typing import IO

from server.cluster.server_process import start_process


def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` under os.environ plus `env`; past `timeout` it and every process it started are killed and
    subprocess.TimeoutExpired is raised with what they had written."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = start_process(argv, out, env, err=err, session=True)
        try:
            code = process.wait(timeout)
        except BaseException as stopped:  # its time ran out, or the test was interrupted: none of it is left
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if isinstance(stopped, subprocess.TimeoutExpired):
                raise subprocess.TimeoutExpired(list(argv), timeout, read(out), read(err)) from None
            raise
        return subprocess.CompletedProcess(list(argv), code, read(out), read(err))


def read(file: IO[str]) -> str:
    file.seek(0)
    return file.read()
