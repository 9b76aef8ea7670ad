"""Claude Code, Codex CLI and opencode, the npm packages pinned in tests/clients (installed by `make clients`), against
`ahc serve` as their users run them: two turns each, the second continuing the first (`claude -p
--continue`, `codex exec resume --last`). Each lands in one session named by the client's own session id,
its input rows hold what the user typed, both turns have turn records, and the second turn reads the
first turn's prompt from the prefix cache. And against vLLM's own server on the same engine: the same
request becomes the same prompt on both (AHC adds nothing to what these clients send).

Their prompts are ~20k tokens (their system prompts and tool lists), which the small real model's 8k
window cannot take and 2 cores would prefill for minutes: the servers run the emulated engine, whose
replies are drawn tokens that end (an EOS after a drawn length), so each client finishes its turns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from required import missing

from bench.serve import start_vllm
from bench.servers import recall, start_server
from server.cluster.server_process import ServerProcess

pytestmark = pytest.mark.engine

CLIENTS = Path(__file__).resolve().parents[1] / ".cache" / "clients" / "node_modules" / ".bin"
KEY, MODEL = "sk-agent-clis", "tiny"
EMULATED = ["--emulate", "h100-llama-8b", "--emulate-reply-tokens", "24", "--max-model-len", "65536"]
TIMEOUT_S = 240
Client = Callable[[ServerProcess, Path], tuple[Path, dict[str, str]]]  # (its binary, its environment)


def require_cli(name: str) -> Path:
    path = CLIENTS / name
    if path.exists():
        return path
    message = f"{name} is not installed under {CLIENTS} (`make clients` installs it with npm)"
    missing(message)


@pytest.fixture(scope="module")
def emulated_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    served = start_server(tmp_path_factory.mktemp("agent-clis") / "xdb", model=tiny_model_dir, lens="off",
                          api_key=KEY, extra=[*EMULATED, "--served-model-name", MODEL])
    try:
        yield served
    finally:
        served.stop()


def claude(server: ServerProcess, home: Path) -> tuple[Path, dict[str, str]]:
    return require_cli("claude"), {
        "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_AUTH_TOKEN": server.api_key or "none",
        "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "MAX_THINKING_TOKENS": "0", "HOME": str(home), "DISABLE_AUTOUPDATER": "1"}


def codex(server: ServerProcess, home: Path) -> tuple[Path, dict[str, str]]:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(f'''model = "{MODEL}"
model_provider = "local"

[model_providers.local]
name = "local"
base_url = "{server.base_url}/v1"
wire_api = "responses"
env_key = "LOCAL_TEST_KEY"
''')
    return require_cli("codex"), {"CODEX_HOME": str(codex_home), "LOCAL_TEST_KEY": server.api_key or "none",
                                  "HOME": str(home)}


def opencode(server: ServerProcess, home: Path) -> tuple[Path, dict[str, str]]:
    """opencode with AHC as a custom OpenAI-compatible provider (its config in the project it works in)."""
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "AHC", "models": {MODEL: {"name": MODEL}},
                "options": {"baseURL": f"{server.base_url}/v1", "apiKey": server.api_key or "none"}}
    config = {"provider": {"ahc": provider}, "model": f"ahc/{MODEL}", "small_model": f"ahc/{MODEL}",
              "autoupdate": False, "share": "disabled"}
    home.mkdir(parents=True, exist_ok=True)
    (home / "opencode.json").write_text(json.dumps(config))
    return require_cli("opencode"), {"HOME": str(home), "OPENCODE_CONFIG": str(home / "opencode.json")}


def run(client: tuple[Path, dict[str, str]], *args: str, cwd: Path) -> str:
    cli, env = client
    done = subprocess.run([str(cli), *args], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{cli.name} {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


FIRST_TURN = {"codex": ["exec", "--skip-git-repo-check"], "claude": ["-p"], "opencode": ["run"]}
NEXT_TURN = {"codex": ["exec", "--skip-git-repo-check", "resume", "--last"], "claude": ["-p", "--continue"],
             "opencode": ["run", "--continue"]}


def first_turn(client: tuple[Path, dict[str, str]], question: str, cwd: Path) -> str:
    return run(client, *FIRST_TURN[client[0].name], question, cwd=cwd)


def next_turn(client: tuple[Path, dict[str, str]], question: str, cwd: Path) -> str:
    return run(client, *NEXT_TURN[client[0].name], question, cwd=cwd)


def workspace(root: Path) -> Path:
    """The project a client works in: its path is part of the client's prompt."""
    work = root / "work"
    work.mkdir(parents=True)
    (work / "README.md").write_text("# A small project\n")
    (work / "main.py").write_text("print('hello')\n")
    return work


def typed_session(server: ServerProcess, first: str, second: str) -> tuple[str, list[dict[str, Any]]]:
    """The one session whose user inputs hold both typed texts, and its turn records."""
    rows = recall(server, event_types="input", text=first) + recall(server, event_types="input", text=second)
    typed = {(r["session_id"], r["content"]) for r in rows if r["role"] == "user"}
    sessions = {s for s, content in typed if first in content} & {s for s, content in typed if second in content}
    assert len(sessions) == 1, f"the two turns are not one session: {sorted(typed)}"
    session = sessions.pop()
    deadline = time.monotonic() + 5  # a turn's record is queryable within a second of its response
    while True:
        records = [r["metadata"]["turn"] for r in recall(server, session_id=session, event_types="system")
                   if "turn" in (r["metadata"] or {})]
        if len(records) >= 2 or time.monotonic() > deadline:
            return session, records
        time.sleep(0.1)


def check_two_turns(records: list[dict[str, Any]]) -> None:
    """Both turns recorded with their prompt and cached tokens; the second reads the first's prompt."""
    assert len(records) >= 2, records
    first, second = records[-2], records[-1]
    assert first["prompt_tokens"] > 5_000 and second["prompt_tokens"] > first["prompt_tokens"]
    assert second["cached_tokens"] >= 0.9 * first["prompt_tokens"], (first, second)
    assert second["session_naming"] == "explicit"


def test_claude_code_continues_its_session_from_the_cache(emulated_server: ServerProcess, tmp_path: Path) -> None:
    client, work = claude(emulated_server, tmp_path / "home"), workspace(tmp_path)
    first, second = "Which files are in this project?", "Which of them is the largest?"
    first_turn(client, first, work)
    next_turn(client, second, work)
    session, records = typed_session(emulated_server, first, second)
    check_two_turns(records)
    # Claude Code's own session id (in metadata.user_id) names the session.
    transcripts = list((tmp_path / "home" / ".claude" / "projects").rglob("*.jsonl"))
    assert session in {t.stem for t in transcripts}, (session, transcripts)


def test_codex_cli_resumes_its_session_from_the_cache(emulated_server: ServerProcess, tmp_path: Path) -> None:
    client, work = codex(emulated_server, tmp_path / "home"), workspace(tmp_path)
    first, second = "What does main.py print?", "And what does the README say?"
    out = first_turn(client, first, work)
    next_turn(client, second, work)
    session, records = typed_session(emulated_server, first, second)
    check_two_turns(records)
    assert f"session id: {session}" in out  # Codex's conversation id (prompt_cache_key) names the session


def test_opencode_continues_its_session_and_its_title_request_stays_a_side_call(
        emulated_server: ServerProcess, tmp_path: Path) -> None:
    """opencode sends its title generator's request under the session's own id, before the first turn:
    a side call, with its own report, that neither counts as a turn nor breaks the first turn's report."""
    client, work = opencode(emulated_server, tmp_path / "home"), workspace(tmp_path)
    first, second = "List the files in this project.", "Now open the README."
    first_turn(client, first, work)
    next_turn(client, second, work)
    session, _ = typed_session(emulated_server, first, second)
    assert session.startswith("ses_")  # opencode's own session id (x-session-id) names the session
    deadline = time.monotonic() + 5  # a turn's record is queryable within a second of its response
    with emulated_server.http() as http:
        while True:
            turns = http.get(f"/v1/xdb/sessions/{session}/turns").raise_for_status().json()["turns"]
            side, main = [t for t in turns if t["side"]], [t for t in turns if not t["side"]]
            if len(main) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        listed = http.get("/v1/context/sessions", params={"limit": 1000}).raise_for_status().json()["data"]
    assert side and all(t["prompt_tokens"] for t in side)  # the title request: recorded, with its own report
    check_two_turns(main)
    assert main[0]["first_changed_block"] is None  # the title request before it broke nothing
    assert next(s for s in listed if s["session_id"] == session)["turns"] == len(main) == 2


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """vLLM's own server on the same emulated engine, serving the model under the same name."""
    served = start_vllm(tiny_model_dir, tmp_path_factory.mktemp("agent-clis-vllm"), max_model_len=65536,
                        emulate="h100-llama-8b", reply_tokens=24)
    try:
        yield served
    finally:
        served.stop()


def prompt_tokens(server: ServerProcess) -> float:
    """vLLM's count of the prompt tokens its engine has taken (AHC serves vLLM's metrics as they are)."""
    with server.http() as http:
        text = http.get("/metrics").raise_for_status().text
    return sum(float(v) for v in re.findall(r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.mark.parametrize("make_client", [claude, codex], ids=["claude", "codex"])
def test_a_clients_request_is_the_same_prompt_on_ahc_and_on_vllms_own_server(
        make_client: Client, emulated_server: ServerProcess, vllm_server: ServerProcess, tmp_path: Path) -> None:
    work = workspace(tmp_path)  # one project, so both prompts name the same path
    sent = {}
    for name, server in (("ahc", emulated_server), ("vllm", vllm_server)):
        before = prompt_tokens(server)
        first_turn(make_client(server, tmp_path / name), "Summarise this project in a sentence.", work)
        sent[name] = prompt_tokens(server) - before
    assert sent["ahc"] == sent["vllm"] > 5_000, sent
