"""Two router processes configured with one node id (e.g. `uvicorn --workers N` taking the id from
the environment) never share a holder identity, so one session still runs one turn at a time."""

from __future__ import annotations

import asyncio
import uuid

from stickless import DeploymentMode, RouterConfig, SessionRouter
from stickless.backends.redis import RedisBackends

from .agents import Journal, ScriptedOpener, req
from .conftest import FAST


async def test_routers_with_one_configured_id_keep_turns_serialized(
    redis_url: str, journal: Journal
) -> None:
    namespace = f"t{uuid.uuid4().hex[:8]}"
    workers = []
    for _ in range(2):
        # Given two routers built from the same configuration, each with its own connections
        config = RouterConfig(node_id="web", mode=DeploymentMode.DISTRIBUTED, **FAST)
        backends = RedisBackends.from_url(redis_url, namespace=namespace)
        router = SessionRouter.build(
            config=config, opener=ScriptedOpener(journal), backends=backends
        )
        await router.start()
        workers.append(router)
    try:
        # Then each has an identity of its own that still names the configured id
        first, second = workers
        assert first.node_id != second.node_id
        assert first.node_id.startswith("web/") and second.node_id.startswith("web/")
        # When both take turns for one session at the same time
        gate = journal.gate("slow 0")
        slow = await first.submit(req("s1", "slow 0"))
        await journal.entered["slow 0"].wait()
        others = [await w.submit(req("s1", f"turn {n}")) for n, w in enumerate(workers * 3)]
        gate.set()
        results = await asyncio.gather(slow.result, *(d.result for d in others))
        # Then they never overlapped: the second worker forwarded to the holder
        assert journal.max_concurrency["s1"] == 1
        assert {r.executed_by for r in results} == {first.node_id}
    finally:
        for router in workers:
            await router.aclose(grace=0.5)
            await router.backends.aclose()
