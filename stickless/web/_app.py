"""`create_app`: the HTTP gateway as a FastAPI app, with probes and the chat page."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..router import SessionRouter
from ._ai_sdk import AISdkSettings, ai_sdk_router
from ._auth import Authenticator, Authorizer
from ._docs import mount_docs
from ._errors import error_body
from ._routes import Gateway, GatewaySettings, api_router
from ._static import chat_page_router

if TYPE_CHECKING:
    from ..metrics import PrometheusMetrics

#: The AI SDK routes `create_app` mounts unless told otherwise.
DEFAULT_AI_SDK = AISdkSettings()

#: Seconds `/readyz` waits for the backends to answer.
READY_TIMEOUT = 2.0


#: The header naming the node that answered a `/v1` request (its router's node id).
NODE_HEADER = "X-Node-Id"


class NodeIdHeader:
    """ASGI middleware stamping every `/v1` answer (errors and event streams included) with
    `X-Node-Id: <router.node_id>`, so a client behind a load balancer sees which node answered."""

    def __init__(self, app: ASGIApp, router: SessionRouter) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != "/v1" and not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[NODE_HEADER] = self.router.node_id
            await send(message)

        await self.app(scope, receive, stamped)


def probes_router(router: SessionRouter) -> APIRouter:
    """`/healthz` (the process is up) and `/readyz` (the router takes calls, its background
    loops run, and its backends answer)."""
    probes = APIRouter(tags=["probes"])

    @probes.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "node_id": router.node_id}

    @probes.get("/readyz")
    async def readyz() -> JSONResponse:
        if not router.accepting:
            body = error_body("ROUTER_CLOSED", f"router {router.node_id} takes no calls")
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        failing = router.failing_loops
        if failing:
            why = "; ".join(f"{loop}: {reason}" for loop, reason in sorted(failing.items()))
            body = error_body("LOOP_FAILING", f"background loop failing on {router.node_id}: {why}")
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                await router.backends.owners.owner("readyz")
        except Exception as exc:
            body = error_body("BACKEND_UNAVAILABLE", f"{type(exc).__name__}: {exc}")
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        body = {"status": "ready", "node_id": router.node_id}
        return JSONResponse({**body, "warnings": list(router.store_warnings)})

    return probes


def metrics_router(metrics: PrometheusMetrics) -> APIRouter:
    """`GET /metrics`: the node's metrics in the Prometheus text format (unauthenticated like
    the probes; no label names a session or a principal)."""
    scrape = APIRouter(tags=["probes"])

    @scrape.get("/metrics", include_in_schema=False)
    async def exposition() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    return scrape


def create_app(
    router: SessionRouter,
    *,
    authenticator: Authenticator | None = None,
    authorizer: Authorizer | None = None,
    settings: GatewaySettings | None = None,
    chat_page: bool = True,
    manage_router: bool = False,
    close_grace: float = 5.0,
    metrics: PrometheusMetrics | None = None,
    ai_sdk: AISdkSettings | None = DEFAULT_AI_SDK,
) -> FastAPI:
    """The gateway over `router`: the `/v1` API (every answer names its node in `X-Node-Id`),
    `/healthz`, `/readyz`, OpenAPI at `/docs`, the chat page at `/` (its files under
    `/static/`) and, given the router's `metrics` exporter, `/metrics`; the AI SDK's chat routes
    under `ai_sdk.prefix` (None: not mounted).

    Without an `authenticator` every request is the anonymous principal and every session is
    visible; with one, a session is visible only as the `authorizer` (default: its creator
    only) allows. With `manage_router` the app starts the router on startup and closes it
    (with `close_grace`) on shutdown.
    """
    gateway = Gateway(router, authenticator, authorizer, settings or GatewaySettings())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_router:
            await router.start()
        try:
            yield
        finally:
            if manage_router:
                await router.aclose(grace=close_grace)

    app = FastAPI(
        title="stickless", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    mount_docs(app)
    app.state.gateway = gateway
    app.add_middleware(NodeIdHeader, router=router)
    app.include_router(api_router(gateway))
    if ai_sdk is not None:
        app.include_router(ai_sdk_router(gateway, ai_sdk))
    app.include_router(probes_router(router))
    if metrics is not None:
        app.include_router(metrics_router(metrics))
    if chat_page:
        app.include_router(chat_page_router())
    return app
