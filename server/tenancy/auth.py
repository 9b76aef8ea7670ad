"""`--api-key`: every route needs the key, except the probes in `OPEN_PATHS`: `Authorization: Bearer KEY`
as OpenAI's clients send it, or `x-api-key: KEY` as Anthropic's do.

Deny by default: vLLM's app mounts more than `/v1/*` (tokenizer, server load, docs and whatever a later
vLLM adds), so the key guards every path and the exceptions are named. The probes stay open because
orchestrators and Prometheus scrape them without credentials, and they reveal nothing of the model's
work. Each key is a tenant (server/tenancy/tenants.py): the check makes the key's tenant the request's.
An auditor's key reaches the audit log's routes (`AUDIT_PREFIX`) and the review step's proposals for Karma
(`KARMA_PROPOSALS`, which it verifies), and no others; no other key reaches the audit log, and a server
without keys serves it to no one (`AuditClosed`).

vLLM has its own key middleware, but it answers `{"error": "Unauthorized"}`, not OpenAI's error
shape, which the `openai` client expects; this one answers as OpenAI does.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from server.http.errors import error_response
from server.tenancy.request_context import current_tenant
from server.tenancy.tenants import Tenant, TenantKeys

# Liveness, readiness (SageMaker's `/ping`, GET and POST) and Prometheus: exact paths, not prefixes.
OPEN_PATHS = ("/health", "/metrics", "/ping")
# The experience browser's shell (HTML, script, style) holds no data: a browser cannot send a Bearer
# header on navigation, so the page loads bare, asks for the key, and every read it makes carries it.
UI_PREFIX = "/ui"
AUDIT_PREFIX = "/v1/audit"
# An auditor's key also reaches the review step's proposals: it verifies outcomes proposed for Karma.
KARMA_PROPOSALS = "/v1/context/karma/proposals"

# RFC 6455's "policy violation": a WebSocket handshake without the key is closed with it.
_WS_POLICY_VIOLATION = 1008


class ApiKeyCheck:
    """The gateway's `Guard` (server/http/gateway.py): authenticates the key and makes its tenant the
    request's (`current_tenant`), on HTTP and WebSocket requests."""

    def __init__(self, keys: TenantKeys) -> None:
        self._keys = keys

    def _tenant(self, headers: Headers) -> Tenant | None:
        # Keys are looked up by SHA-256 digest: the lookup's timing says nothing about a key's characters.
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return self._keys.tenant_for(token)
        anthropic_key = headers.get("x-api-key")
        return self._keys.tenant_for(anthropic_key) if anthropic_key is not None else None

    async def __call__(self, scope: Scope, headers: Headers) -> ASGIApp | None:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        tenant = self._tenant(headers)
        open_path = path in OPEN_PATHS or _is_ui_shell(scope, path)
        if tenant is not None and not open_path and (_is_audit(path) != tenant.auditor
                                                     and not (tenant.auditor and _is_karma_review(path))):
            return _refusal(scope, "An auditor's key reads the audit log (/v1/audit) and nothing else."
                            if tenant.auditor else "The audit log (/v1/audit) is read with an auditor's key.")
        if tenant is not None:
            current_tenant.set(tenant)  # this request's task only: each request runs in its own
            return None
        if open_path or _is_cors_preflight(scope, headers):
            return None
        if scope["type"] == "websocket":
            return _close_websocket
        return error_response(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY' or "
                              "'x-api-key: KEY'.", "authentication_error", "invalid_api_key")


class AuditClosed:
    """The gateway's `Guard` on a server without keys: nobody holds an auditor's key, so nobody reads the
    audit log over HTTP (an agent with a shell tool would otherwise read its own audit from localhost).
    Every other path stays open, as without a guard. The log is read with `ahc xdb` on the machine."""

    async def __call__(self, scope: Scope, headers: Headers) -> ASGIApp | None:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if not _is_audit(path):
            return None
        return _refusal(scope, "The audit log (/v1/audit) is read over HTTP with an auditor's key alone, and this "
                               "server has no keys (a keys file line 'auditor NAME:KEY' makes one); on this "
                               "machine, `ahc xdb verify-audit --data-dir DIR` checks it.")


def _is_audit(path: str) -> bool:
    return path == AUDIT_PREFIX or path.startswith(AUDIT_PREFIX + "/")


def _is_karma_review(path: str) -> bool:
    """The review step's proposals (server/routes/karma_routes.py), which an auditor reviews as a person."""
    return path == KARMA_PROPOSALS or path.startswith(KARMA_PROPOSALS + "/")


def _refusal(scope: Scope, message: str) -> ASGIApp:
    if scope["type"] == "websocket":
        return _close_websocket
    return error_response(403, message, "permission_error", "wrong_role")


async def _close_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "websocket.close", "code": _WS_POLICY_VIOLATION})


def _is_ui_shell(scope: Scope, path: str) -> bool:
    return (scope["type"] == "http" and scope.get("method") in ("GET", "HEAD")
            and (path == UI_PREFIX or path.startswith(UI_PREFIX + "/")))


def _is_cors_preflight(scope: Scope, headers: Headers) -> bool:
    """A browser's CORS preflight carries no credentials by design. vLLM's CORS middleware answers it
    itself and never passes it to a route, so letting it through reaches nothing; any other OPTIONS
    request needs the key like every other method."""
    return (scope["type"] == "http" and scope.get("method") == "OPTIONS"
            and "origin" in headers and "access-control-request-method" in headers)
