"""Failure handling on nodes over a real Redis: holder loss, fencing, hand-over on shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stickless import FailureCode, SubmitKind, TurnFailedError
from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener, req, wait_until

QUICK: dict[str, Any] = dict(
    lease_ttl=1.0,
    lease_extend_interval=0.25,
    idempotency_secondary_ttl=0.5,
    holder_loss_sweep_interval=0.25,
    forward_ttl=20.0,
    release_interrupt_timeout=1.0,
    interrupt_grace=0.3,
)


@pytest.fixture
async def redis_cluster(redis_url: str, journal: Journal) -> AsyncIterator[LocalCluster]:
    async with LocalCluster.over_redis(redis_url, 3, opener=ScriptedOpener(journal), **QUICK) as c:
        yield c


async def test_holder_death_over_redis_answers_holder_lost_and_a_survivor_takes_over(
    redis_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = redis_cluster.nodes
    await (await a.submit(req("s1", "committed"))).result
    watcher = c.events("s1")
    await watcher.ready()
    journal.gate("lost")
    on_b = await b.submit(req("s1", "lost"))
    await journal.entered["lost"].wait()
    # When the holder dies mid-turn (tasks stopped, connections closed, nothing released)
    await redis_cluster.kill(a)
    # Then the forwarded caller is answered HOLDER_LOST and the subscriber sees why
    with pytest.raises(TurnFailedError) as failure:
        await asyncio.wait_for(on_b.result, 15)
    assert failure.value.code is FailureCode.HOLDER_LOST
    async for event in watcher:
        if event.type == "interrupted":
            assert event.reason == "HOLDER_LOST" and event.turn_id == on_b.turn_id
            break
    await watcher.aclose()
    # And a survivor serves the next turn on top of the committed history
    result = await (await c.submit(req("s1", "next"))).result
    assert result.executed_by in (b.node_id, c.node_id)
    record = await redis_cluster.backends.records.load("s1")
    assert record is not None
    assert [e.content for e in record.entries] == [
        "committed",
        "echo:committed",
        "next",
        "echo:next",
    ]


async def test_fencing_over_redis_refuses_a_paused_holders_commit(
    redis_url: str, journal: Journal
) -> None:
    settings = {**QUICK, "idempotency_secondary_ttl": 10.0}
    async with LocalCluster.over_redis(
        redis_url, 2, opener=ScriptedOpener(journal), **settings
    ) as c:
        a, b = c.nodes
        gate = journal.gate("late")
        late = await a.submit(req("s1", "late"))
        await journal.entered["late"].wait()
        a.renewer.pause()

        async def expired() -> bool:
            return await c.backends.leases.current("s1") is None

        await wait_until(expired, within=10)
        taken = await b.submit(req("s1", "from b"))
        assert taken.kind is SubmitKind.EXECUTED_LOCALLY
        await taken.result
        gate.set()
        with pytest.raises(TurnFailedError) as failure:
            await late.result
        assert failure.value.code is FailureCode.LEASE_LOST
        record = await c.backends.records.load("s1")
        assert record is not None
        assert [e.content for e in record.entries] == ["from b", "echo:from b"]


async def test_graceful_shutdown_over_redis_hands_the_session_over_at_once(
    redis_url: str, journal: Journal
) -> None:
    # (reservations are touched every 10 s here, so they must stay fresh longer than that)
    settings = {
        **QUICK,
        "lease_ttl": 30.0,
        "lease_extend_interval": 10.0,
        "idempotency_secondary_ttl": 30.0,
    }
    async with LocalCluster.over_redis(
        redis_url, 2, opener=ScriptedOpener(journal), **settings
    ) as c:
        a, b = c.nodes
        await (await a.submit(req("s1", "first"))).result
        await a.aclose(grace=0.5)
        # The lease was released, not left to expire: B claims the session straight away
        assert await c.backends.leases.current("s1") is None
        disp = await b.submit(req("s1", "second"))
        assert disp.kind is SubmitKind.EXECUTED_LOCALLY
        assert (await disp.result).executed_by == b.node_id
