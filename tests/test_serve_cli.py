"""`ahc serve` speaks vLLM: the model first, any `vllm serve` flag passed through, AHC's settings from the
YAML file, `AHC_*` variables and its own flags, in that order of precedence."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from core.config import load_config
from server.cluster.server_process import AHC, free_port, launch


def config_with(*flags: str, **overrides):
    config = load_config("cpu-tiny").with_overrides(**overrides)
    return config.with_overrides(**{"engine.extra_args": [*config.engine.extra_args, *flags]})


def test_the_positional_model_and_passed_through_flags_reach_both_vllm_and_ahc(tiny_model_dir: Path) -> None:
    from server.engine_args import build_vllm_namespace, with_vllm_flags

    config = config_with(str(tiny_model_dir), "--max-model-len", "1536", "--max-logprobs", "3",
                         "--served-model-name", "agent-model")
    synced = with_vllm_flags(config)
    assert synced.model == str(tiny_model_dir)
    assert synced.engine.max_model_len == 1536  # the orchestrator budgets with vLLM's real window
    assert synced.model_name == "agent-model"
    namespace = build_vllm_namespace(synced)
    assert (namespace.model, namespace.max_model_len, namespace.max_logprobs) == (str(tiny_model_dir), 1536, 3)


def test_the_served_name_defaults_to_the_model_as_in_vllm(tiny_model_dir: Path) -> None:
    from server.engine_args import with_vllm_flags

    config = load_config().with_overrides(**{"engine.extra_args": [str(tiny_model_dir)]})
    assert with_vllm_flags(config).model_name == str(tiny_model_dir)


@pytest.mark.parametrize("flags, message", [
    (["--no-such-vllm-flag", "1"], "unrecognized arguments: --no-such-vllm-flag"),
    (["--max-model-len", "lots"], "max-model-len"),
    (["--api-server-count", "0"], "--api-server-count 0: at least 1 API process"),
])
def test_a_bad_vllm_flag_is_a_clear_error(flags: list[str], message: str) -> None:
    from server.engine_args import with_vllm_flags

    with pytest.raises(ValueError, match=message):
        with_vllm_flags(config_with(*flags))


def test_no_model_anywhere_is_a_clear_error() -> None:
    from server.engine_args import with_vllm_flags

    with pytest.raises(ValueError, match="no model to serve"):
        with_vllm_flags(load_config().with_overrides(**{"engine.extra_args": ["--max-logprobs", "3"]}))


def test_environment_overrides_the_file_and_flags_override_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AHC_HOST", "0.0.0.0")
    monkeypatch.setenv("AHC_XDB__SERVICE_PROCESS", "false")
    monkeypatch.setenv("AHC_ENGINE__MAX_MODEL_LEN", "4096")
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm-env")
    config = load_config("cpu-tiny")
    assert (config.host, config.xdb.service_process, config.engine.max_model_len) == ("0.0.0.0", False, 4096)
    assert config.engine.block_size == 32  # the file's, where the environment says nothing
    assert config.api_key == ["from-vllm-env"]
    assert config.with_overrides(host="127.0.0.2").host == "127.0.0.2"
    monkeypatch.setenv("AHC_API_KEY", "from-ahc-env")
    assert load_config().api_key == ["from-ahc-env"]


@pytest.mark.parametrize("name, value, field", [
    ("AHC_ENGINE__WARP_DRIVE", "1", "engine.warp_drive"), ("AHC_PORT", "eighty", "port")])
def test_a_bad_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                             field: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=field):
        load_config("cpu-tiny")


def test_a_bundled_example_config_is_found_by_name_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config("gpu").engine.gpu_memory_utilization == load_config("gpu.yaml").engine.gpu_memory_utilization
    with pytest.raises(ValueError, match="bundled examples: cpu-small, cpu-tiny, gpu"):
        load_config("no-such")


@pytest.mark.slow
@pytest.mark.engine
def test_a_vllm_serve_command_line_works_with_ahc_serve(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`vllm serve MODEL --flags` with `ahc serve` in its place, the key and data dir from the environment."""
    port = free_port()
    data_dir = tmp_path / "data"
    cmd = [AHC, "serve", str(tiny_model_dir), "--port", str(port), "--max-logprobs", "2",
           "--max-model-len", "1024", "--enforce-eager", "--dtype", "float32", "--block-size", "32",
           "--served-model-name", "agent-model"]
    env = {"VLLM_API_KEY": "sekret", "AHC_DATA_DIR": str(data_dir), "VLLM_CPU_KVCACHE_SPACE": "1"}
    server = launch(cmd, port, tmp_path / "server.log", env=env, api_key="sekret", data_dir=data_dir)
    try:
        assert httpx.get(f"{server.base_url}/v1/models").status_code == 401  # the key from the environment
        client = server.client()
        [model] = client.models.list().data
        assert (model.id, model.max_model_len) == ("agent-model", 1024)
        reply = client.chat.completions.create(model="agent-model", max_tokens=2, messages=[
            {"role": "user", "content": "hi"}], extra_body={"context": {"session_id": "s"}})
        assert reply.context["blocks"]  # AHC's orchestrator served it
        with pytest.raises(openai.BadRequestError):  # a flag vLLM alone knows, passed through
            client.chat.completions.create(model="agent-model", max_tokens=1, logprobs=True, top_logprobs=3,
                                           messages=[{"role": "user", "content": "hi"}])
        assert (data_dir / "experience.duckdb").exists()
    finally:
        server.stop()
