"""`/docs` (Swagger UI) and `/redoc` from assets the node serves itself, so the API docs work
without a network (FastAPI's own pages load them from a CDN). The assets come from the
`fastapi-offline` package (in the `web` extra)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from .._logs import get_logger

log = get_logger("stickless.web")

#: Where the docs' scripts and styles are served.
ASSETS = "/docs-assets"


def _assets() -> Path | None:
    """The directory of fastapi-offline's Swagger UI and ReDoc builds, or None."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    static = Path(next(iter(spec.submodule_search_locations))) / "static"
    return static if (static / "swagger-ui-bundle.js").is_file() else None


def mount_docs(app: FastAPI) -> None:
    """Serve `/docs` and `/redoc` over local assets (both off, with a warning, when the assets
    are not installed: never a page that fetches from another site)."""
    static = _assets()
    if static is None:
        log.warning("GET /docs is off: fastapi-offline is not installed (stickless[web])")
        return
    app.mount(ASSETS, StaticFiles(directory=static), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            # No badge image from the public validator.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
