"""`ahc tiny-model`: deterministic for a seed, loadable by transformers, a chat template for tools."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ahc.cli.tiny_model import TinyModelSpec, build_tiny_model


def digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return (build_tiny_model(root / "a", TinyModelSpec(seed=3)),
            build_tiny_model(root / "b", TinyModelSpec(seed=3)),
            build_tiny_model(root / "c", TinyModelSpec(seed=4)))


def test_same_seed_gives_identical_files(built) -> None:
    a, b, c = built
    assert digest(a) == digest(b) != digest(c)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def test_loadable_by_transformers_with_head_dim_64(built) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = built[0]
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = model.config
    assert config.model_type == "llama"
    assert config.hidden_size // config.num_attention_heads == 64
    ids = tokenizer("particles move right", return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0], skip_special_tokens=True) == "particles move right"
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size)


def test_chat_template_renders_every_role_and_tool_calls(built) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built[0])
    tool = {"type": "function", "function": {"name": "probe", "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}
    messages = [
        {"role": "system", "content": "You are a scientist."},
        {"role": "user", "content": "Probe it."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "probe", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "result 42"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=[tool], tokenize=False, add_generation_prompt=True)
    for needle in ("You are a scientist.", "Probe it.", "<tool_call>", '"probe"', "result 42", '"x": 1'):
        assert needle in text
    # Prefix-stable: rendering the first turns alone gives a prefix of the whole conversation.
    head = tokenizer.apply_chat_template(messages[:2], tools=[tool], tokenize=False)
    assert text.startswith(head)


def test_bad_spec_is_rejected() -> None:
    with pytest.raises(ValueError, match="multiple of heads"):
        TinyModelSpec(hidden=100, heads=3)
    with pytest.raises(ValueError, match="layers must be positive"):
        TinyModelSpec(layers=0)
