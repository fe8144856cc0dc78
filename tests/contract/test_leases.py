"""LeaseStore contract: session-lifetime leases with strictly increasing fencing tokens."""

from __future__ import annotations

from typing import Any

from stickless.backends.base import Backends, HeldElsewhere, Lease
from tests.liveness import acquire_lease

SHORT_TTL = 0.2
LONG_TTL = 30.0


async def _acquire(backends: Backends, session_id: str, holder: str, ttl: float) -> Lease:
    result = await acquire_lease(backends, session_id, holder, ttl)
    assert isinstance(result, Lease), result
    return result


async def _wait_expired(backends: Backends, session_id: str, wait_until: Any) -> None:
    async def expired() -> bool:
        return await backends.leases.current(session_id) is None

    await wait_until(expired)


async def test_acquire_free_session_grants_lease(backends: Backends) -> None:
    # Given a session nobody has leased
    assert await backends.leases.current("s1") is None
    # When node-a acquires it
    lease = await _acquire(backends, "s1", "node-a", LONG_TTL)
    # Then node-a holds it with a positive token, and current() reports it
    assert (lease.session_id, lease.holder) == ("s1", "node-a")
    assert lease.token > 0
    assert await backends.leases.current("s1") == lease


async def test_acquire_held_elsewhere_reports_the_holder(backends: Backends) -> None:
    # Given node-a holds the session
    lease = await _acquire(backends, "s1", "node-a", LONG_TTL)
    # When node-b tries to acquire it
    result = await acquire_lease(backends, "s1", "node-b", LONG_TTL)
    # Then node-b is told who holds it and under which token, and the lease is unchanged
    assert isinstance(result, HeldElsewhere)
    assert (result.holder, result.token) == ("node-a", lease.token)
    assert await backends.leases.current("s1") == lease


async def test_holder_reacquire_keeps_token_and_refreshes_expiry(backends: Backends) -> None:
    # Given node-a holds the session with a short TTL
    first = await _acquire(backends, "s1", "node-a", 5.0)
    # When node-a acquires it again with a longer TTL
    again = await _acquire(backends, "s1", "node-a", LONG_TTL)
    # Then it keeps the same token and the expiry moved later
    assert again.token == first.token
    assert again.expires_at > first.expires_at


async def test_expired_lease_goes_to_next_acquirer_with_greater_token(
    backends: Backends, wait_until: Any
) -> None:
    # Given node-a's lease has expired
    old = await _acquire(backends, "s1", "node-a", SHORT_TTL)
    await _wait_expired(backends, "s1", wait_until)
    # When node-b acquires the session
    new = await _acquire(backends, "s1", "node-b", LONG_TTL)
    # Then node-b holds it under a greater token
    assert new.holder == "node-b"
    assert new.token > old.token


async def test_expired_lease_reacquired_by_same_holder_gets_new_token(
    backends: Backends, wait_until: Any
) -> None:
    # Given node-a's lease has expired
    old = await _acquire(backends, "s1", "node-a", SHORT_TTL)
    await _wait_expired(backends, "s1", wait_until)
    # When node-a acquires the session again
    new = await _acquire(backends, "s1", "node-a", LONG_TTL)
    # Then it is a new lease with a greater token
    assert new.token > old.token


async def test_release_requires_matching_holder_and_token(backends: Backends) -> None:
    # Given node-a holds the session
    lease = await _acquire(backends, "s1", "node-a", LONG_TTL)
    # When someone releases it with another holder or another token
    other_holder = Lease("s1", "node-b", lease.token, lease.expires_at)
    other_token = Lease("s1", "node-a", lease.token + 1, lease.expires_at)
    # Then those releases fail and the lease stays; the real one succeeds once
    assert not await backends.leases.release(other_holder)
    assert not await backends.leases.release(other_token)
    assert await backends.leases.current("s1") == lease
    assert await backends.leases.release(lease)
    assert await backends.leases.current("s1") is None
    assert not await backends.leases.release(lease)


async def test_token_keeps_increasing_after_release_and_record_delete(backends: Backends) -> None:
    # Given node-a leased the session, provisioned its record, then released and deleted it
    first = await _acquire(backends, "s1", "node-a", LONG_TTL)
    await backends.records.provision("s1", "agent", first.token)
    assert await backends.leases.release(first)
    await backends.records.delete("s1")
    # When any node acquires the session again
    second = await _acquire(backends, "s1", "node-b", LONG_TTL)
    # Then the new token is greater than every earlier one
    assert second.token > first.token


async def test_tokens_are_per_session(backends: Backends) -> None:
    # Given node-a holds s1
    s1 = await _acquire(backends, "s1", "node-a", LONG_TTL)
    # When node-b acquires a different session
    s2 = await acquire_lease(backends, "s2", "node-b", LONG_TTL)
    # Then it gets the lease (sessions do not block each other)
    assert isinstance(s2, Lease)
    assert s2.holder == "node-b"
    assert await backends.leases.current("s1") == s1
