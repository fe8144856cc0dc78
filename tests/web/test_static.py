"""The chat page's files under `/static/`: the JavaScript client served is the one in
clients/js/ (its source) and the one the package ships; anything else is a 404."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from stickless.web._static import STATIC_FILES

CLIENT_SOURCE = Path(__file__).resolve().parents[2] / "clients" / "js"


@pytest.mark.parametrize(
    ("name", "media_type"),
    [("stickless.js", "text/javascript"), ("stickless.d.ts", "application/typescript")],
)
async def test_served_client_is_its_source(
    make_app: Callable[..., Any], name: str, media_type: str
) -> None:
    served = await make_app()
    answer = await served.client.get(f"/static/{name}")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == f"{media_type}; charset=utf-8"
    source = (CLIENT_SOURCE / name).read_text("utf-8")
    shipped = resources.files("stickless.web").joinpath("static", name).read_text("utf-8")
    assert shipped == source, f"copy clients/js/{name} to stickless/web/static/{name}"
    assert answer.text == source


async def test_page_files_and_nothing_else(make_app: Callable[..., Any]) -> None:
    served = await make_app()
    page = (await served.client.get("/")).text
    assert '<script type="module" src="/static/chat.js">' in page
    script = (await served.client.get("/static/chat.js")).text
    for name in STATIC_FILES:
        answer = await served.client.get(f"/static/{name}")
        assert answer.status_code == 200, name
        if name.endswith(".js"):  # a browser runs a module script only with a JS media type
            assert answer.headers["content-type"] == "text/javascript; charset=utf-8", name
    # The page's script loads the client and the renderer it is served with.
    assert 'from "/static/stickless.js"' in script and 'from "/static/markdown.js"' in script
    for name in ("index.html", "_static.py", "nope.js"):
        answer = await served.client.get(f"/static/{name}")
        assert answer.status_code == 404, name
        assert answer.json()["error"]["code"] == "NOT_FOUND"
