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


async def test_a_hundred_concurrent_forwarded_turns_are_answered_by_their_results(
    redis_url: str, journal: Journal
) -> None:
    # The store poll runs every secondary_ttl / 2 = 15 s: answers that needed it (a TURN_RESULT
    # lost to the client's own pool) would come long after the hang guard below.
    timings = dict(FAST, idempotency_secondary_ttl=30.0, lease_ttl=20.0, lease_extend_interval=5.0)
    namespace = f"t{uuid.uuid4().hex[:8]}"
    routers = []
    for name in ("holder", "front"):
        config = RouterConfig(node_id=name, mode=DeploymentMode.DISTRIBUTED, **timings)
        backends = RedisBackends.from_url(redis_url, namespace=namespace)
        router = SessionRouter.build(
            config=config, opener=ScriptedOpener(journal), backends=backends
        )
        await router.start()
        routers.append(router)
    holder, front = routers
    try:
        sessions = [f"s{n}" for n in range(100)]
        warm = await asyncio.gather(*(holder.submit(req(s, "warm")) for s in sessions))
        await asyncio.gather(*(d.result for d in warm))
        # When a hundred turns held elsewhere are submitted through one node at once
        dispositions = await asyncio.gather(*(front.submit(req(s, "hop")) for s in sessions))
        # Then each is answered by its turn's result, not by the fallback poll
        results = await asyncio.wait_for(asyncio.gather(*(d.result for d in dispositions)), 10.0)
        assert {r.executed_by for r in results} == {holder.node_id}
    finally:
        for router in routers:
            await router.aclose(grace=1.0)
            await router.backends.aclose()
