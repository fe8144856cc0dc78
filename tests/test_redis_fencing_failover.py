"""Fencing tokens across a failover that lost writes: a real primary and a replica that follows
it through the fault proxy; the replication stream is stalled while the primary issues a token
and raises a record's fence, the stalled bytes are dropped, the primary SIGKILLed and the
replica promoted. The promoted server never issues that token again, so the stale holder's
write under it is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stickless.backends.base import FencedOut, Lease
from stickless.backends.redis import RedisBackends
from stickless.local_services import RedisServer

from .faults.proxy import FaultProxy
from .redis_fixture import command, redis_executable

#: Liveness of the test's holders (seconds): far beyond the test.
ALIVE = 120.0


async def replicated(backends: RedisBackends) -> None:
    """Until the one replica acknowledged every write so far (its first sync included)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120.0
    # Each WAIT stays under the client's socket timeout; a slow first sync takes several.
    while await backends.client.wait(1, 1000) < 1:
        assert loop.time() < deadline, "the replica never caught up"


async def lease_of(backends: RedisBackends, holder: str) -> Lease:
    got = await backends.leases.acquire("s1", holder)
    assert isinstance(got, Lease), got
    return got


async def test_a_promoted_replica_never_reissues_a_token_it_did_not_receive(
    tmp_path: Path,
) -> None:
    executable = redis_executable()
    primary = RedisServer(tmp_path / "primary", executable=executable)
    primary.start()
    link = FaultProxy("127.0.0.1", primary.port).start()
    follow = ["--replicaof", "127.0.0.1", str(link.port)]
    replica = RedisServer(tmp_path / "replica", executable=executable, extra_args=follow)
    replica.start()
    old = RedisBackends.from_url(primary.url, namespace="fence")
    new = RedisBackends.from_url(replica.url, namespace="fence")
    try:
        await old.liveness.register("a", "inc-a", ALIVE)
        first = await lease_of(old, "a")
        await old.records.provision("s1", "bot", first.token)
        await replicated(old)  # the replica has all of it
        link.stall("to_client")
        # Written on the primary only: a new token, and the fence raised to it.
        assert await old.leases.release(first)
        stale = await lease_of(old, "a")
        assert stale.token > first.token
        await old.records.provision("s1", "bot", stale.token)
        assert await old.client.wait(1, 100) == 0  # the replica did not get them
        link.refuse_new()
        link.reset_all()  # what the stall held is gone with the primary
        primary.kill()
        assert command(replica.port, "REPLICAOF", "NO", "ONE") == b"+OK"
        # The promoted server still has the first lease: its holder's incarnation dies, and
        # another node takes the session.
        assert await new.liveness.retire("a", "inc-a")
        await new.liveness.register("b", "inc-b", ALIVE)
        taken = await lease_of(new, "b")
        assert taken.token > stale.token
        await new.records.provision("s1", "bot", taken.token)
        with pytest.raises(FencedOut):
            await new.records.provision("s1", "bot", stale.token)
    finally:
        await old.aclose()
        await new.aclose()
        replica.stop()
        link.stop()
        primary.stop()
