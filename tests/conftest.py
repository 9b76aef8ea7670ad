"""Fixtures: one real `ahc serve` (vLLM CPU engine, tiny model) per test session, reached over real HTTP.
Helpers that start servers live in bench/servers.py, shared with the benchmarks."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings
from postgres import lake, pg  # noqa: F401 - fixtures, for every module

from bench.servers import REAL_CONFIG, REAL_MODEL, TINY_MODEL, start_server
from core.config import AHCConfig, load_config
from server.cluster import fork_server
from server.cluster.server_process import AHC, ServerProcess, child_env

if TYPE_CHECKING:
    # Annotations only: vLLM's import takes seconds, paid by xdist's controller too, which runs no test.
    import openai
    from fastapi.testclient import TestClient
    from vllm.config import VllmConfig

    from orchestrator.token_counter import TokenCounter
    from server.runtime import Runtime
    from xdb import XDB

API_KEY = "test-key"

# How much the property-based tests (Hypothesis) generate, chosen with Hypothesis's own option
# `--hypothesis-profile`: `ci` (the default, `make test`) a few examples each, the same ones every run;
# `deep` (`make test-deep`) ten times as many, new ones every run (a failure prints its shrunk example).
# `max_examples` is what the widest operation gets; the others a share of it.
settings.register_profile("ci", max_examples=30, derandomize=True, database=None, deadline=None)
settings.register_profile("deep", max_examples=300, database=None, deadline=None)
settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    # Inherited by every subprocess a test starts: `ahc ...` runs this checkout's code even when the
    # installed `ahc` is an editable install of another checkout, and each server gets 1 GiB of KV
    # cache whatever the shell says (several run side by side on a small machine).
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    # The model runs inside the engine core's process, as vLLM runs one device on a GPU, not in a worker
    # process of its own (vLLM's multiprocess executor, which `ahc serve` forks on a small machine): the
    # engine core and its worker each poll their shared-memory queue, and with ~35 engines started on two
    # cores the suite took 2 minutes longer that way (22.8 minutes against 21).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM's CPU worker binds its compute to a core of its choosing, the same one for every engine: under
    # xdist each worker's engines get a core of their own instead, so two workers' engines do not share one
    # while another core idles.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        cores = sorted(os.sched_getaffinity(0))
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[int(worker[2:]) % len(cores)])
        one_thread_each()


def one_thread_each() -> None:
    """Under xdist every worker, and every process it starts, computes on one thread. Torch's OpenMP pool
    otherwise takes a thread per core in each of them, and its threads spin at each barrier for a core the
    other worker holds: the real model's lens check took 160 s beside a second copy of itself, 40 s with
    one thread each."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[name] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


# The servers this session shares: each started when a test first needs it and stopped once the tests
# that use it are done (they run together), so a worker holds only the servers of the tests in hand.
SESSION_SERVERS = ("real_server", "server")
# The tests make test starts before the others: those that run an engine, and the long ones (pyproject.toml's
# markers). Those of one module that share a module-scoped fixture (its own server, a built wheel) run
# together on one worker.
EARLY_MARKERS = ("engine", "real_model", "slow")
# Fixtures that start a process (tests/postgres.py's PostgreSQL; vllm-router and its workers in
# tests/test_router.py and tests/test_router_guard.py, or a local cluster in tests/test_cluster.py; Chromium in
# tests/test_ui_browser.py): a test using one is marked `process`, whichever test happens to start it.
PROCESS_FIXTURES = frozenset({"pg", "lake", "cluster", "guarded", "browser"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs on xdist workers (`--dist loadgroup`). The tests of one shared server form one group,
    as do those of a module that starts a server of its own (module-scoped), so that each server starts
    once; the groups run first, longest kinds first, and the engine-free tests fill in after them."""
    ranked: list[tuple[int, str, pytest.Item]] = []
    for item in items:
        if PROCESS_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.process)
        group, rank = engine_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        ranked.append((rank, group or "", item))
    # Stable: collection order within a group, and each group's tests together in a run without xdist too.
    items[:] = [item for _, _, item in sorted(ranked, key=lambda entry: entry[:2])]


def pytest_collection_finish(session: pytest.Session) -> None:
    """A session with engine tests starts `ahc serve` through a fork server of its own. Under `--dist
    loadgroup` each grouped test's id must carry its group, which is how xdist keeps a group on one worker;
    a pytest that xdist cannot extend ids of would start every server once per worker, silently."""
    if any(item.get_closest_marker("engine") for item in session.items):
        start_fork_server(session.config)
    freeze_the_imports()
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        group = item.get_closest_marker("xdist_group")
        if group is not None and not item.nodeid.endswith(f"@{group.args[0]}"):
            raise pytest.UsageError(f"{item.nodeid}: xdist did not put it in its group {group.args[0]!r} "
                                    "(pytest and pytest-xdist versions that do not work together)")


def freeze_the_imports() -> None:
    """What collection imported (torch, vLLM, transformers: some 800k objects) is kept out of every later
    garbage collection, as vLLM's server freezes its start-up heap: pytest's own collections at the end
    (gc_collect_harder) took 4 s a worker over it, and each app test froze and unfroze the whole heap."""
    gc.collect()
    gc.freeze()


FORK_SERVER = pytest.StashKey[subprocess.Popen[bytes]]()


def start_fork_server(config: pytest.Config) -> None:
    """The suite starts some 60 servers, each importing torch, vLLM and the app afresh (~10 s of CPU here):
    forked from one process that imported them once, a start takes the engine's own set-up alone. Every
    process of the session (a bench's too) reaches it through AHC_FORK_SERVER."""
    where = Path(tempfile.mkdtemp(prefix="ahc-fork-"))
    config.stash[FORK_SERVER] = fork_server.spawn(str(where / "socket"), AHC, where / "fork-server.log", os.environ)
    os.environ[fork_server.ENV] = str(where / "socket")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # After pytest's own last collections (cheap on the frozen heap), so that the interpreter's teardown
    # collects the imports' cycles: left frozen, triton's extension types outlive it and nanobind prints a
    # page of "leaked" lines at exit.
    gc.unfreeze()
    process = config.stash.get(FORK_SERVER, None)
    if process is not None:
        process.terminate()
        process.wait()


def engine_group(item: pytest.Item) -> tuple[str | None, int]:
    """The group an item runs in and its rank: a shared server's (0), its module's fixture's (1), an engine
    or long test on its own (2), any other test (3)."""
    for name in SESSION_SERVERS:
        if name in item.fixturenames:
            return name, 0
    if not any(item.get_closest_marker(marker) for marker in EARLY_MARKERS):
        return None, 3
    if isinstance(item, pytest.Function) and any(
            defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values()):
        return item.module.__name__, 1
    return None, 2


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A shared server the next test does not use is stopped now, with what was built on it (its clients,
    module fixtures reading it), rather than at the end of the session; a later test that needs it again
    starts it again."""
    if nextitem is None or not isinstance(item, pytest.Function):
        return
    for name in SESSION_SERVERS:
        if name in item.fixturenames and name not in nextitem.fixturenames:
            for fixturedef in item._fixtureinfo.name2fixturedefs[name]:
                fixturedef.finish(item._request)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    if not (TINY_MODEL / "config.json").exists():
        raise RuntimeError("the tiny model is missing: run `make setup` first")
    srv = start_server(tmp_path_factory.mktemp("serve") / "xdb", api_key=API_KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory):
    """One `ahc serve` of the real model (SmolLM2-135M-Instruct, its lens on) per test session: the
    real-model tier (marker `real_model`)."""
    if not (REAL_MODEL / "config.json").exists():
        raise RuntimeError("the real model is missing: run `make setup` (ahc model pull smollm2-135m)")
    srv = start_server(tmp_path_factory.mktemp("serve-real") / "xdb", model=REAL_MODEL, config=REAL_CONFIG,
                       api_key=API_KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def real_client(real_server: ServerProcess) -> openai.OpenAI:
    return real_server.client(timeout=300)


@pytest.fixture(scope="session")
def real_no_whitespace_bias() -> dict[str, int]:
    """The real model pretty-prints tool-call JSON (four spaces a level, a token each); banning
    whitespace-only tokens halves a call's tokens where a test only needs it parsed."""
    return whitespace_bias(REAL_MODEL)


@pytest.fixture(scope="session")
def real_model_name(real_client: openai.OpenAI) -> str:
    return real_client.models.list().data[0].id


@pytest.fixture(scope="session")
def model_name(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def no_whitespace_bias() -> dict[str, int]:
    """logit_bias banning whitespace-only tokens. A random model pads tool-call JSON with every space
    the grammar allows (vLLM's tool structural tags allow any); the tests check plumbing, not style."""
    return whitespace_bias(TINY_MODEL)


def whitespace_bias(model: Path) -> dict[str, int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return {str(i): -100 for i in range(len(tokenizer))
            if (text := tokenizer.decode([i])) and not text.strip()}


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny model's tokenizer and chat template, trained in memory (milliseconds, no weights), so
    the engine-free tests need no `make setup`. The same files `ahc tiny-model` writes."""
    from ahc.cli.tiny_model import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def counter(tokenizer) -> TokenCounter:  # type: ignore[no-untyped-def]
    """The orchestrator's token counter over the tiny model's tokenizer."""
    from orchestrator.token_counter import TokenCounter

    return TokenCounter(lambda text: tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on disk: `make setup`'s copy, else one built for this session (seconds)."""
    if (TINY_MODEL / "model.safetensors").is_file():
        return TINY_MODEL
    from ahc.cli.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(scope="session")
def heap_frozen_once() -> Iterator[None]:
    """The fake-engine app's lifespan would freeze the heap (vLLM's freeze_gc_heap, as `ahc serve` does once),
    after a full collection of the whole test worker's heap: most of an app test's set-up time, and each
    test's objects frozen with it. The worker froze its imports once after collection (freeze_the_imports);
    an app's start leaves the heap as it is. `ahc serve` itself (engine tests) is unchanged."""
    from vllm.entrypoints.launchers.utils import server_utils

    freeze = server_utils.freeze_gc_heap
    server_utils.freeze_gc_heap = lambda: None
    yield
    server_utils.freeze_gc_heap = freeze


@pytest.fixture(scope="session")
def config(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AHCConfig:
    """cpu-tiny.yaml on the tiny model, lens off: the AHC config of the fake-engine app tests."""
    data_dir = tmp_path_factory.mktemp("fake-app") / "xdb"
    return load_config("cpu-tiny").with_overrides(
        model=str(tiny_model_dir), data_dir=str(data_dir), **{"lens.enabled": False})


@pytest.fixture
def served(config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path) -> Iterator[tuple[TestClient, Runtime]]:
    """AHC's whole app on the fake engine, no API key (tests/fake_app.py)."""
    from fake_app import serving

    with serving(config, vllm_config, tmp_path) as app:
        yield app


@pytest.fixture
def xdb(tmp_path: Path) -> Iterator[XDB]:
    """An empty experience database of the test's own."""
    from empty_xdb import empty_xdb

    with empty_xdb(tmp_path / "xdb") as db:
        yield db


@pytest.fixture
def two_tenants(config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path) -> Iterator[tuple[TestClient, Runtime]]:
    """AHC's whole app on the fake engine with two keys, ALICE's and BOB's (tests/fake_app.py)."""
    from fake_app import ALICE, BOB, serving

    with serving(config, vllm_config, tmp_path, api_key=[ALICE, BOB]) as served:
        yield served


@pytest.fixture
def audited(config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path) -> Iterator[tuple[TestClient, Runtime]]:
    """The `two_tenants` app from a keys file that also names an auditor, CAROL (tests/fake_app.py)."""
    from fake_app import ALICE, BOB, CAROL, serving

    keys = tmp_path / "keys"
    keys.write_text(f"alice:{ALICE}\nbob:{BOB}\nauditor carol:{CAROL}\n")
    keys.chmod(0o600)
    with serving(config, vllm_config, tmp_path, api_keys_file=str(keys)) as served:
        yield served


@pytest.fixture(scope="session")
def vllm_config(config: AHCConfig, heap_frozen_once: None) -> VllmConfig:
    """vLLM's engine config for `config` (seconds, once a session); starts no engine."""
    from fake_engine import engine_config

    from server.engine_args import build_vllm_namespace

    return engine_config(build_vllm_namespace(config))
