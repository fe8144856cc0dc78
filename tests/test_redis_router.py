"""Routers over a real Redis: forwarding, cross-node events with resume, outages and recovery."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stickless import (
    BackendUnavailableError,
    DeploymentMode,
    FailureCode,
    RouterConfig,
    SessionRouter,
    SubmitKind,
    TurnFailedError,
)
from stickless.backends.redis import RedisBackends

from .agents import Journal, ScriptedOpener, req, wait_until
from .conftest import FAST
from .redis_fixture import RedisServer, redis_executable


async def start_nodes(
    url: str, journal: Journal, count: int = 3, **overrides: Any
) -> list[SessionRouter]:
    """Routers in DISTRIBUTED mode, each over its own Redis connections, one namespace."""
    namespace = f"t{uuid.uuid4().hex[:8]}"
    nodes = []
    for i in range(count):
        config = RouterConfig(
            node_id=f"redis-node-{i}", mode=DeploymentMode.DISTRIBUTED, **{**FAST, **overrides}
        )
        backends = RedisBackends.from_url(url, namespace=namespace, socket_timeout=1.0)
        router = SessionRouter.build(
            config=config, opener=ScriptedOpener(journal), backends=backends
        )
        await router.start()
        nodes.append(router)
    return nodes


@pytest.fixture
async def nodes(redis_url: str, journal: Journal) -> AsyncIterator[list[SessionRouter]]:
    started = await start_nodes(redis_url, journal)
    yield started
    for node in started:
        await node.aclose(grace=0.5)
        await node.backends.aclose()


async def test_forwarding_and_serialization_over_redis(
    nodes: list[SessionRouter], journal: Journal
) -> None:
    a = nodes[0]
    first = await a.submit(req("s1", "one"))
    await first.result
    # When 12 submits arrive through all nodes at once
    dispositions = await asyncio.gather(
        *(nodes[i % 3].submit(req("s1", f"m{i}")) for i in range(12))
    )
    results = await asyncio.gather(*(d.result for d in dispositions))
    # Then all ran on the holder, one at a time, and the transcript is fenced and in turn order
    assert {r.executed_by for r in results} == {a.node_id}
    assert SubmitKind.FORWARDED in {d.kind for d in dispositions}
    assert journal.max_concurrency["s1"] == 1
    record = await a.backends.records.load("s1")
    assert record is not None and len(record.entries) == 26
    turns = [e.turn_id for e in record.entries]
    assert all(turns[i] == turns[i + 1] for i in range(0, len(turns), 2))


async def test_events_cross_nodes_and_resume_from_the_redis_log(
    nodes: list[SessionRouter],
) -> None:
    a, b, c = nodes
    live = c.events("s1")
    await live.ready()
    first = await a.submit(req("s1", "alpha beta"))
    await first.result
    seen = []
    async for event in live:
        seen.append(event)
        if event.type == "turn_completed":
            break
    await live.aclose()
    assert [e.type for e in seen] == ["turn_started", "text_delta", "text_delta", "turn_completed"]
    # A subscriber resuming after the second frame replays the rest from the log, then goes live
    cursor = seen[1].event_id
    assert cursor is not None
    resumed = b.events("s1", after=cursor)
    await resumed.ready()
    second = await a.submit(req("s1", "gamma"))
    await second.result
    replayed = []
    async for event in resumed:
        replayed.append((event.turn_id, event.seq))
        if event.type == "turn_completed" and event.turn_id == second.turn_id:
            break
    await resumed.aclose()
    assert replayed == [(first.turn_id, 3), (first.turn_id, 4)] + [
        (second.turn_id, s) for s in (1, 2, 3)
    ]


async def test_redis_outage_fails_fast_then_the_router_recovers(
    tmp_path: Path, journal: Journal
) -> None:
    server = RedisServer(tmp_path, executable=redis_executable())
    server.start()
    nodes: list[SessionRouter] = []
    try:
        nodes = await start_nodes(
            server.url, journal, count=2, lease_ttl=1.0, lease_extend_interval=0.25
        )
        a, b = nodes
        journal.gate("during outage")
        running = await a.submit(req("s1", "during outage"))
        await journal.entered["during outage"].wait()
        # When Redis goes away mid-turn
        server.stop()
        # Then new submits fail with BackendUnavailableError instead of hanging...
        with pytest.raises(BackendUnavailableError):
            await b.submit(req("s2", "refused"))
        # ...and renewals failing past the lease TTL end the running turn with LEASE_LOST
        with pytest.raises(TurnFailedError) as failure:
            await asyncio.wait_for(running.result, 20)
        assert failure.value.code is FailureCode.LEASE_LOST
        # When Redis comes back (same port), the routers work again by themselves
        server.start()

        async def serves() -> bool:
            try:
                disp = await b.submit(req("s3", "back"))
                return (await disp.result).text == "echo:back"
            except BackendUnavailableError:
                return False

        await wait_until(serves, within=20)
    finally:
        for node in nodes:
            await node.aclose(grace=0.2)
            await node.backends.aclose()
        server.stop()


def test_distributed_mode_accepts_redis_backends(redis_url: str, journal: Journal) -> None:
    config = RouterConfig(node_id="n1", mode=DeploymentMode.DISTRIBUTED)
    router = SessionRouter.build(
        config=config,
        opener=ScriptedOpener(journal),
        backends=RedisBackends.from_url(redis_url, namespace="dist"),
    )
    assert router.node_id.startswith("n1/")  # the configured id with this process's incarnation
