"""Turn index contract: a reservation is found by its turn id, whatever key it is under."""

from __future__ import annotations

from typing import Any

from stickless.backends.base import Backends, ReservationState
from stickless.wire import Outcome

from ..commits import mark_done

LONG = 60.0
DAY = 86400.0


def _ok(turn_id: str) -> Outcome:
    return Outcome(turn_id=turn_id, ok=True, executed_by="node-a", text="done")


async def test_a_reserved_turn_is_found_by_its_id_in_its_session_only(backends: Backends) -> None:
    # Given a turn reserved under a client key by the hot path's reserve
    reserved = await backends.hotpath.reserve(
        "s1", "c:key", "t1", "hash-t1", "node-a", "bot", LONG, DAY
    )
    assert reserved.existing is None
    # When it is looked up by turn id, and by other ids and sessions
    found = await backends.idempotency.find_turn("s1", "t1")
    # Then its reservation is found under its key, and nothing else is
    assert found is not None
    assert (found.key, found.turn_id, found.state) == ("c:key", "t1", ReservationState.IN_FLIGHT)
    assert await backends.idempotency.find_turn("s1", "t2") is None
    assert await backends.idempotency.find_turn("s2", "t1") is None


async def test_the_found_reservation_carries_the_recorded_outcome(backends: Backends) -> None:
    # Given a turn reserved with put_if_absent and finished
    idem = backends.idempotency
    assert await idem.put_if_absent("s1", "t:t1", "t1", "hash", "node-a", LONG, DAY) is None
    assert await mark_done(backends, "s1", "t:t1", "node-a", _ok("t1"), DAY)
    # When it is looked up by turn id
    found = await idem.find_turn("s1", "t1")
    # Then the lookup sees the outcome
    assert found is not None
    assert (found.state, found.outcome) == (ReservationState.DONE, _ok("t1"))


async def test_a_turn_whose_key_a_newer_turn_took_is_not_found(backends: Backends) -> None:
    # Given a failed turn whose key was reserved again by a retry
    idem = backends.idempotency
    assert await idem.put_if_absent("s1", "c:key", "t1", "hash", "node-a", LONG, DAY) is None
    failed = Outcome(turn_id="t1", ok=False, code="FAILED", message="boom")
    assert await mark_done(backends, "s1", "c:key", "node-a", failed, DAY)
    assert await idem.put_if_absent("s1", "c:key", "t2", "hash", "node-b", LONG, DAY) is None
    # When both turns are looked up
    old, new = await idem.find_turn("s1", "t1"), await idem.find_turn("s1", "t2")
    # Then only the retry's turn is found
    assert old is None
    assert new is not None and new.turn_id == "t2"


async def test_a_discarded_turn_is_not_found(backends: Backends) -> None:
    # Given a reservation discarded (a refused submit)
    idem = backends.idempotency
    assert await idem.put_if_absent("s1", "c:key", "t1", "hash", "node-a", LONG, DAY) is None
    assert await idem.discard_reservation("s1", "c:key", "t1")
    # When it is looked up, then it is gone
    assert await idem.find_turn("s1", "t1") is None


async def test_the_index_expires_with_the_reservation(backends: Backends, wait_until: Any) -> None:
    # Given a turn reserved for a short TTL
    idem = backends.idempotency
    assert await idem.put_if_absent("s1", "c:key", "t1", "hash", "node-a", LONG, 0.2) is None
    assert await idem.find_turn("s1", "t1") is not None

    # When the TTL passes, then the turn is no longer found
    async def gone() -> bool:
        return await idem.find_turn("s1", "t1") is None

    await wait_until(gone)
