"""`/ui/`: the experience browser, a read-only page over the server's own API.

The page is a Jinja2 shell plus a few plain ES modules (no build step); everything it shows it reads
from `/v1/xdb/*` with the caller's key, so it sees exactly what that key's tenant may see. The shell
itself holds no data and loads without a key (a browser cannot attach a Bearer header to a
navigation); with keys configured the page asks for one and sends it as a header, never in a URL.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from starlette.responses import RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

UI_DIR = Path(str(resources.files("server") / "ui"))
# The page runs only its own scripts and talks only to this server; report images arrive as blobs.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def install_ui(app: FastAPI, *, model: str, auth_required: bool, version: str, emulated: str | None = None) -> None:
    templates = Jinja2Templates(directory=UI_DIR / "templates")

    async def index(request: Request) -> Response:
        response = templates.TemplateResponse(request, "index.html", {
            "model": model, "auth_required": auth_required, "version": version, "emulated": emulated})
        response.headers.update(SECURITY_HEADERS)
        return response

    async def to_index() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    app.add_api_route("/ui", to_index, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui/", index, methods=["GET"], include_in_schema=False)
    app.mount("/ui/static", StaticFiles(directory=UI_DIR / "static"), name="ui-static")
