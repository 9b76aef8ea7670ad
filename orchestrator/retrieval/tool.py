"""The `query_archive` tool offered to the model in RAG mode, and its executor."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.retrieval.codex_index import CodexIndex

MAX_K = 10
MAX_QUERY_CHARS = 2_000  # a search query, not a document: longer is a model gone astray

QUERY_ARCHIVE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "query_archive",
        "description": ("Search the Codex (the reference documents too large to be in the prompt) and "
                        "return the passages most relevant to the query, best first, each with its "
                        "document id and position. Use it before answering from the documents."),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS,
                          "description": "What to look for: a question, a phrase or exact keywords."},
                "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "default": 4,
                      "description": "How many passages to return."},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}


def query_archive(index: CodexIndex, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """Run the tool. `arguments` is the parsed object or the JSON string a tool call carries. Returns
    {"query", "k", "results": [chunk dicts]} or {"error": {"type", "message"}}; never raises for bad
    arguments, since the answer goes back to the model as the tool result."""
    parsed = _parse(arguments)
    if "error" in parsed:
        return parsed
    results = index.search(parsed["query"], parsed["k"])
    return {"query": parsed["query"], "k": parsed["k"], "results": [r.to_dict() for r in results]}


def _parse(arguments: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return _error(f"arguments are not valid JSON: {exc.msg}")
    if not isinstance(arguments, dict):
        return _error("arguments must be a JSON object")
    unknown = sorted(set(arguments) - {"query", "k"})
    if unknown:
        return _error(f"unknown argument(s): {', '.join(unknown)}; expected query and k")
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return _error("query is required and must be a non-empty string")
    if len(query) > MAX_QUERY_CHARS:
        return _error(f"query is {len(query)} characters; the maximum is {MAX_QUERY_CHARS}")
    k = arguments.get("k", 4)
    # bool is an int in Python; JSON true is not a count.
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        return _error(f"k must be an integer from 1 to {MAX_K}, got {json.dumps(k)}")
    return {"query": query, "k": k}


def _error(message: str) -> dict[str, Any]:
    return {"error": {"type": "invalid_arguments", "message": message}}
