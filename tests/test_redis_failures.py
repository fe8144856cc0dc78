"""Failure handling on nodes over a real Redis: hand-over on shutdown (holder loss and fencing over
Redis: tests/test_failures.py, parametrized over both backends)."""

from __future__ import annotations

from typing import Any

from stickless import SubmitKind
from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener, req

QUICK: dict[str, Any] = dict(
    lease_ttl=1.0,
    lease_extend_interval=0.25,
    idempotency_secondary_ttl=0.5,
    holder_loss_sweep_interval=0.25,
    forward_ttl=20.0,
    release_interrupt_timeout=1.0,
    interrupt_grace=0.3,
)


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
