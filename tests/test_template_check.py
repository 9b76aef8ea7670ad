"""The start-up check that the chat template keeps each prompt a prefix of the next."""

from __future__ import annotations

import pytest

from server.model.template_check import check_chat_template

# Like Qwen3's: an earlier reply's reasoning is dropped once a later user turn exists.
DROPS_OLD_REASONING = (
    "{%- for m in messages -%}<|{{ m.role }}|>"
    "{%- if m.role == 'assistant' and not loop.last and loop.index0 < messages|length - 2 -%}"
    "{{ m.content.split('.')[-1] }}{%- else -%}{{ m.content }}{%- endif -%}\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}")
# Like templates that stamp the conversation length (or today's date) into the system prompt.
STAMPS_LENGTH = ("{{ messages|length }} messages\n{%- for m in messages -%}<|{{ m.role }}|>{{ m.content }}\n"
                 "{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}")


def renderer(tokenizer, template: str | None = None):
    return lambda messages, tools: tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True, chat_template=template)


def test_the_tiny_models_template_is_prefix_stable(tokenizer) -> None:
    check = check_chat_template(renderer(tokenizer))
    assert check.stable is True, check.detail


@pytest.mark.parametrize("template", [DROPS_OLD_REASONING, STAMPS_LENGTH])
def test_a_template_that_re_renders_earlier_turns_is_caught(tokenizer, template: str) -> None:
    check = check_chat_template(renderer(tokenizer, template))
    assert check.stable is False and "re-renders the earlier prompt at character" in check.detail


def test_a_template_that_cannot_render_is_reported_not_raised(tokenizer) -> None:
    check = check_chat_template(renderer(tokenizer, "{{ raise_exception('no chat here') }}"))
    assert check.stable is None and "no chat here" in check.detail
