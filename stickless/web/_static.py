"""The chat page's files: `/` (the page) and `/static/<name>` (the page's script, the JavaScript
client, its types and the page's markdown renderer), read once from the package."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response

from ._errors import error_body

#: The files under `/static/` and their media types. `stickless.js` and `stickless.d.ts` are
#: copies of `clients/js/` (the source; tests/test_web_static.py checks they are the same).
STATIC_FILES = {
    "stickless.js": "text/javascript; charset=utf-8",
    "stickless.d.ts": "application/typescript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
}


def static_text(name: str) -> str:
    """A file of the package's `static/` directory."""
    return resources.files(__package__).joinpath("static", name).read_text("utf-8")


def chat_page_router() -> APIRouter:
    """`GET /`: the chat page; `GET /static/<name>`: the files it loads (404 for any other)."""
    page = static_text("index.html")
    files = {name: static_text(name) for name in STATIC_FILES}
    router = APIRouter(include_in_schema=False)

    @router.get("/", response_class=HTMLResponse)
    async def chat() -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @router.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in files:
            return JSONResponse(error_body("NOT_FOUND", f"no static file {name!r}"), 404)
        return Response(
            files[name], media_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"}
        )

    return router
