"""`/v1/completions` through the official client on the real engine: recorded like chat."""

from __future__ import annotations

import pytest

from bench.servers import recall_until

pytestmark = pytest.mark.engine


def test_a_completion_records_its_prompt_and_tokens(server, client, model_name) -> None:
    reply = client.completions.create(model=model_name, prompt="legacy completion omega", max_tokens=5,
                                      temperature=0)
    assert reply.choices[0].text is not None and reply.usage.completion_tokens > 0
    [prompt] = recall_until(server, 1, text="legacy completion omega", event_types="input")
    assert prompt["metadata"]["endpoint"] == "completions"
    tokens = recall_until(server, reply.usage.completion_tokens, session_id=prompt["session_id"],
                          event_types="output")
    assert "".join(t["content"] for t in tokens) == reply.choices[0].text
