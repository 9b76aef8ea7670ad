"""`POST /v1/context/query_archive` and `POST /v1/context/memory`: where a client runs the tools the
orchestrator offers the model (`query_archive`, and the memory verbs a request names); and
`POST /v1/context/identity/condense`, where a client has its Identity condensed and checked
(server/identity/identity_condenser.py).

In RAG mode the orchestrator offers the model a `query_archive` tool. Per OpenAI tool semantics the
call comes back to the client (finish_reason "tool_calls"), which executes it here and sends the
result back as a `tool` message — the server never runs a tool behind the client's back, so every
call and result appears in the client's own transcript and in XDB.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from core.errors import InvalidRequest
from core.limits import ID_MAX_CHARS
from orchestrator.memory_tools import MemoryToolName
from orchestrator.retrieval import CodexRetriever
from orchestrator.retrieval.tool import MAX_K, MAX_QUERY_CHARS
from orchestrator.session import SessionStore
from server.http.errors import AHCRoute
from server.identity.identity_condenser import CondenseRequest, IdentityCondenser
from server.identity.identity_tests import IdentityTest
from server.memory.memory_tools import MemoryCall
from server.memory.memory_tools import run as run_memory_tool
from server.tenancy.request_context import request_tenant
from server.tenancy.tenant_xdb import TenantViews, TenantXDB
from server.tenancy.tenants import Tenant
from xdb import XDBClient

MEMORY_ARGUMENTS_MAX_CHARS = 16_000
IDENTITY_MAX_CHARS = 200_000  # before its tokens are counted against identity_condense_max_tokens
TEST_INPUT_MAX_CHARS = 8_000
MAX_TESTS = 32
MAX_TRACES = 16


class QueryArchiveBody(BaseModel):
    """The tool's arguments, plus whose Codex to search: the session's (each session has its own
    index); without one, the Codex of the caller's most recent RAG request."""

    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    k: int = Field(4, ge=1, le=MAX_K)
    session_id: str | None = Field(None, min_length=1, max_length=256)


class MemoryToolBody(BaseModel):
    """A memory tool call as the model made it: the tool's name and its arguments (the object, or the JSON
    string a tool call carries), and the session it was made in."""

    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(min_length=1, max_length=ID_MAX_CHARS)
    name: MemoryToolName
    arguments: dict[str, Any] | Annotated[str, Field(max_length=MEMORY_ARGUMENTS_MAX_CHARS)] = Field(
        default_factory=dict)


class IdentityTestBody(BaseModel):
    """A test: a user message, and what its answer must hold (at least one of contains, pattern, json_schema)."""

    model_config = ConfigDict(extra="forbid")
    input: str = Field(min_length=1, max_length=TEST_INPUT_MAX_CHARS)
    contains: str | None = Field(None, min_length=1, max_length=TEST_INPUT_MAX_CHARS)
    pattern: str | None = Field(None, min_length=1, max_length=1000)
    json_schema: dict[str, Any] | None = None


class CondenseBody(BaseModel):
    """An Identity to condense from the successful traces named (sessions, runs), checked by the tests;
    `candidate`: a condensation of the caller's own to check instead of asking the model for one; `name`:
    which of the tenant's condensed Identities this is (its documents' paths)."""

    model_config = ConfigDict(extra="forbid")
    identity: str = Field(min_length=1, max_length=IDENTITY_MAX_CHARS)
    tests: list[IdentityTestBody] = Field(min_length=1, max_length=MAX_TESTS)
    name: str = Field("identity", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    sessions: list[Annotated[str, Field(min_length=1, max_length=ID_MAX_CHARS)]] = Field(
        default_factory=list, max_length=MAX_TRACES)
    runs: list[Annotated[str, Field(min_length=1, max_length=ID_MAX_CHARS)]] = Field(
        default_factory=list, max_length=MAX_TRACES)
    candidate: str | None = Field(None, max_length=IDENTITY_MAX_CHARS)
    answer_max_tokens: int | None = Field(None, ge=1, le=4096, description=(
        "each test answer's bound in tokens, within the server's orchestrator.identity_test_max_tokens "
        "(which a larger value is held to); a test that needs a few words checks faster with a few tokens"))


def condense_request(body: CondenseBody) -> CondenseRequest:
    """The body as the service takes it; a blank identity, or a test that cannot be checked: InvalidRequest."""
    if not body.identity.strip():
        raise InvalidRequest("identity must not be blank", param="identity")
    tests = []
    for i, test in enumerate(body.tests):
        try:
            tests.append(IdentityTest(test.input, test.contains, test.pattern, test.json_schema))
        except ValueError as exc:
            raise InvalidRequest(f"tests[{i}]: {exc}", param=f"tests[{i}]") from None
    return CondenseRequest(body.identity, tuple(tests), body.name, tuple(body.sessions), tuple(body.runs),
                           body.candidate, body.answer_max_tokens)


def context_router(retriever: CodexRetriever, xdb: XDBClient, sessions: SessionStore,
                   identity: IdentityCondenser) -> APIRouter:
    router = APIRouter(route_class=AHCRoute, tags=["context"])
    views = TenantViews(xdb)

    @router.post("/v1/context/query_archive")
    async def query_archive(body: QueryArchiveBody, tenant: Annotated[Tenant, Depends(request_tenant)]) -> Any:
        result = await retriever.run_tool(body.model_dump(exclude={"session_id"}), tenant.scope_opt(body.session_id),
                                          tenant.prefix)
        if "error" in result:
            raise InvalidRequest(result["error"]["message"])
        return result

    @router.post("/v1/context/memory")
    async def memory(body: MemoryToolBody, view: TenantXDB = Depends(views)) -> Any:
        """Run a memory tool call the model made (`context.memory_tools`); the result is the `tool`
        message's content. A bad argument is the model's, and comes back as `{"error": ...}` for it."""
        call = MemoryCall(body.session_id, body.name, body.arguments)
        return {"name": body.name, "result": await run_memory_tool(call, view, sessions)}

    @router.post("/v1/context/identity/condense")
    async def condense_identity(body: CondenseBody, view: TenantXDB = Depends(views)) -> Any:
        """Condense the Identity from the named successful traces with the served model and check it: both
        personas answer every test; accepted only if the condensed one passes each test the full one passes.
        Every check is stored (`check`); an accepted persona as a document of doc_type `identity` (`identity`)."""
        return await identity.condense(condense_request(body), view)

    return router
