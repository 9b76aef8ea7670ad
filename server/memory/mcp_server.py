"""`ahc mcp`: XDB's memory verbs as a Model Context Protocol server on stdio, for clients that bring their
own tools (Claude Code's `claude mcp add`, Codex CLI's `[mcp_servers]`, the Agents SDK's MCPServerStdio).

Each tool is the one the orchestrator offers the served model (orchestrator/memory_tools.py), plus the
session it acts on (`session_id`, default `--session`), and runs at the AHC server's
`POST /v1/context/memory` under the given key: the same checks, the same tenant, the same rows.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from orchestrator.memory_tools import MEMORY_TOOL_NAMES, MEMORY_TOOLS
from server.http.errors import error_message

TIMEOUT_S = 30.0


@dataclass(frozen=True)
class MemoryServer:
    """Where the verbs run: the AHC server's base URL (`http://127.0.0.1:8000`), its key, and the session a
    call without `session_id` acts on."""

    base_url: str
    api_key: str | None = None
    session_id: str | None = None

    def tools(self) -> list[types.Tool]:
        out = []
        for name in MEMORY_TOOL_NAMES:
            function = MEMORY_TOOLS[name]["function"]
            schema = copy.deepcopy(function["parameters"])
            schema["properties"]["session_id"] = {"type": "string", "minLength": 1,
                                                  "description": "The AHC session whose memory this is."}
            if self.session_id is None:
                schema["required"] = [*schema["required"], "session_id"]
            out.append(types.Tool(name=name, description=function["description"], inputSchema=schema))
        return out

    async def call(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        args = dict(arguments or {})
        session = args.pop("session_id", None) or self.session_id
        if name not in MEMORY_TOOLS or session is None:
            why = f"unknown tool {name!r}" if name not in MEMORY_TOOLS else "session_id is required"
            return _result({"error": {"type": "InvalidRequest", "message": why}}, error=True)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=TIMEOUT_S) as client:
            reply = await client.post("/v1/context/memory", headers=headers,
                                      json={"session_id": session, "name": name, "arguments": args})
        if reply.status_code != 200:
            failed = {"type": f"http_{reply.status_code}", "message": error_message(reply)}
            return _result({"error": failed}, error=True)
        result = reply.json()["result"]
        return _result(result, error="error" in result)

    def server(self) -> Server[Any]:
        async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
            return types.ListToolsResult(tools=self.tools())

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self.call(params.name, params.arguments)

        return Server("ahc-memory", instructions="Your memory of an AHC session: recall, tag, comment, pin, and "
                                                 "ask for the session's history to be condensed.",
                      on_list_tools=list_tools, on_call_tool=call_tool)

    def run_stdio(self) -> None:
        server = self.server()

        async def main() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(main)


def _result(value: dict[str, Any], error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(value))],
                                structuredContent=value, isError=error)

