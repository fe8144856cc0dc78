"""Node liveness across real processes: a SIGKILLed holder's callers and subscribers learn
HOLDER_LOST from its liveness running out, with the default timings (see "Node liveness" in
docs/architecture.md), and a paused holder that resumes holds nothing any more."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from stickless import FailureCode, RouterConfig, TurnFailedError
from stickless._types import SubmitRequest
from stickless.router._keys import reservation_key

from .mp_cluster import FAST_CONFIG, MpCluster, poll
from .test_multiprocess import next_frames, request

#: The RouterConfig defaults of every timing the fast test config overrides.
DEFAULT_TIMINGS: dict[str, Any] = {
    name: RouterConfig.model_fields[name].default
    for name in FAST_CONFIG
    if name != "node_incarnation"
}


def reservation_key_of(turn_id: str) -> str:
    """The internal reservation key of a turn submitted without an idempotency key."""
    return reservation_key(SubmitRequest(session_id="x", agent_ref="bot", input="x"), turn_id)


@pytest.mark.timeout(90)
async def test_sigkilled_holder_is_known_lost_by_its_liveness_with_default_timings(
    redis_url: str, tmp_path: Path
) -> None:
    async with MpCluster(redis_url, tmp_path, **DEFAULT_TIMINGS) as cluster:
        a, b, _ = cluster.nodes
        sid = "killed"
        stream = await b.client.events(sid)
        await stream.ready()
        # Given A holds the session and runs a turn B forwarded to it (held at a gate)
        await a.client.run(request(sid, "t1"))
        ticket = await b.client.submit(request(sid, "t2", "gate:killed-t2"))
        assert (await cluster.started(sid, ticket["turn_id"])).node == a.node_id
        key = cluster.backends.keys.reservation(sid, reservation_key_of(ticket["turn_id"]))
        stale_by_timer = float(await cluster.redis.hget(key, "stale") or 0)
        # When A is SIGKILLed
        await a.sigkill()
        # Then B's caller gets HOLDER_LOST and B's subscriber the TurnFailed(HOLDER_LOST) frame
        with pytest.raises(TurnFailedError) as lost:
            await asyncio.wait_for(b.client.result(ticket["turn_id"]), 60)
        assert lost.value.code is FailureCode.HOLDER_LOST
        frames = await next_frames(stream, ticket["turn_id"], within=60)
        assert frames[-1].type == "turn_failed" and frames[-1].code == "HOLDER_LOST"
        # ...decided by A's liveness, not by a staleness timer: the reservation's old-style
        # deadline (the secondary TTL after it was taken) had not come yet (server clock)
        assert await cluster.server_time() / 1e6 < stale_by_timer
        assert not await cluster.redis.exists(cluster.backends.keys.liveness(a.node_id))
        # And the session goes on on a survivor
        after = await b.client.run(request(sid, "t3"))
        assert after.executed_by != a.node_id
        await stream.aclose()


@pytest.mark.timeout(60)
async def test_a_paused_holder_resumes_as_a_new_incarnation_holding_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    async with MpCluster(redis_url, tmp_path) as cluster:
        a, b, _ = cluster.nodes
        sid = "paused"
        redis, keys = cluster.redis, cluster.backends.keys
        await a.client.run(request(sid, "t1"))
        old = await redis.get(keys.liveness(a.node_id))
        assert old
        # Given A holds the session, then is SIGSTOPped until its liveness key expires
        a.sigstop()

        async def a_dead() -> bool:
            return not await redis.exists(keys.liveness(a.node_id))

        await poll(a_dead, 20, "A's liveness never ran out")
        # When B takes the session over meanwhile, and A then resumes
        taken = await b.client.run(request(sid, "t2"))
        assert taken.executed_by == b.node_id
        a.sigcont()

        async def a_again() -> bytes | None:
            current: bytes | None = await redis.get(keys.liveness(a.node_id))
            return current if current and current != old else None

        # Then A lives on as a new incarnation (the old one never came back), holding nothing:
        # the session's lease stays B's and a turn sent through A runs on B
        assert await poll(a_again, 20, "A never registered a new incarnation") != old
        lease = await cluster.backends.leases.current(sid)
        assert lease is not None and lease.holder == b.node_id
        after = await a.client.run(request(sid, "t3"))
        assert after.executed_by == b.node_id
