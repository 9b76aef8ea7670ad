"""How `ahc serve` starts vLLM's engine process (server/engine_process.py): forked on the CPU, with the
workers the engine starts in turn spawned again unless each runs on one CPU. The engine itself is exercised
by every server test (with the model in the engine core's process: tests/conftest.py); its death with a
killed server by tests/test_serve_xdb.py."""

from __future__ import annotations

import os

import pytest

from server.engine_process import (
    SPAWN_AFTER_FORK,
    START_METHOD,
    after_fork_in_child,
    forked_engine,
    workers_on_one_cpu,
)


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


def start_method_in_a_child() -> str:
    """What a child forked now, as the engine core is, starts its own children with."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what the at-fork handler `mark_server` registers does
        after_fork_in_child()
        os.write(write, os.environ.get(START_METHOD, "").encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    method = os.read(read, 16).decode()
    os.close(read)
    return method


@pytest.mark.process
@pytest.mark.parametrize("fork_workers, method", [(False, "spawn"), (True, "fork")])
def test_the_forked_engine_forks_its_workers_only_when_asked(start_method: None, fork_workers: bool,
                                                             method: str) -> None:
    with forked_engine(on_cpu=True, fork_workers=fork_workers):
        assert start_method_in_a_child() == method
    assert os.environ[START_METHOD] == "spawn" and SPAWN_AFTER_FORK not in os.environ


@pytest.mark.parametrize("bind, one_cpu", [("0", True), ("1", True), ("0-1", False), ("0,1", False),
                                           ("nobind", False)])
def test_workers_are_on_one_cpu_as_vllm_binds_them(vllm_config, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                   bind: str, one_cpu: bool) -> None:
    """vLLM's own binding decides: one CPU list of one CPU (the tests' servers, each on its worker's core)
    forks the worker; several CPUs, or no binding at all (the worker's threads on every CPU), spawn it."""
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", bind)
    assert workers_on_one_cpu(vllm_config) is one_cpu
