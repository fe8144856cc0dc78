"""Fixtures of the gateway tests: an app over an in-memory router with the demo agent, reached
through httpx on the ASGI app, or through a real uvicorn server on loopback (for streams that
only end when the client leaves)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from stickless import LiveSessionOpener, MemoryBackends, RouterConfig, SessionRouter
from stickless.demo.opener import DemoOpener
from stickless.local_services import free_port
from stickless.web import Authorizer, BearerTokens, GatewaySettings, create_app

AGENT = "demo-agent"
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}


@dataclass
class Served:
    """An app over its router, and a client of it."""

    router: SessionRouter
    backends: MemoryBackends
    client: httpx.AsyncClient


def turn(text: str, **options: Any) -> dict[str, Any]:
    """A turn body for the demo agent (`options` become its submit_options)."""
    return {"agent_ref": AGENT, "input": text, "submit_options": options}


@pytest.fixture
async def make_app(
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Any]]:
    """Build apps over fresh memory routers: `await make_app(auth=False, max_len=..., ...)`."""
    routers: list[SessionRouter] = []
    clients: list[httpx.AsyncClient] = []

    async def build(
        *,
        auth: bool = False,
        authorizer: Authorizer | None = None,
        max_len: int = 10_000,
        heartbeat: float = 15.0,
        max_input_bytes: int = 1024 * 1024,
        opener: LiveSessionOpener | None = None,
        interrupt_grace: float = 2.0,
    ) -> Served:
        backends = MemoryBackends(max_len=max_len)
        router = SessionRouter.build(
            config=RouterConfig(node_id="web-a", interrupt_grace=interrupt_grace),
            opener=opener or DemoOpener(token_delay=0.0),
            backends=backends,
        )
        await router.start()
        routers.append(router)
        authenticator = None
        if auth:
            path = tmp_path / "tokens.json"
            path.write_text(json.dumps(TOKENS))
            authenticator = BearerTokens.from_file(path)
        app = create_app(
            router,
            authenticator=authenticator,
            authorizer=authorizer,
            settings=GatewaySettings(heartbeat=heartbeat, max_input_bytes=max_input_bytes),
        )
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway"
        )
        clients.append(client)
        return Served(router, backends, client)

    yield build
    for client in clients:
        await client.aclose()
    for router in routers:
        if not router.closed:
            await router.aclose(grace=1.0)


@pytest.fixture
async def served(make_app: Callable[..., Any]) -> Served:
    """An app without authentication."""
    result: Served = await make_app()
    return result


class _SignallingServer(uvicorn.Server):
    """uvicorn's server, setting `up` once it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.up.set()


@pytest.fixture
async def live_server(served: Served) -> AsyncIterator[str]:
    """The `served` app behind a real uvicorn server on loopback; yields its base URL."""
    port = free_port()
    app = create_app(served.router, settings=GatewaySettings(heartbeat=0.2))
    server = _SignallingServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.ensure_future(server.serve())
    up = asyncio.ensure_future(server.up.wait())
    await asyncio.wait({task, up}, return_when=asyncio.FIRST_COMPLETED)
    up.cancel()
    if task.done():
        task.result()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
