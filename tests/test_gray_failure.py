"""Gray failure: a node whose command path to Redis stalls (its command pool's connections stop
answering, while its renewer's connections and its pub/sub connection stay healthy) stops
vouching for its sessions, which become free as after a crash; one that is merely slow keeps
them (see "Node liveness" in docs/architecture.md).

Node processes over a real redis-server, each behind a `FaultProxy` of its own (tests/faults/)
that stalls or delays only the connections of the node's command pool (named
`stickless:commands`, see `RedisBackends.from_url`).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stickless import FailureCode, RouterConfig, TurnFailedError

from .faults import FaultProxy
from .mp_cluster import MpCluster, poll
from .redis_fixture import RedisServer
from .storm.faults import ProxyPool
from .test_multiprocess import assert_fenced_and_unsplit, node_logs, request, transcript

#: The connection name of a node's command pool (not its renewer's, not its pub/sub one).
COMMANDS = "stickless:commands"
#: Long enough for every caller here, short enough for a forward that never runs to fail the
#: test: a submit that the stalled node keeps hostage is answered FORWARD_TIMEOUT.
FORWARD_TTL = 30.0

__all__ = ["node_logs"]


@pytest.fixture
async def proxied(
    redis_server: RedisServer, redis_url: str, node_logs: Path
) -> AsyncIterator[tuple[MpCluster, ProxyPool]]:
    """Three node processes, each behind a proxy of its own."""
    pool = ProxyPool(redis_server)
    try:
        async with MpCluster(
            redis_url, node_logs, node_url=pool.open, forward_ttl=FORWARD_TTL
        ) as cluster:
            yield cluster, pool
    finally:
        errors = pool.close()
    assert errors == [], errors


def config_of(cluster: MpCluster) -> RouterConfig:
    """The RouterConfig of the cluster's node processes."""
    return RouterConfig(**cluster.config)


async def incarnation_of(cluster: MpCluster, node_id: str) -> bytes | None:
    live: bytes | None = await cluster.redis.get(cluster.backends.keys.liveness(node_id))
    return live


@pytest.mark.timeout(150)
async def test_a_node_whose_command_path_stalls_lets_its_sessions_go(
    proxied: tuple[MpCluster, ProxyPool],
) -> None:
    cluster, pool = proxied
    a, b, _ = cluster.nodes
    proxy: FaultProxy = pool.proxies[a.node_id]
    sid = "gray"
    warm = await a.client.run(request(sid, "warm"))
    assert warm.executed_by == a.node_id
    before = await incarnation_of(cluster, a.node_id)
    # Given A runs a turn (held at a gate) whose caller waits on B
    held = await b.client.submit(request(sid, "held", "gate:gray-held"))
    assert (await cluster.started(sid, held["turn_id"])).node == a.node_id
    finishes = proxy.script_runs()["turn_finish"]
    # When A's command path stalls (its renewals and its pub/sub connection stay healthy),
    # and the held turn then ends on A: its finish is caught in the stall
    stall = proxy.stall("both", client=COMMANDS)
    await cluster.open_gate("gray-held")
    await cluster.ended(sid, held["turn_id"])
    # Then a submit through B completes on another node while A is still stalled
    taken = await asyncio.wait_for(b.client.run(request(sid, "taken")), 2 * FORWARD_TTL)
    assert taken.executed_by != a.node_id
    # ...and the held turn is answered as lost with its holder
    with pytest.raises(TurnFailedError) as lost:
        await asyncio.wait_for(b.client.result(held["turn_id"]), FORWARD_TTL)
    assert lost.value.code is FailureCode.HOLDER_LOST
    # When A's command path comes back
    stall.release()
    # Then A's late finish of the held turn reaches Redis and is refused: nothing of it landed
    await proxy.wait_until(
        lambda: proxy.script_runs()["turn_finish"] > finishes, within=FORWARD_TTL
    )
    assert assert_fenced_and_unsplit(await transcript(cluster, sid)) == [
        warm.turn_id,
        taken.turn_id,
    ]
    # ...and no turn ran twice
    log = await cluster.log_entries(sid)
    assert Counter(e.turn_id for e in log if e.ev == "start") == {
        warm.turn_id: 1,
        held["turn_id"]: 1,
        taken.turn_id: 1,
    }

    # And A rejoins as a new incarnation, and takes sessions again through the normal claim
    async def rejoined() -> bytes | None:
        now = await incarnation_of(cluster, a.node_id)
        return now if now is not None and now != before else None

    await poll(rejoined, FORWARD_TTL, "A never registered a new incarnation")
    again = await asyncio.wait_for(a.client.run(request("gray-2", "again")), FORWARD_TTL)
    assert again.executed_by == a.node_id


@pytest.mark.timeout(150)
async def test_a_node_whose_command_path_is_slow_keeps_its_sessions(
    proxied: tuple[MpCluster, ProxyPool],
) -> None:
    cluster, pool = proxied
    config = config_of(cluster)
    a, b, _ = cluster.nodes
    proxy: FaultProxy = pool.proxies[a.node_id]
    sid = "slow"
    await a.client.run(request(sid, "warm"))
    lease = await cluster.backends.leases.current(sid)
    assert lease is not None and lease.holder == a.node_id
    before = await incarnation_of(cluster, a.node_id)
    # Given A's command path answers slowly, but within the bound: a round trip takes a sixth
    # of `command_path_timeout` (so a new connection's handshake and first command do too)
    delay = proxy.delay("both", config.command_path_timeout / 12, client=COMMANDS)
    # When it stays slow for longer than a stalled node takes to let its sessions go (the
    # bound, then its liveness running out, then a sweep), counted in B's dead-holder sweeps
    sweeps = pool.proxies[b.node_id]
    letting_go = config.command_path_timeout + config.lease_ttl + config.holder_loss_sweep_interval
    due = (
        sweeps.script_runs()["live_dead"]
        + 1
        + math.ceil(letting_go / config.holder_loss_sweep_interval)
    )
    await sweeps.wait_until(lambda: sweeps.script_runs()["live_dead"] >= due, within=60)
    # Then A still holds the session (same incarnation, same lease) and runs a turn sent
    # through B
    result = await asyncio.wait_for(b.client.run(request(sid, "through-b")), FORWARD_TTL)
    assert result.executed_by == a.node_id
    still = await cluster.backends.leases.current(sid)
    assert still is not None and (still.holder, still.token) == (lease.holder, lease.token)
    assert await incarnation_of(cluster, a.node_id) == before
    delay.release()
