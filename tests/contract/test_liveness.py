"""Liveness contract: one key per holder incarnation carries all its leases and reservations."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stickless.backends.base import Backends, Lease, NotLive

SHORT = 0.3
LONG = 60.0


async def _hold(backends: Backends, session_id: str, holder: str = "node-x") -> Lease:
    lease = await backends.leases.acquire(session_id, holder)
    assert isinstance(lease, Lease), lease
    return lease


async def test_one_renewal_keeps_every_lease_of_the_incarnation(backends: Backends) -> None:
    # Given an incarnation with a short liveness holding three sessions
    await backends.liveness.register("node-x", "inc-1", SHORT)
    leases = [await _hold(backends, f"s{n}") for n in range(3)]
    # When it renews (one call each time) for several TTLs
    for _ in range(4):
        await asyncio.sleep(SHORT / 2)
        assert await backends.liveness.renew("node-x", "inc-1", SHORT, LONG)
    # Then every lease is still its own, under the same token
    for lease in leases:
        current = await backends.leases.current(lease.session_id)
        assert current is not None and (current.holder, current.token) == ("node-x", lease.token)


async def test_an_expired_incarnation_never_comes_back(
    backends: Backends, wait_until: Any
) -> None:
    # Given an incarnation holding a session, left to expire
    await backends.liveness.register("node-x", "inc-1", SHORT)
    old = await _hold(backends, "s1")

    async def expired() -> bool:
        return await backends.leases.current("s1") is None

    await wait_until(expired)
    # When it tries to renew
    renewed = await backends.liveness.renew("node-x", "inc-1", LONG, LONG)
    # Then it is refused, its lease stays free, and it may take nothing any more
    assert not renewed
    assert await backends.leases.current("s1") is None
    with pytest.raises(NotLive):
        await backends.leases.acquire("s1", "node-x")
    # And a new incarnation takes the session under a larger token
    await backends.liveness.register("node-x", "inc-2", LONG)
    new = await _hold(backends, "s1")
    assert new.token > old.token


async def test_a_new_incarnation_ends_the_old_one(backends: Backends) -> None:
    # Given an incarnation holding a session
    await backends.liveness.register("node-x", "inc-1", LONG)
    old = await _hold(backends, "s1")
    # When the same holder registers a new incarnation (a restart under one node id)
    await backends.liveness.register("node-x", "inc-2", LONG)
    # Then the old lease is gone, the old incarnation cannot renew, and the new one re-takes the
    # session under a new token
    assert await backends.leases.current("s1") is None
    assert not await backends.liveness.renew("node-x", "inc-1", LONG, LONG)
    new = await _hold(backends, "s1")
    assert new.token > old.token


async def test_a_live_holders_lease_is_not_taken(backends: Backends) -> None:
    # Given node-x holds a session
    await backends.liveness.register("node-x", "inc-1", LONG)
    await backends.liveness.register("node-y", "inc-y", LONG)
    lease = await _hold(backends, "s1")
    # When node-y tries to take it, then node-x's incarnation is retired and node-y tries again
    before = await backends.leases.acquire("s1", "node-y")
    assert await backends.liveness.retire("node-x", "inc-1")
    after = await backends.leases.acquire("s1", "node-y")
    # Then it was refused while node-x lived, and granted at once after
    assert not isinstance(before, Lease) and before.holder == "node-x"
    assert isinstance(after, Lease) and after.token > lease.token


async def test_retire_names_the_incarnation(backends: Backends) -> None:
    # Given a live incarnation
    await backends.liveness.register("node-x", "inc-2", LONG)
    # When another incarnation's retirement arrives (a late one), then its own
    late = await backends.liveness.retire("node-x", "inc-1")
    alive_after_late = await backends.liveness.renew("node-x", "inc-2", LONG, LONG)
    own = await backends.liveness.retire("node-x", "inc-2")
    # Then only its own ends it
    assert (late, alive_after_late, own) == (False, True, True)
    assert not await backends.liveness.retire("node-x")


async def test_dead_holders_lists_ended_incarnations_until_forgotten(
    backends: Backends, wait_until: Any
) -> None:
    # Given one holder that expires, one retired, one registered and renewed since
    await backends.liveness.register("node-x", "inc-x", SHORT)
    await backends.liveness.register("node-y", "inc-y", LONG)
    await backends.liveness.register("node-z", "inc-z", LONG)
    for holder in ("node-x", "node-y", "node-z"):
        await backends.liveness.forget(holder)  # registration marks it: the sweep clears that
    assert await backends.liveness.renew("node-x", "inc-x", SHORT, LONG)
    assert await backends.liveness.renew("node-y", "inc-y", LONG, LONG)
    assert await backends.liveness.renew("node-z", "inc-z", LONG, LONG)
    assert await backends.liveness.retire("node-y")

    async def dead() -> set[str]:
        return set(await backends.liveness.dead_holders(100)) & {"node-x", "node-y", "node-z"}

    async def both_dead() -> bool:
        return await dead() == {"node-x", "node-y"}

    # When node-x's liveness runs out
    await wait_until(both_dead)
    # Then the dead ones are listed (not the live one) until the sweep forgets them
    await backends.liveness.forget("node-x")
    assert await dead() == {"node-y"}
    await backends.liveness.forget("node-z")  # alive: not dropped
    await backends.liveness.forget("node-y")
    assert await dead() == set()
