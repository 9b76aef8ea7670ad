"""Plug-ins from a separate package (tests/plugins/ahc-test-plugins), installed as a deployment installs one
(pip, into a directory of its own, not the shared environment) and found through its entry points: a formatter
chosen per request, formatters that fail to load, and an artifact injector enabled by the configuration,
through AHC's whole app on the fake engine."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from chat_bodies import chat
from fake_app import serving
from fastapi.testclient import TestClient
from vllm.config import VllmConfig

from core.config import AHCConfig
from orchestrator.formatters import FormatterRegistry
from orchestrator.injectors import Injectors
from server.runtime import Runtime

pytestmark = pytest.mark.process  # pip builds and installs the package

PACKAGE = Path(__file__).parent / "plugins" / "ahc-test-plugins"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built and installed into a directory of its own (a copy of its source is built, so the
    build leaves nothing in the repository; setuptools is the environment's, so no network is needed)."""
    root = tmp_path_factory.mktemp("plugins")
    shutil.copytree(PACKAGE, root / "src")
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(target), str(root / "src")], check=True)
    assert (target / "ahc_test_plugins").is_dir()
    return target


@pytest.fixture
def on_path(installed: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The install directory on sys.path, where importlib.metadata finds its entry points."""
    monkeypatch.syspath_prepend(str(installed))
    return installed


@pytest.fixture
def plugged(on_path: Path, config: AHCConfig, vllm_config: VllmConfig,
            tmp_path: Path) -> Iterator[tuple[TestClient, Runtime]]:
    with serving(config, vllm_config, tmp_path) as app:
        yield app


def last_prompt(runtime: Runtime) -> str:
    request = runtime.hidden.engine.requests[-1]  # type: ignore[attr-defined]
    return str(runtime.hidden.engine.get_tokenizer().decode(request.prompt_token_ids))  # type: ignore[attr-defined]


def test_a_request_names_the_plugin_formatter_and_gets_its_blocks(plugged: tuple[TestClient, Runtime]) -> None:
    client, runtime = plugged
    body = chat("s1", context={"formatter": "bracket", "codex": [{"id": "physics", "text": "F = ma."}],
                               "karma": [{"id": "k1", "text": "A moves right."}]})
    done = client.post("/v1/chat/completions", json=body)
    assert done.status_code == 200, done.text
    prompt = last_prompt(runtime)
    assert "[[codex physics]]\nF = ma." in prompt and "[[fact k1]] A moves right." in prompt
    plain = client.post("/v1/chat/completions", json=chat("s2", context={"codex": [{"id": "physics",
                                                                                   "text": "F = ma."}]}))
    assert plain.status_code == 200 and "[[codex" not in last_prompt(runtime)


def test_an_unknown_formatter_is_a_400_naming_it(plugged: tuple[TestClient, Runtime]) -> None:
    client, _ = plugged
    refused = client.post("/v1/chat/completions", json=chat("s1", context={"formatter": "brackett"}))
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "context.formatter" and "'brackett'" in error["message"]
    assert "bracket" in error["message"]  # the known ones, the plug-in among them


@pytest.mark.parametrize(("name", "reason"), [
    ("raising", "RuntimeError: the formatter's template is missing"),
    ("not_a_formatter", "not a Formatter (no identity, codex, karma, query method)"),
])
def test_a_broken_plugin_is_reported_at_load_and_named_by_a_request(
        plugged: tuple[TestClient, Runtime], on_path: Path, name: str, reason: str) -> None:
    assert reason in FormatterRegistry().broken[name]  # at load
    client, _ = plugged
    refused = client.post("/v1/chat/completions", json=chat("s1", context={"formatter": name}))
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert f"plug-in {name!r} failed to load" in message and reason in message
    assert f"ahc_test_plugins.broken:{name}" in message  # the entry point it came from


def test_a_configured_formatter_or_injector_that_cannot_load_stops_the_start(
        on_path: Path, config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"orchestrator.formatter: formatter plug-in 'raising' failed to load"):
        with serving(config, vllm_config, tmp_path / "a", **{"orchestrator.formatter": "raising"}):
            pass
    with pytest.raises(ValueError, match=r"no injector 'editor' .* \(known: workspace\)"):
        Injectors(["editor"])


def workspace_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    """The file the test plug-ins' `workspace` injector reads (AHC_TEST_WORKSPACE), holding `text`."""
    edited = tmp_path / "main.py"
    edited.write_text(text)
    monkeypatch.setenv("AHC_TEST_WORKSPACE", str(edited))
    return edited


def test_the_injected_artifact_is_in_the_codex_and_the_prefix_holds_while_it_is_unchanged(
        on_path: Path, config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    edited = workspace_file(tmp_path, monkeypatch, "def step(x):\n    return x + 1\n")
    own = {"codex": [{"id": "physics", "text": "F = ma."}]}
    with serving(config, vllm_config, tmp_path / "app", **{"orchestrator.injectors": ["workspace"]}) as (client,
                                                                                                        runtime):
        first = client.post("/v1/chat/completions", json=chat("s1", context=own))
        assert first.status_code == 200, first.text
        prompt = last_prompt(runtime)
        # After the request's own document, in the Codex block, ahead of the Karma and the State.
        assert prompt.index("## physics") < prompt.index("## workspace/main.py\ndef step(x):") < prompt.index(
            "[workspace-session] Editing for session s1.")
        codex = {b["name"]: b["sha256"] for b in first.json()["context"]["blocks"]}["codex"]

        second = client.post("/v1/chat/completions", json=chat("s1", "And then?", context=own)).json()["context"]
        assert second["first_changed_block"] == "state"
        assert {b["name"]: b["sha256"] for b in second["blocks"]}["codex"] == codex

        edited.write_text("def step(x):\n    return x + 2\n")
        third = client.post("/v1/chat/completions", json=chat("s1", "Now?", context=own)).json()["context"]
        assert third["first_changed_block"] == "codex" and "return x + 2" in last_prompt(runtime)


def test_no_injector_runs_unless_configured(plugged: tuple[TestClient, Runtime], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    workspace_file(tmp_path, monkeypatch, "secret = 1\n")
    client, runtime = plugged
    assert client.post("/v1/chat/completions", json=chat("s1")).status_code == 200
    assert "secret = 1" not in last_prompt(runtime) and runtime.orchestrator.injectors.chosen == []


def test_an_injected_id_a_request_already_uses_is_a_400(
        on_path: Path, config: AHCConfig, vllm_config: VllmConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    workspace_file(tmp_path, monkeypatch, "x = 1\n")
    clash = {"codex": [{"id": "workspace/main.py", "text": "an older copy"}]}
    with serving(config, vllm_config, tmp_path / "app", **{"orchestrator.injectors": ["workspace"]}) as (client, _):
        refused = client.post("/v1/chat/completions", json=chat("s1", context=clash))
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "context.codex" and "'workspace/main.py' is also injected by 'workspace'" in (
            error["message"])
