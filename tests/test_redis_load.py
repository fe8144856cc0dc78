"""Production concurrency on one node over a healthy Redis: the client's own connection pool never
turns into a failure (no 503, no FAILED, no second run), and a graceful close logs no failed call.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from stickless import DeploymentMode, RouterConfig, SessionRouter
from stickless.backends.redis import RedisBackends

from .agents import Journal, ScriptedOpener, req
from .conftest import FAST

CONCURRENT = 1000


async def test_a_thousand_concurrent_submits_on_one_node_all_succeed_and_close_quietly(
    redis_url: str, journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    config = RouterConfig(node_id="busy", mode=DeploymentMode.DISTRIBUTED, **FAST)
    backends = RedisBackends.from_url(redis_url, namespace=f"t{uuid.uuid4().hex[:8]}")
    router = SessionRouter.build(config=config, opener=ScriptedOpener(journal), backends=backends)
    await router.start()
    try:
        # When a thousand turns of a thousand sessions are submitted at once, each committing
        dispositions = await asyncio.gather(
            *(
                router.submit(req(f"s{n}", f"turn {n}", idempotency_key="k"))
                for n in range(CONCURRENT)
            )
        )
        results = await asyncio.gather(*(d.result for d in dispositions))
        # Then every one succeeded, and each ran exactly once
        assert [r.text for r in results] == [f"echo:turn {n}" for n in range(CONCURRENT)]
        assert len(journal.finished) == CONCURRENT
        # And closing the node that holds them all logs no failed backend call
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="stickless"):
            await router.aclose(grace=5.0)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        await router.aclose(grace=0.5)
        await backends.aclose()
