"""A pytest fixture of started routers over Redis. Register it by importing into a test module:
`from .redis_routers import Start, start_fixture  # noqa: F401`; tests then ask for `start`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from stickless import DeploymentMode, RouterConfig, SessionRouter
from stickless.backends.redis import RedisBackends

from .agents import Journal, ScriptedOpener
from .conftest import FAST

Start = Callable[..., Any]


@pytest.fixture(name="start")
async def start_fixture(journal: Journal) -> AsyncIterator[Start]:
    """`await start(url, **overrides)`: a started router over Redis at `url` (shared namespace),
    each with its own connections; all closed after the test."""
    namespace = f"f{uuid.uuid4().hex[:8]}"
    routers: list[SessionRouter] = []

    async def make(url: str, **overrides: Any) -> SessionRouter:
        config = RouterConfig(
            node_id=f"n{len(routers)}", mode=DeploymentMode.DISTRIBUTED, **{**FAST, **overrides}
        )
        backends = RedisBackends.from_url(url, namespace=namespace)
        router = SessionRouter.build(
            config=config, opener=ScriptedOpener(journal), backends=backends
        )
        await router.start()
        routers.append(router)
        return router

    yield make
    for router in routers:
        await router.aclose(grace=0.5)
        await router.backends.aclose()
