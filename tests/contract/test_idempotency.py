"""IdempotencyStore contract: per-session reservations, holders, staleness and outcomes."""

from __future__ import annotations

import asyncio
from typing import Any

from stickless.backends.base import (
    REJECTED,
    Backends,
    Reservation,
    ReservationState,
    Takeover,
)
from stickless.wire import Outcome
from tests.liveness import kill, live

from ..commits import mark_done

SHORT = 0.2
LONG = 60.0
DAY = 86400.0


async def _reserve(
    backends: Backends,
    key: str = "k1",
    *,
    session_id: str = "s1",
    turn_id: str = "t1",
    holder: str = "node-a",
    secondary_ttl: float = LONG,
    primary_ttl: float = DAY,
) -> None:
    existing = await backends.idempotency.put_if_absent(
        session_id, key, turn_id, f"hash-{turn_id}", holder, secondary_ttl, primary_ttl
    )
    assert existing is None, existing


async def _find(backends: Backends, key: str = "k1", session_id: str = "s1") -> Reservation:
    found = await backends.idempotency.find(session_id, key)
    assert found is not None
    return found


async def _make_holderless(backends: Backends, key: str = "k1", forward_ttl: float = LONG) -> None:
    await _reserve(backends, key)
    assert await backends.idempotency.release_holder("s1", key, "node-a", forward_ttl)


def _ok(turn_id: str = "t1") -> Outcome:
    return Outcome(turn_id=turn_id, ok=True, executed_by="node-a", text="done", data={"n": 1})


def _failed(turn_id: str = "t1", code: str = "HOLDER_LOST") -> Outcome:
    return Outcome(turn_id=turn_id, ok=False, code=code, message="gone")


async def _wait_stale(backends: Backends, wait_until: Any, key: str) -> None:
    async def stale() -> bool:
        return (await _find(backends, key)).stale

    await wait_until(stale)


# --------------------------------------------------------------------------- put_if_absent / find


async def test_put_if_absent_creates_in_flight_reservation(backends: Backends) -> None:
    # Given no reservation for the key
    assert await backends.idempotency.find("s1", "k1") is None
    # When it is reserved
    await _reserve(backends)
    # Then it is IN_FLIGHT for that turn and input, held by the reserver, not stale
    found = await _find(backends)
    assert (found.session_id, found.key, found.turn_id, found.input_hash) == (
        "s1",
        "k1",
        "t1",
        "hash-t1",
    )
    assert (found.holder, found.state, found.stale, found.outcome) == (
        "node-a",
        ReservationState.IN_FLIGHT,
        False,
        None,
    )


async def test_put_if_absent_returns_existing_in_flight(backends: Backends) -> None:
    # Given an IN_FLIGHT reservation for turn t1
    await _reserve(backends)
    # When another submit tries to reserve the same key
    existing = await backends.idempotency.put_if_absent(
        "s1", "k1", "t2", "hash-t2", "node-b", LONG, DAY
    )
    # Then it gets the original reservation back, unchanged
    assert existing is not None
    assert (existing.turn_id, existing.holder, existing.state) == (
        "t1",
        "node-a",
        ReservationState.IN_FLIGHT,
    )
    assert (await _find(backends)).turn_id == "t1"


async def test_put_if_absent_returns_done_with_outcome(backends: Backends) -> None:
    # Given a DONE reservation
    await _reserve(backends)
    assert await mark_done(backends, "s1", "k1", "node-a", _ok(), DAY)
    # When the key is reserved again
    existing = await backends.idempotency.put_if_absent(
        "s1", "k1", "t2", "hash-t2", "node-b", LONG, DAY
    )
    # Then the cached outcome comes back
    assert existing is not None
    assert existing.state is ReservationState.DONE
    assert existing.outcome == _ok()


async def test_a_rerun_of_a_reserve_whose_turn_was_declared_lost_does_not_revive_it(
    backends: Backends,
) -> None:
    idem = backends.idempotency
    # Given a reserve that ran, and its turn declared lost before the reserve's reply arrived
    await _reserve(backends)
    lost = _failed()
    assert await idem.compare_and_reset("s1", "k1", "node-a", lost)
    # When the same reserve is sent again (a client retry after the lost reply)
    again = await idem.put_if_absent("s1", "k1", "t1", "hash-t1", "node-a", LONG, DAY)
    # Then it finds the turn's answer instead of reserving the turn anew
    assert again is not None
    assert (again.turn_id, again.state, again.outcome) == ("t1", ReservationState.FAILED, lost)
    assert (await _find(backends)).state is ReservationState.FAILED


async def test_failed_reservation_counts_as_absent(backends: Backends) -> None:
    # Given a reservation whose turn failed
    await _reserve(backends)
    assert await mark_done(backends, "s1", "k1", "node-a", _failed(), DAY)
    failed = await _find(backends)
    assert (failed.state, failed.outcome) == (ReservationState.FAILED, _failed())
    # When the key is reserved again for a retry
    existing = await backends.idempotency.put_if_absent(
        "s1", "k1", "t2", "hash-t2", "node-b", LONG, DAY
    )
    # Then the retry runs fresh under its own turn and holder
    assert existing is None
    retry = await _find(backends)
    assert (retry.turn_id, retry.holder, retry.state, retry.outcome) == (
        "t2",
        "node-b",
        ReservationState.IN_FLIGHT,
        None,
    )


async def test_done_past_primary_ttl_counts_as_absent(backends: Backends, wait_until: Any) -> None:
    # Given a DONE reservation kept for a short primary TTL, which then passes
    await _reserve(backends)
    assert await mark_done(backends, "s1", "k1", "node-a", _ok(), SHORT)

    async def gone() -> bool:
        return await backends.idempotency.find("s1", "k1") is None

    await wait_until(gone)
    # When the key is reserved again
    existing = await backends.idempotency.put_if_absent(
        "s1", "k1", "t2", "hash-t2", "node-b", LONG, DAY
    )
    # Then it is a fresh reservation
    assert existing is None
    assert (await _find(backends)).turn_id == "t2"


async def test_keys_are_scoped_per_session(backends: Backends) -> None:
    # Given key k1 reserved in session s1
    await _reserve(backends)
    # When the same key is reserved in session s2
    existing = await backends.idempotency.put_if_absent(
        "s2", "k1", "t9", "hash-t9", "node-b", LONG, DAY
    )
    # Then both reservations exist independently
    assert existing is None
    assert (await _find(backends, session_id="s1")).turn_id == "t1"
    assert (await _find(backends, session_id="s2")).turn_id == "t9"


# --------------------------------------------------------------------------- staleness


async def test_held_reservation_lives_with_its_holder_without_touches(
    backends: Backends, wait_until: Any
) -> None:
    # Given a reservation of node-a made with a short secondary TTL, node-a alive
    await _reserve(backends, secondary_ttl=SHORT)
    # When the bound passes with nobody touching it
    await asyncio.sleep(SHORT * 2)
    # Then it is not stale: a held reservation lives as long as its holder's incarnation
    assert not (await _find(backends)).stale
    assert await backends.idempotency.find_stale_in_flight(10) == []


async def test_reservation_of_a_dead_incarnation_is_stale_at_once(backends: Backends) -> None:
    # Given reservations of node-a and node-b, with long bounds
    await _reserve(backends, "of-a")
    await _reserve(backends, "of-b", holder="node-b")
    # When node-a's incarnation ends
    await kill(backends, "node-a")
    # Then node-a's is stale at once (no bound waited for), node-b's is not
    assert (await _find(backends, "of-a")).stale
    assert not (await _find(backends, "of-b")).stale
    # And the sweep finds it once the dead holder's reservations are made due
    assert await backends.idempotency.expire_holder("node-a") == 1
    assert await backends.idempotency.expire_holder("node-b") == 0
    stale = await backends.idempotency.find_stale_in_flight(10)
    assert [(r.key, r.holder, r.stale) for r in stale] == [("of-a", "node-a", True)]


async def test_a_new_incarnation_does_not_revive_the_old_ones_reservations(
    backends: Backends,
) -> None:
    # Given a reservation of node-a's incarnation
    await _reserve(backends, "old")
    # When node-a starts a new incarnation (a restart, or a liveness that lapsed)
    await kill(backends, "node-a")
    await live(backends, "node-a")
    await _reserve(backends, "new")
    # Then the old one stays stale and the new one is alive
    assert (await _find(backends, "old")).stale
    assert not (await _find(backends, "new")).stale


async def test_reservation_of_a_holder_with_no_incarnation_is_stale(backends: Backends) -> None:
    # When a node that never registered reserves a key
    await _reserve(backends, holder="node-never")
    # Then the reservation is stale from the start
    assert (await _find(backends)).stale


async def test_holderless_reservation_is_stale_only_after_forward_ttl(
    backends: Backends, wait_until: Any
) -> None:
    # Given a holderless reservation released with a long forward TTL and one with a short one
    await _reserve(backends, "queued", secondary_ttl=SHORT)
    assert await backends.idempotency.release_holder("s1", "queued", "node-a", LONG)
    await _reserve(backends, "short")
    assert await backends.idempotency.release_holder("s1", "short", "node-a", SHORT)
    # When the short bound passes
    await _wait_stale(backends, wait_until, "short")
    # Then the long one is not stale yet
    queued = await _find(backends, "queued")
    assert (queued.holder, queued.stale) == (None, False)


async def test_holderless_reservation_goes_stale_after_short_forward_ttl(
    backends: Backends, wait_until: Any
) -> None:
    # Given a holderless reservation released with a short forward TTL
    await _make_holderless(backends, forward_ttl=SHORT)
    # When the forward TTL passes
    await _wait_stale(backends, wait_until, "k1")
    # Then the sweep finds it without a holder
    stale = await backends.idempotency.find_stale_in_flight(10)
    assert [(r.key, r.holder) for r in stale] == [("k1", None)]


async def test_acquire_holder_holds_under_the_taker_incarnation(backends: Backends) -> None:
    # Given a holderless reservation with a short forward TTL
    await _make_holderless(backends, forward_ttl=SHORT)
    # When node-b takes it over
    won = await backends.idempotency.acquire_holder("s1", "k1", "t1", "node-b", SHORT)
    assert won.won
    # Then it lives past the bound while node-b lives, and is stale once node-b is dead
    await asyncio.sleep(SHORT * 2)
    found = await _find(backends)
    assert (found.holder, found.stale) == ("node-b", False)
    await kill(backends, "node-b")
    assert (await _find(backends)).stale


async def test_find_stale_in_flight_respects_limit_and_skips_finished(backends: Backends) -> None:
    # Given three stale IN_FLIGHT reservations (their holder dead) and one that finished
    for key in ("a", "b", "c", "done"):
        await _reserve(backends, key, holder="node-c")
    assert await mark_done(backends, "s1", "done", "node-c", _ok(), DAY)
    await kill(backends, "node-c")
    await backends.idempotency.expire_holder("node-c")
    # When the sweep asks for two, then for all
    two = await backends.idempotency.find_stale_in_flight(2)
    everything = await backends.idempotency.find_stale_in_flight(10)
    # Then it gets two, and never the finished one
    assert len(two) == 2
    assert {r.key for r in two} <= {"a", "b", "c"}
    assert sorted(r.key for r in everything) == ["a", "b", "c"]


# --------------------------------------------------------------------------- holders


async def test_acquire_holder_wins_only_holderless_in_flight(backends: Backends) -> None:
    # Given a holderless, a held, a DONE, a FAILED and a missing reservation
    await _make_holderless(backends, "holderless")
    await _reserve(backends, "held")
    await _reserve(backends, "done")
    assert await mark_done(backends, "s1", "done", "node-a", _ok(), DAY)
    await _reserve(backends, "failed")
    assert await mark_done(backends, "s1", "failed", "node-a", _failed(), DAY)
    # When node-b (and node-a, for the one it holds) try to take each over
    results = {
        key: await backends.idempotency.acquire_holder("s1", key, "t1", "node-b", LONG)
        for key in ("holderless", "held", "done", "failed", "missing")
    }
    same_holder = await backends.idempotency.acquire_holder("s1", "held", "t1", "node-a", LONG)
    # Then only the holderless one is won, and it is now held by node-b; the holder asking
    # again for its own (a retry after a lost reply) keeps it
    assert results == {
        "holderless": Takeover(attempt=1),
        "held": REJECTED,
        "done": REJECTED,
        "failed": REJECTED,
        "missing": REJECTED,
    }
    assert same_holder == Takeover(attempt=1)
    assert (await _find(backends, "holderless")).holder == "node-b"
    assert (await _find(backends, "held")).holder == "node-a"


async def test_concurrent_acquire_holder_has_one_winner(backends: Backends) -> None:
    # Given a holderless reservation
    await _make_holderless(backends)
    # When two nodes take it over concurrently
    results = await asyncio.gather(
        backends.idempotency.acquire_holder("s1", "k1", "t1", "node-b", LONG),
        backends.idempotency.acquire_holder("s1", "k1", "t1", "node-c", LONG),
    )
    # Then exactly one wins, and the reservation names the winner
    assert sorted(r.won for r in results) == [False, True]
    winner = ["node-b", "node-c"][[r.won for r in results].index(True)]
    assert (await _find(backends)).holder == winner


async def test_release_holder_only_by_the_holder_of_in_flight(backends: Backends) -> None:
    # Given a reservation held by node-a and a DONE one
    await _reserve(backends)
    await _reserve(backends, "done")
    assert await mark_done(backends, "s1", "done", "node-a", _ok(), DAY)
    # When node-b, then node-a release the first, and node-a releases the DONE one
    by_other = await backends.idempotency.release_holder("s1", "k1", "node-b", LONG)
    by_holder = await backends.idempotency.release_holder("s1", "k1", "node-a", LONG)
    on_done = await backends.idempotency.release_holder("s1", "done", "node-a", LONG)
    # Then only the holder's release of the IN_FLIGHT one succeeds, leaving it holderless
    assert (by_other, by_holder, on_done) == (False, True, False)
    found = await _find(backends)
    assert (found.holder, found.state) == (None, ReservationState.IN_FLIGHT)
    assert not await backends.idempotency.release_holder("s1", "k1", "node-a", LONG)


# --------------------------------------------------------------------------- outcomes


async def test_mark_done_by_holder_records_outcome(backends: Backends) -> None:
    # Given a reservation held by node-a
    await _reserve(backends)
    # When node-a marks it done
    marked = await mark_done(backends, "s1", "k1", "node-a", _ok(), DAY)
    # Then it is DONE with the outcome, and cannot be marked again
    assert marked
    found = await _find(backends)
    assert (found.state, found.outcome, found.stale) == (ReservationState.DONE, _ok(), False)
    assert not await mark_done(backends, "s1", "k1", "node-a", _failed(), DAY)
    assert (await _find(backends)).outcome == _ok()


async def test_mark_done_refused_for_other_holder_or_turn(backends: Backends) -> None:
    # Given a reservation held by node-a for turn t1
    await _reserve(backends)
    # When node-b marks it, node-a marks it for another turn, and anyone marks a missing key
    by_other = await mark_done(backends, "s1", "k1", "node-b", _ok(), DAY)
    wrong_turn = await mark_done(backends, "s1", "k1", "node-a", _ok("t2"), DAY)
    missing = await mark_done(backends, "s1", "nope", "node-a", _ok(), DAY)
    # Then all are refused and the reservation is still IN_FLIGHT
    assert (by_other, wrong_turn, missing) == (False, False, False)
    assert (await _find(backends)).state is ReservationState.IN_FLIGHT


async def test_mark_done_accepted_on_holderless_reservation(backends: Backends) -> None:
    # Given a holderless reservation (queued in the inbox)
    await _make_holderless(backends)
    # When some node records its outcome
    marked = await mark_done(backends, "s1", "k1", "node-b", _failed(), DAY)
    # Then it is accepted and the reservation is FAILED
    assert marked
    assert (await _find(backends)).state is ReservationState.FAILED


async def test_compare_and_reset_requires_expected_holder(backends: Backends) -> None:
    # Given a reservation held by node-a
    await _reserve(backends)
    # When it is reset expecting node-b, expecting no holder, then expecting node-a
    wrong = await backends.idempotency.compare_and_reset("s1", "k1", "node-b", _failed())
    holderless = await backends.idempotency.compare_and_reset("s1", "k1", None, _failed())
    right = await backends.idempotency.compare_and_reset("s1", "k1", "node-a", _failed())
    # Then only the matching reset wins, leaving FAILED with the outcome
    assert (wrong, holderless, right) == (False, False, True)
    found = await _find(backends)
    assert (found.state, found.outcome) == (ReservationState.FAILED, _failed())


async def test_compare_and_reset_of_holderless_and_finished(backends: Backends) -> None:
    # Given a holderless reservation and a DONE one
    await _make_holderless(backends)
    await _reserve(backends, "done")
    assert await mark_done(backends, "s1", "done", "node-a", _ok(), DAY)
    # When both are reset expecting no holder / their last holder
    holderless = await backends.idempotency.compare_and_reset("s1", "k1", None, _failed())
    finished = await backends.idempotency.compare_and_reset("s1", "done", "node-a", _failed())
    # Then the holderless one is reset and the DONE one is untouched
    assert (holderless, finished) == (True, False)
    assert (await _find(backends)).state is ReservationState.FAILED
    assert (await _find(backends, "done")).outcome == _ok()


async def test_compare_and_reset_only_resets_the_turn_it_names(backends: Backends) -> None:
    # Given a reservation made for turn t1
    await _reserve(backends)
    # When a decision about another attempt under the same key tries to reset it
    other = await backends.idempotency.compare_and_reset("s1", "k1", "node-a", _failed("t0"))
    # Then the reservation of t1 is untouched
    assert other is False
    assert (await _find(backends)).state is ReservationState.IN_FLIGHT


async def test_concurrent_compare_and_reset_has_one_winner(backends: Backends) -> None:
    # Given a reservation held by a node that died
    await _reserve(backends)
    # When two sweepers reset it concurrently
    results = await asyncio.gather(
        backends.idempotency.compare_and_reset("s1", "k1", "node-a", _failed(code="HOLDER_LOST")),
        backends.idempotency.compare_and_reset("s1", "k1", "node-a", _failed(code="OTHER")),
    )
    # Then exactly one wins, and its outcome is the one recorded
    assert sorted(results) == [False, True]
    expected = "HOLDER_LOST" if results[0] else "OTHER"
    outcome = (await _find(backends)).outcome
    assert outcome is not None
    assert outcome.code == expected


async def test_discard_reservation_only_in_flight_for_that_turn(backends: Backends) -> None:
    # Given an IN_FLIGHT reservation for t1 and a DONE one
    await _reserve(backends)
    await _reserve(backends, "done")
    assert await mark_done(backends, "s1", "done", "node-a", _ok(), DAY)
    # When it is discarded for another turn, the DONE one discarded, then the right turn
    wrong_turn = await backends.idempotency.discard_reservation("s1", "k1", "t2")
    finished = await backends.idempotency.discard_reservation("s1", "done", "t1")
    right = await backends.idempotency.discard_reservation("s1", "k1", "t1")
    # Then only the last one removes it
    assert (wrong_turn, finished, right) == (False, False, True)
    assert await backends.idempotency.find("s1", "k1") is None
    assert (await _find(backends, "done")).state is ReservationState.DONE


async def test_discard_spares_a_reservation_a_holder_took_over(backends: Backends) -> None:
    # Given a submitter's reservation made holderless (its message queued), then taken over by
    # the holder that collected the message, and another one still holderless
    await _reserve(backends)
    await _reserve(backends, "queued", turn_id="t2")
    for key in ("k1", "queued"):
        assert await backends.idempotency.release_holder("s1", key, "node-a", LONG)
    await live(backends, "node-b")
    assert (await backends.idempotency.acquire_holder("s1", "k1", "t1", "node-b", LONG)).won
    # When the submitter discards both (its submit failed with the outcome unknown)
    taken = await backends.idempotency.discard_reservation("s1", "k1", "t1")
    queued = await backends.idempotency.discard_reservation("s1", "queued", "t2")
    # Then the one a holder may be running stays (a retry follows it), the untaken one goes
    assert (taken, queued) == (False, True)
    assert (await _find(backends)).holder == "node-b"
    assert await backends.idempotency.find("s1", "queued") is None


async def test_acquire_holder_refuses_a_reservation_of_another_turn(backends: Backends) -> None:
    # Given a holderless reservation made for turn t2 (a newer attempt with the same key)
    await _reserve(backends, "k1", turn_id="t2")
    assert await backends.idempotency.release_holder("s1", "k1", "node-a", LONG)
    # When an older message for turn t1 of that key tries to take it over
    stale = await backends.idempotency.acquire_holder("s1", "k1", "t1", "node-b", LONG)
    # Then it is refused, and the newer attempt can still take it
    assert stale == REJECTED
    fresh = await backends.idempotency.acquire_holder("s1", "k1", "t2", "node-b", LONG)
    assert fresh.won


async def test_a_hold_of_an_ended_incarnation_is_not_the_holders_own(backends: Backends) -> None:
    # Given node-a's reservation, then node-a's incarnation ends and it starts a new one
    await _reserve(backends)
    await kill(backends, "node-a")
    await live(backends, "node-a")
    # When node-a takes it over (a turn it reserved before a pause, placed after)
    taken = await backends.idempotency.acquire_holder("s1", "k1", "t1", "node-a", LONG)
    # Then that is not the same call made again: the dead hold is not node-a's to run
    assert taken == REJECTED
    assert (await _find(backends)).stale
