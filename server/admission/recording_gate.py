"""Back-pressure from the experience database on every door to the engine, not only AHC's chat route.

vLLM serves generation on more paths than `/v1/chat/completions` (completions, Responses, Anthropic's
Messages, structured decisions, and whatever a later vLLM adds), and every token they generate is
recorded too. While XDB's backlog is over its bound, a new request on any of them waits, then gets a
503 with `Retry-After`, before its body is read; requests already running finish and are recorded.

Deny by default again: every POST outside AHC's own routes is gated except vLLM's routes that are
known to generate nothing (tokenizing, rendering, counting, cancelling). A new vLLM route is gated
until it is named here.

While recording is paused on a full or failing disk (`xdb.on_disk_full: pause`, xdb/service/remote.py) the 503
says so: which disk, and what to do (turn_admission.py's `wait_for_recording`, which the chat routes call
too). With `spill` the rows go to the spill dir and no request is refused for the disk.
"""

from __future__ import annotations

import re

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Scope

from core.errors import AHCError
from server.admission.turn_admission import wait_for_recording
from server.http.errors import error_response
from server.recording.recorder import Recorder

# AHC's own routes: the chat route waits itself (in order with its turn), the XDB routes write directly.
_AHC_CHAT = "/v1/chat/completions"
_AHC_PREFIXES = ("/v1/xdb/", "/v1/context/")
_NO_GENERATION = re.compile(
    r"^/(tokenize|detokenize|ping)$"
    r"|^/v1/(chat/completions|completions|messages|responses)/(render|derender)$"
    r"|^/v1/messages/count_tokens$"
    r"|^/v1/responses/[^/]+/cancel$")


def gated(path: str) -> bool:
    """Whether a POST to `path` may start a generation."""
    return path != _AHC_CHAT and not path.startswith(_AHC_PREFIXES) and not _NO_GENERATION.match(path)


class RecordingGate:
    """The gateway's `Guard` (server/http/gateway.py) that waits while XDB is behind, then refuses (503)."""

    def __init__(self, recorder: Recorder, timeout_s: float, retry_after_s: int) -> None:
        self.recorder = recorder
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, headers: Headers) -> ASGIApp | None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return None
        if not gated(scope["path"].removeprefix(scope.get("root_path", ""))):
            return None
        try:
            await wait_for_recording(self.recorder, self.timeout_s, self.retry_after_s)
        except AHCError as exc:
            return error_response(exc.status, exc.message, exc.type, exc.code, headers=exc.headers)
        return None
