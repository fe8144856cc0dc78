"""Revocation contract: the "a peer is known dead" shortcut of fast failover.

Ending a holder's incarnation (`Liveness.retire`) frees its leases and makes its held
reservations stale at once; `LeaseStore.revoke_holder` then drops the lease hashes it left
(fencing keeps this safe: the token counter is untouched, so the next holder's token is larger
and the dead holder's late writes are refused), and `IdempotencyStore.expire_holder` makes its
IN_FLIGHT reservations due for the sweep, which resets them without waiting for any bound.
"""

from __future__ import annotations

from typing import Any

import pytest

from stickless._types import TranscriptEntry
from stickless.backends.base import (
    Backends,
    FencedOut,
    Lease,
    Reservation,
    ReservationState,
)
from stickless.wire import Outcome
from tests.liveness import acquire_lease, kill, live

from ..commits import commit_turn, mark_done

SHORT = 0.2
LONG = 60.0
DAY = 86400.0

DEAD = "node-dead"
ALIVE = "node-alive"


async def _acquire(backends: Backends, session_id: str, holder: str, ttl: float = LONG) -> Lease:
    result = await acquire_lease(backends, session_id, holder, ttl)
    assert isinstance(result, Lease), result
    return result


async def _wait_expired(backends: Backends, session_id: str, wait_until: Any) -> None:
    async def expired() -> bool:
        return await backends.leases.current(session_id) is None

    await wait_until(expired)


async def _reserve(
    backends: Backends, key: str, holder: str, *, session_id: str = "s1", turn_id: str = ""
) -> None:
    turn_id = turn_id or f"t-{key}"
    existing = await backends.idempotency.put_if_absent(
        session_id, key, turn_id, f"hash-{turn_id}", holder, LONG, DAY
    )
    assert existing is None, existing


async def _find(backends: Backends, key: str, session_id: str = "s1") -> Reservation:
    found = await backends.idempotency.find(session_id, key)
    assert found is not None
    return found


def _failed(turn_id: str) -> Outcome:
    return Outcome(turn_id=turn_id, ok=False, code="HOLDER_LOST", message="holder died")


# --------------------------------------------------------------------------- revoke_holder


async def test_revoke_returns_exactly_the_dead_holders_live_sessions(
    backends: Backends, wait_until: Any
) -> None:
    leases = backends.leases
    # Given the dead holder held two sessions, released a third and lost a fourth to another
    # holder after its liveness ran out; another holder holds a fifth
    await _acquire(backends, "s1", DEAD, SHORT)
    await _acquire(backends, "s2", DEAD, SHORT)
    assert await leases.release(await _acquire(backends, "s-released", DEAD, SHORT))
    await _acquire(backends, "s-lost", DEAD, SHORT)
    await _wait_expired(backends, "s1", wait_until)
    await _acquire(backends, "s-lost", ALIVE)
    await _acquire(backends, "s-other", ALIVE)
    # And a new incarnation of the same holder holds a sixth
    await _acquire(backends, "s-new", DEAD)
    # When its leases are revoked
    revoked = await leases.revoke_holder(DEAD)
    # Then exactly the two sessions the dead incarnation left are reported, and dropped; the
    # new incarnation's lease is kept
    assert sorted(revoked) == ["s1", "s2"]
    assert await leases.current("s1") is None
    assert await leases.current("s2") is None
    new = await leases.current("s-new")
    assert new is not None and new.holder == DEAD


async def test_after_revoke_another_holder_acquires_with_a_larger_token(
    backends: Backends,
) -> None:
    # Given the dead holder's lease on a session
    old = await _acquire(backends, "s1", DEAD)
    # When its incarnation ends, its lease is revoked and another holder acquires the session
    await kill(backends, DEAD)
    assert await backends.leases.revoke_holder(DEAD) == ["s1"]
    assert await backends.leases.current("s1") is None
    new = await _acquire(backends, "s1", ALIVE)
    # Then the new lease carries a larger token (the counter survived the revocation)
    assert new.holder == ALIVE
    assert new.token > old.token
    assert await backends.leases.current("s1") == new


async def test_dead_holders_late_writes_are_refused_after_revoke(backends: Backends) -> None:
    leases, records = backends.leases, backends.records
    entry = TranscriptEntry(role="user", content="hi")
    # Given the dead holder provisioned the session under its token and committed a turn
    old = await _acquire(backends, "s1", DEAD)
    await records.provision("s1", "agent-a", old.token)
    await commit_turn(backends, "s1", old.token, "t1", [entry])
    # When its incarnation ends and the new holder takes and provisions the session
    await kill(backends, DEAD)
    new = await _acquire(backends, "s1", ALIVE)
    await records.provision("s1", "agent-a", new.token)
    # Then the dead holder's late commit is fenced out, and its lease cannot be released any
    # more, while the new holder commits
    with pytest.raises(FencedOut):
        await commit_turn(backends, "s1", old.token, "t2", [entry])
    assert not await leases.release(old)
    await commit_turn(backends, "s1", new.token, "t3", [entry])
    view = await records.load("s1")
    assert view is not None
    assert [(e.turn_id, e.token) for e in view.entries] == [("t1", old.token), ("t3", new.token)]
    assert await leases.current("s1") == new


async def test_revoke_leaves_other_holders_leases_untouched(backends: Backends) -> None:
    # Given two holders with a session each
    await _acquire(backends, "s-dead", DEAD)
    other = await _acquire(backends, "s-alive", ALIVE)
    # When the dead one's incarnation ends and its leases are revoked
    await kill(backends, DEAD)
    await backends.leases.revoke_holder(DEAD)
    # Then the other holder's lease is as it was (same holder and token)
    current = await backends.leases.current("s-alive")
    assert current is not None and (current.holder, current.token) == (ALIVE, other.token)


async def test_revoke_is_idempotent(backends: Backends) -> None:
    # Given the dead holder's lease was revoked once
    await _acquire(backends, "s1", DEAD)
    await kill(backends, DEAD)
    assert await backends.leases.revoke_holder(DEAD) == ["s1"]
    # When it is revoked again, and a holder that never held anything is revoked
    again = await backends.leases.revoke_holder(DEAD)
    never = await backends.leases.revoke_holder("node-never")
    # Then nothing more is reported and the session stays free
    assert again == []
    assert never == []
    assert await backends.leases.current("s1") is None


# --------------------------------------------------------------------------- expire_holder


async def test_expire_holder_makes_its_reservations_stale_at_once(backends: Backends) -> None:
    idem = backends.idempotency
    # Given the dead holder's two fresh IN_FLIGHT reservations (a long staleness bound)
    await _reserve(backends, "k1", DEAD)
    await _reserve(backends, "k2", DEAD, session_id="s2")
    assert await idem.find_stale_in_flight(10) == []
    # When its incarnation ends and they are expired
    await kill(backends, DEAD)
    count = await idem.expire_holder(DEAD)
    # Then both are counted and the sweep sees them right away, still held by the dead holder
    assert count == 2
    stale = await idem.find_stale_in_flight(10)
    assert sorted((r.session_id, r.key) for r in stale) == [("s1", "k1"), ("s2", "k2")]
    assert all(r.holder == DEAD and r.stale for r in stale)
    assert all(r.state is ReservationState.IN_FLIGHT for r in stale)
    # And a retry of the key sees the existing reservation as stale
    existing = await idem.put_if_absent("s1", "k1", "t-retry", "hash-t-k1", ALIVE, LONG, DAY)
    assert existing is not None
    assert (existing.turn_id, existing.holder, existing.stale) == ("t-k1", DEAD, True)


async def test_compare_and_reset_against_the_dead_holder_wins_after_expire(
    backends: Backends,
) -> None:
    idem = backends.idempotency
    # Given the dead holder's reservation, expired
    await _reserve(backends, "k1", DEAD)
    await kill(backends, DEAD)
    assert await idem.expire_holder(DEAD) == 1
    # When the sweep resets it, expecting the dead holder
    won = await idem.compare_and_reset("s1", "k1", DEAD, _failed("t-k1"))
    # Then the reset wins, the reservation is FAILED with the outcome, no longer swept, and a
    # retry reserves the key fresh
    assert won
    found = await _find(backends, "k1")
    assert found.state is ReservationState.FAILED
    assert found.outcome is not None and found.outcome.code == "HOLDER_LOST"
    assert await idem.find_stale_in_flight(10) == []
    assert await idem.put_if_absent("s1", "k1", "t2", "h2", ALIVE, LONG, DAY) is None
    assert await idem.expire_holder(DEAD) == 0


async def test_expire_holder_leaves_other_reservations_untouched(backends: Backends) -> None:
    idem = backends.idempotency
    # Given the dead holder's IN_FLIGHT reservation, one it made holderless, one another
    # holder took over from it, one of another holder, and its own DONE and FAILED ones
    await _reserve(backends, "k-live", DEAD)
    await _reserve(backends, "k-holderless", DEAD)
    assert await idem.release_holder("s1", "k-holderless", DEAD, LONG)
    await _reserve(backends, "k-taken", DEAD)
    assert await idem.release_holder("s1", "k-taken", DEAD, LONG)
    taken = await idem.acquire_holder("s1", "k-taken", "t-k-taken", ALIVE, LONG)
    assert taken.won
    await _reserve(backends, "k-other", ALIVE)
    await _reserve(backends, "k-done", DEAD)
    done = Outcome(turn_id="t-k-done", ok=True, executed_by=DEAD, text="ok")
    assert await mark_done(backends, "s1", "k-done", DEAD, done, DAY)
    await _reserve(backends, "k-failed", DEAD)
    assert await idem.compare_and_reset("s1", "k-failed", DEAD, _failed("t-k-failed"))
    before = {key: await _find(backends, key) for key in ("k-done", "k-failed")}
    # When the dead holder's incarnation ends and its reservations are expired
    await kill(backends, DEAD)
    count = await idem.expire_holder(DEAD)
    # Then only its IN_FLIGHT one is counted and swept; the others are neither stale nor changed
    assert count == 1
    assert [r.key for r in await idem.find_stale_in_flight(10)] == ["k-live"]
    for key, holder in (("k-holderless", None), ("k-taken", ALIVE), ("k-other", ALIVE)):
        found = await _find(backends, key)
        assert (found.holder, found.state, found.stale) == (
            holder,
            ReservationState.IN_FLIGHT,
            False,
        )
    for key, was in before.items():
        assert await _find(backends, key) == was


async def test_expire_holder_counts_what_a_dead_incarnation_holds(backends: Backends) -> None:
    idem = backends.idempotency
    # Given the dead holder's reservation, expired once
    await _reserve(backends, "k1", DEAD)
    assert await idem.expire_holder(DEAD) == 0  # alive: left alone
    await kill(backends, DEAD)
    assert await idem.expire_holder(DEAD) == 1
    # When it is expired again, and a holder without reservations is expired
    again = await idem.expire_holder(DEAD)
    never = await idem.expire_holder("node-never")
    # Then it is counted again (still held by the dead incarnation), and still swept
    assert (again, never) == (1, 0)
    assert [r.key for r in await idem.find_stale_in_flight(10)] == ["k1"]


async def test_a_new_incarnation_does_not_save_the_old_ones_turns(backends: Backends) -> None:
    idem = backends.idempotency
    # Given the dead holder's reservation, expired, and the sweep about to reset it
    await _reserve(backends, "k1", DEAD)
    await kill(backends, DEAD)
    assert await idem.expire_holder(DEAD) == 1
    # When the holder comes back as a new incarnation (a paused node resuming)
    await live(backends, DEAD)
    # Then the reservation is still stale, and the reset expecting that holder wins
    assert (await _find(backends, "k1")).stale
    assert await idem.compare_and_reset("s1", "k1", DEAD, _failed("t-k1"))
    assert (await _find(backends, "k1")).state is ReservationState.FAILED
