"""`EngineLabelMiddleware`: on the emulated engine every response says so (`X-AHC-Engine:
emulated:PROFILE`), so a figure measured through the API cannot travel without its label, whatever the
client keeps of the body."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-ahc-engine"


class EngineLabelMiddleware:
    def __init__(self, app: ASGIApp, label: str) -> None:
        self.app = app
        self.label = label.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def labelled(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (HEADER, self.label)]}
            await send(message)

        await self.app(scope, receive, labelled)
