"""The HTTP gateway inside your own FastAPI app, over Redis: the app owns the router's start and
close (its lifespan), and mounts the `/v1` routes beside its own.

    uvicorn examples.embedded_app:app --port 8001   # one node; run one per node, any port

STICKLESS_REDIS_URL names the Redis (default redis://127.0.0.1:6379/0) and STICKLESS_NODE_ID
this node (default: the host and the process id); every node of one app shares the namespace.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from stickless import DeploymentMode, RouterConfig, SessionRouter
from stickless.backends.redis import RedisBackends
from stickless.demo.opener import make_opener  # your LiveSessionOpener here
from stickless.web import Gateway, GatewaySettings, api_router, probes_router

backends = RedisBackends.from_url(
    os.environ.get("STICKLESS_REDIS_URL", "redis://127.0.0.1:6379/0"), namespace="myapp"
)
router = SessionRouter.build(
    config=RouterConfig(
        node_id=os.environ.get("STICKLESS_NODE_ID"), mode=DeploymentMode.DISTRIBUTED
    ),
    opener=make_opener(),
    backends=backends,
)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    await router.start()  # takes calls once started
    try:
        yield
    finally:
        await router.aclose(grace=5.0)  # running turns end or are answered SHUTDOWN
        await backends.aclose()


app = FastAPI(lifespan=lifespan)
# No authenticator here: every request is the anonymous principal (see "Serve over HTTP").
app.include_router(api_router(Gateway(router, None, None, GatewaySettings())))
app.include_router(probes_router(router))  # /healthz, /readyz for the load balancer


@app.get("/hello")
async def hello() -> dict[str, str]:
    """One of the app's own routes, beside stickless's."""
    return {"node": router.node_id}
