"""The fork server (server/cluster/fork_server.py): commands forked from it run as fresh processes would, their
status read as subprocess.Popen reads its child's, and what it cannot fork the same it refuses. Its own
imports are left out here (the suite's `ahc serve` starts use the whole set)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.cluster import fork_server
from server.cluster.fork_server import ForkedProcess
from server.cluster.server_process import AHC, child_env

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def socket_path() -> Iterator[str]:
    where = Path(tempfile.mkdtemp(prefix="ahc-fork-test-"))
    path = str(where / "socket")
    process = fork_server.spawn(path, AHC, where / "fork-server.log", child_env(), preload=())
    yield path
    process.terminate()
    process.wait(30)


def start(path: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> ForkedProcess | None:
    with log.open("w") as out:
        return fork_server.start(path, argv, out, Path.cwd(), {**child_env(), **(env or {})})


def test_an_ahc_command_runs_forked_with_its_output_and_status(socket_path: str, tmp_path: Path) -> None:
    done = start(socket_path, [AHC, "--version"], tmp_path / "out")
    assert done is not None and done.pid != os.getpid()
    assert done.wait(60) == 0
    assert (tmp_path / "out").read_text().startswith("ahc ")
    failed = start(socket_path, [AHC, "no-such-command"], tmp_path / "err")
    assert failed is not None and failed.wait(60) == 2  # click's usage error, as a fresh `ahc` exits
    assert "no-such-command" in (tmp_path / "err").read_text()


def test_a_module_runs_as_python_m_runs_it_in_its_environment_and_directory(socket_path: str,
                                                                            tmp_path: Path) -> None:
    script = ("import os, sys; print(__name__, sys.argv[1:], os.getcwd(), os.environ['AHC_PROBE']);"
              "sys.exit(3)")
    (tmp_path / "probe.py").write_text(script)
    argv = [sys.executable, "-m", "probe", "a", "b"]
    with (tmp_path / "out").open("w") as out:
        done = fork_server.start(socket_path, argv, out, tmp_path,
                                 {**child_env(), "AHC_PROBE": "yes", "PYTHONPATH": child_env()["PYTHONPATH"]})
    # The module is looked up from the child's directory, as `python -m` looks it up from its own.
    assert done is not None and done.wait(60) == 3
    assert (tmp_path / "out").read_text().split() == ["__main__", "['a',", "'b']", str(tmp_path), "yes"]


def test_a_signal_ends_it_as_it_ends_a_popen_child_and_wait_times_out(socket_path: str, tmp_path: Path) -> None:
    forever = start(socket_path, [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], tmp_path / "out")
    assert forever is not None
    with pytest.raises(subprocess.TimeoutExpired):
        forever.wait(0.2)
    assert forever.poll() is None
    forever.terminate()
    assert forever.wait(30) == -signal.SIGTERM
    assert forever.poll() == -signal.SIGTERM
    forever.kill()  # a process already ended: nothing to signal


def test_what_a_fork_would_not_run_the_same_is_refused(socket_path: str, tmp_path: Path) -> None:
    assert start(socket_path, ["/bin/echo", "hi"], tmp_path / "out") is None
    # vLLM and torch read these as they are imported: the fork server's copies would run with its own.
    assert start(socket_path, [AHC, "--version"], tmp_path / "out", {"VLLM_CPU_KVCACHE_SPACE": "7"}) is None
    assert start(socket_path, [AHC, "--version"], tmp_path / "out", {"OMP_NUM_THREADS": "7"}) is None
    # Settings read when used (the server's own) fork as they are.
    done = start(socket_path, [AHC, "--version"], tmp_path / "out", {"AHC_ENGINE__SHUTDOWN_TIMEOUT": "7"})
    assert done is not None and done.wait(60) == 0


def test_no_fork_server_there_means_the_caller_starts_it(tmp_path: Path) -> None:
    assert start(str(tmp_path / "nobody"), [AHC, "--version"], tmp_path / "out") is None


def test_it_stops_with_the_process_that_started_it(tmp_path: Path) -> None:
    path = str(tmp_path / "socket")
    code = (f"from pathlib import Path; from server.cluster import fork_server; "
            f"print(fork_server.spawn({path!r}, {AHC!r}, Path({str(tmp_path / 'log')!r}), __import__('os').environ, "
            f"preload=()).pid, flush=True)")
    starter = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60)
    assert starter.returncode == 0, starter.stderr
    pid = int(starter.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    assert not alive(pid)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
