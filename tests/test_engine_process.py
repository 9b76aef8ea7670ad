"""How `ahc serve` starts vLLM's engine process (server/engine_process.py): forked on the CPU, with what
the engine starts in turn spawned again. The engine itself is exercised by every server test; its death
with a killed server by tests/test_serve_xdb.py."""

from __future__ import annotations

import os

import pytest

from server.engine_process import SPAWN_AFTER_FORK, START_METHOD, after_fork_in_child, forked_engine


@pytest.fixture
def start_method(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(START_METHOD, "spawn")  # what vLLM's CPU platform sets
    monkeypatch.delenv(SPAWN_AFTER_FORK, raising=False)


def test_on_the_cpu_the_engine_is_forked_and_the_setting_restored(start_method: None) -> None:
    with forked_engine(on_cpu=True):
        assert os.environ[START_METHOD] == "fork"
    assert os.environ[START_METHOD] == "spawn"
    assert SPAWN_AFTER_FORK not in os.environ


def test_elsewhere_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(START_METHOD, "fork")  # vLLM's own default on a GPU
    with forked_engine(on_cpu=False):
        assert os.environ[START_METHOD] == "fork" and SPAWN_AFTER_FORK not in os.environ
    assert os.environ[START_METHOD] == "fork"


@pytest.mark.process
def test_the_forked_engine_spawns_its_own_children(start_method: None) -> None:
    read, write = os.pipe()
    with forked_engine(on_cpu=True):
        pid = os.fork()
        if pid == 0:  # the child: what the at-fork handler `mark_server` registers does
            after_fork_in_child()
            os.write(write, os.environ.get(START_METHOD, "").encode())
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"spawn"
    os.close(read)
