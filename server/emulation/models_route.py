"""`GET /v1/models` on an emulated engine: vLLM's own list, each card saying what is emulated, so no
figure taken from this server is mistaken for a real GPU's."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from server.emulation.profiles import profile


def emulation_label(name: str) -> dict[str, Any]:
    roofline = profile(name)
    return {"profile": name, "gpu": roofline.gpu.name, "model": roofline.model.name,
            "note": "emulated: vLLM's scheduler and KV cache manager are real; each step's time comes from a "
                    "roofline model of this GPU and model, and reply tokens are drawn, not generated"}


def install_models_route(app: FastAPI, name: str) -> None:
    """Ahead of vLLM's route on the same path (Starlette matches routes in order)."""
    label = emulation_label(name)

    async def show_available_models(raw_request: Request) -> JSONResponse:
        listed = await raw_request.app.state.openai_serving_models.show_available_models()
        body = listed.model_dump()
        for card in body["data"]:
            card["emulated"] = label
        return JSONResponse(content=body)

    app.router.routes.insert(0, APIRoute("/v1/models", show_available_models, methods=["GET"],
                                         name="ahc_emulated_models", include_in_schema=False))
