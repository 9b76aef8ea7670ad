"""`ahc identity condense`: a running server condenses an Identity and checks it against the caller's tests
(`POST /v1/context/identity/condense`, server/identity/identity_condenser.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import httpx

app = typer.Typer(no_args_is_help=True, help="The Identity: the persona leading every prompt.")
PATH = "/v1/context/identity/condense"


def read_tests(path: Path) -> list[dict[str, Any]]:
    """The tests file: a JSON list of {"input", "contains" | "pattern" | "json_schema"}; else ValueError."""
    try:
        tests = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise ValueError(f"{path}: expected a JSON list of test objects")
    return tests


def condense_over_http(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """The server's check of the condensation; its error (a 4xx or 5xx) as ValueError with its message."""
    reply = client.post(PATH, json=body)
    if reply.status_code != 200:
        try:
            message = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = reply.text[:200]
        raise ValueError(f"the server refused the request ({reply.status_code}): {message}")
    result: dict[str, Any] = reply.json()
    return result


def summary(result: dict[str, Any]) -> str:
    verdict = "accepted" if result["accepted"] else f"refused: {result['reason']}"
    lines = [f"{verdict} ({result['tokens_before']} -> {result['tokens_after']} tokens)"]
    for i, test in enumerate(result["tests"]):
        marks = " ".join(f"{side} {'pass' if test[side]['passed'] else 'FAIL'}" for side in ("full", "condensed"))
        lines.append(f"test {i}: {marks}  {test['input'][:60]!r}")
    if result["identity"] is not None:
        lines.append(f"stored as document {result['identity']['id']} version {result['identity']['version']}")
    return "\n".join(lines)


def condense(
    identity: Annotated[Path, typer.Argument(help="A file holding the Identity (the persona text).")],
    tests: Annotated[Path, typer.Option(help="A JSON file: a list of tests, each {\"input\": ..., and "
                                             "\"contains\", \"pattern\" or \"json_schema\"}.")],
    session: Annotated[list[str] | None, typer.Option(help="A successful session to learn from (repeatable).")] = None,
    run: Annotated[list[str] | None, typer.Option(help="A successful agent run to learn from (repeatable).")] = None,
    name: Annotated[str, typer.Option(help="Which of your condensed Identities this is.")] = "identity",
    candidate: Annotated[Path | None, typer.Option(help="Check this condensation instead of asking the model.")]
    = None,
    base_url: Annotated[str, typer.Option(help="The AHC server.")] = "http://127.0.0.1:8000",
    api_key: Annotated[str | None, typer.Option(envvar="AHC_API_KEY", help="Its key.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="The whole check as one JSON line.")] = False,
) -> None:
    """Have the served model condense an Identity from successful traces and check it against tests: accepted
    (exit 0, stored as a document of doc_type identity) only if it passes every test the full one passes;
    refused: exit 1."""
    import httpx

    body: dict[str, Any] = {"identity": identity.read_text(), "tests": read_tests(tests), "name": name,
                            "sessions": session or [], "runs": run or []}
    if candidate is not None:
        body["candidate"] = candidate.read_text()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=1800) as client:
            result = condense_over_http(client, body)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {base_url}: {exc}") from None
    typer.echo(json.dumps(result) if json_out else summary(result))
    if not result["accepted"]:
        raise ValueError(f"refused: {result['reason']}")
