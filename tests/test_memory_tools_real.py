"""The memory verbs end to end on the real small model: offered as tools, the model calls `recall`, the
client runs the call through `ahc mcp` (a real MCP client over stdio, the server's HTTP behind it), and the
result lands in the model's next turn, recorded as the session's tool result."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.servers import recall_until
from server.cluster.server_process import ServerProcess

pytestmark = pytest.mark.real_model

SESSION = "memory-real"
FACT = "The spare key is under the blue flowerpot."


async def run_through_mcp(server: ServerProcess, name: str, arguments: dict[str, Any]) -> tuple[list[str], str]:
    """`ahc mcp` started as a client's agent starts it: its tools' names, and the call's text result."""
    ahc = Path(sys.executable).parent / "ahc"
    params = StdioServerParameters(command=str(ahc), args=["mcp", "--base-url", server.base_url, "--session", SESSION],
                                   env={**os.environ, "AHC_API_KEY": server.api_key or ""})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = [tool.name for tool in (await session.list_tools()).tools]
        result = await session.call_tool(name, arguments)
        assert not result.is_error, result  # type: ignore[union-attr]
        return tools, result.content[0].text  # type: ignore[union-attr]


def test_the_model_recalls_through_its_tool_and_reads_the_result(real_server: ServerProcess,
                                                                 real_client: openai.OpenAI,
                                                                 real_model_name: str) -> None:
    context = {"session_id": SESSION, "identity": "You are a helpful assistant.", "memory_tools": ["recall"]}
    first = real_client.chat.completions.create(
        model=real_model_name, messages=[{"role": "user", "content": FACT}], max_tokens=8, temperature=0,
        extra_body={"context": context})
    assert first.choices[0].message.content is not None
    recall_until(real_server, 1, timeout=5, session_id=SESSION, text="flowerpot")

    asked = real_client.chat.completions.create(
        model=real_model_name, messages=[{"role": "user", "content": "Where is the spare key? Search your memory."}],
        tool_choice={"type": "function", "function": {"name": "recall"}}, max_tokens=64, temperature=0,
        extra_body={"context": context})
    [call] = asked.choices[0].message.tool_calls or []
    assert call.function.name == "recall"  # offered by the server: the client sent no tools
    arguments = json.loads(call.function.arguments)

    tools, text = anyio.run(run_through_mcp, real_server, "recall", {"limit": 5})
    assert tools == ["recall", "tag", "comment", "pin", "request_compaction"]
    result = json.loads(text)
    assert any(FACT == moment["content"] for moment in result["moments"]), (arguments, result)

    answer = real_client.chat.completions.create(
        model=real_model_name, messages=[{"role": "tool", "tool_call_id": call.id, "content": text}],
        max_tokens=24, temperature=0, extra_body={"context": context})
    assert answer.choices[0].finish_reason in ("stop", "length")
    # The result is in the turn the model answered from: recorded as that turn's tool result.
    [landed] = recall_until(real_server, 1, timeout=5, session_id=SESSION, event_types="tool_result")
    assert landed["content"] == text and "flowerpot" in landed["content"]
