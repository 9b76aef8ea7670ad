"""A tiny random-weight Llama with its own byte-level BPE tokenizer and chat template.

No model can be fetched from a hub here, so tests and benchmarks build their own. The tokenizer is
trained from text the package ships; the weights come from a seeded torch generator, so the same
seed and sizes give byte-identical files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>",
                  "<|tool|>", "<|end|>"]
# Hermes-style tool-call markers: vLLM's `hermes` tool parser looks for them in the decoded text,
# so they are added tokens that decode as text (not special, which would be skipped).
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]

# Each message renders the same way wherever it stands, so when the conversation grows the earlier
# rendering is a byte prefix of the later one (the prefix cache depends on it). Tools render once,
# at the top, so a request with tools keeps a stable head too.
CHAT_TEMPLATE = ("""{{- bos_token -}}
{%- if tools -%}
<|system|>
# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|end|>
{% endif -%}
{%- for message in messages -%}
{%- if message.role == 'assistant' -%}
<|assistant|>
{% if message.content is string %}{{ message.content }}{% elif message.content %}"""
"""{% for part in message.content %}{{ part.text }}{% endfor %}{% endif %}
{%- for call in message.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
<tool_call>
{"name": "{{ fn.name }}", "arguments": {% if fn.arguments is string %}{{ fn.arguments }}"""
"""{% else %}{{ fn.arguments | tojson }}{% endif %}}
</tool_call>
{%- endfor -%}
<|end|>
{% elif message.role == 'tool' -%}
<|tool|>
{% if message.content is string %}{{ message.content }}{% else %}"""
"""{% for part in message.content %}{{ part.text }}{% endfor %}{% endif %}<|end|>
{% else -%}
<|{{ message.role }}|>
{% if message.content is string %}{{ message.content }}{% else %}"""
"""{% for part in message.content %}{{ part.text }}{% endfor %}{% endif %}<|end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|assistant|>
{% endif -%}
""")


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of the random model; the defaults are CI-sized (head_dim 64: vLLM's CPU attention
    rejects 16)."""

    seed: int = 0
    layers: int = 2
    hidden: int = 128
    heads: int = 2
    kv_heads: int = 1
    intermediate: int = 256
    vocab_size: int = 2048
    max_position: int = 4096

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab_size",
                     "max_position"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be at least 300 (256 bytes + specials), got {self.vocab_size}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _train_tokenizer(vocab_size: int) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = resources.files("ahc").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    tokenizer.add_tokens(TOOL_TOKENS)
    return tokenizer


def _fast_tokenizer(tokenizer: Tokenizer, max_position: int) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves __init__ unannotated
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=max_position,
        chat_template=CHAT_TEMPLATE,
    )


def build_tokenizer(spec: TinyModelSpec | None = None) -> PreTrainedTokenizerFast:
    """The tiny model's tokenizer and chat template, in memory: what `build_tiny_model` saves, without
    the weights (training it takes milliseconds), for code that needs only a tokenizer."""
    spec = spec or TinyModelSpec()
    return _fast_tokenizer(_train_tokenizer(spec.vocab_size), spec.max_position)


def _build_weights(spec: TinyModelSpec, vocab: int, bos: int, eos: int, pad: int, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    # Any: transformers leaves the model's __init__ unannotated, and its @wraps on .to() hides the bound self
    model = cast(Any, LlamaForCausalLM)(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Write a tokenizer, chat template, config and random weights to ``out_dir``."""
    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(spec.vocab_size)
    _fast_tokenizer(tokenizer, spec.max_position).save_pretrained(out)
    bos, eos, pad = (tokenizer.token_to_id(t) for t in ("<|bos|>", "<|eos|>", "<|pad|>"))
    assert bos is not None and eos is not None and pad is not None  # special tokens: in every trained vocabulary
    _build_weights(spec, tokenizer.get_vocab_size(), bos, eos, pad, out)
    (out / "ahc_tiny_model.json").write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
    return out
