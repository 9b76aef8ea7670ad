"""At a cancelled shutdown vLLM's launcher names the process holding the port by its command line; a child
that has just exited (a zombie, not reaped yet) must read as no process rather than raise, or a server that
drained cleanly exits 1."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from server.api_process import live_process_using_port


@pytest.mark.process
def test_a_zombie_holding_the_port_is_no_process_to_name() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    zombie = psutil.Process(child.pid)
    deadline = time.monotonic() + 30
    while zombie.status() != psutil.STATUS_ZOMBIE:  # exited, and not reaped: Popen waits only when asked
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert live_process_using_port(lambda port: zombie, 8000) is None
    child.wait()
    assert live_process_using_port(lambda port: None, 8000) is None
    me = live_process_using_port(lambda port: psutil.Process(os.getpid()), 8000)
    assert me is not None and me.pid == os.getpid()
