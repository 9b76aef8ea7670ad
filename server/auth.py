"""`--api-key`: every `/v1/*` route needs `Authorization: Bearer KEY`; `/health` and `/metrics` stay open.

vLLM has its own key middleware, but it answers `{"error": "Unauthorized"}`, not OpenAI's error
shape, which the `openai` client expects; this one answers as OpenAI does.
"""

from __future__ import annotations

import hashlib
import secrets

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import error_response


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._digest = hashlib.sha256(api_key.encode()).digest()

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return secrets.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = (
            scope["type"] == "http"
            and scope.get("method") != "OPTIONS"
            and scope["path"].removeprefix(scope.get("root_path", "")).startswith("/v1")
        )
        if guarded and not self._authorized(Headers(scope=scope)):
            response = error_response(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'.",
                                      "authentication_error", "invalid_api_key")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
