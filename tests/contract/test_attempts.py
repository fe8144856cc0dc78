"""IdempotencyStore contract for attempts: take-overs number them, a durable copy lets a later
holder run a lost one again, a retry waits out its backoff, and a stale attempt cannot answer."""

from __future__ import annotations

from typing import Any

from stickless._errors import FailureCode
from stickless._types import Priority, UserInput
from stickless.backends.base import REJECTED, Backends, Reservation, Takeover
from stickless.wire import Envelope, Outcome
from tests.liveness import kill

from ..commits import mark_done
from .test_idempotency import DAY, LONG, SHORT, _find, _make_holderless, _reserve

TOKEN = 7


def _envelope(turn_id: str = "t1") -> bytes:
    return Envelope(
        session_id="s1",
        turn_id=turn_id,
        agent_ref="bot",
        input=UserInput.text("hi"),
        priority=Priority.LATER,
        key="k1",
    ).encode()


def _ok(turn_id: str = "t1", by: str = "node-a") -> Outcome:
    return Outcome(turn_id=turn_id, ok=True, executed_by=by, text="done")


async def _pending_ids(backends: Backends, token: int) -> list[str]:
    """Message ids a full collect under a newer lease takes back (then acked, so it is a peek
    that leaves nothing pending; only for the end of a test)."""
    batch = await backends.inbox.collect("s1", Priority.LATER, token + 1)
    return [m.message_id for m in batch.messages]


async def test_take_overs_number_the_attempts(backends: Backends) -> None:
    idem = backends.idempotency
    # Given a forwarded (holderless) reservation never started
    await _make_holderless(backends)
    # When a holder takes it over, asks again (a lost reply), and a retry makes it holderless
    first = await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG)
    again = await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG)
    parked = await idem.schedule_retry(
        "s1", "k1", "t1", "node-b", TOKEN, _envelope(), 1, "boom", 0.0, LONG
    )
    second = await idem.acquire_holder("s1", "k1", "t1", "node-c", LONG)
    # Then the first take-over runs attempt 1 (the repeat too), the next one attempt 2
    assert (first, again, second) == (Takeover(attempt=1), Takeover(attempt=1), Takeover(2))
    assert parked is not None
    found = await _find(backends)
    assert (found.attempt, found.holder, found.durable) == (2, "node-c", True)
    assert [(h.attempt, h.node, h.error) for h in found.history] == [(1, "node-b", "boom")]


async def test_a_retry_is_not_taken_over_before_its_backoff_is_over(
    backends: Backends, wait_until: Any
) -> None:
    idem = backends.idempotency
    await _reserve(backends)
    # Given a retry scheduled after attempt 1 of a turn its submitter ran
    message_id = await idem.schedule_retry(
        "s1", "k1", "t1", "node-a", TOKEN, _envelope(), 1, "boom", SHORT, LONG
    )
    assert message_id is not None
    # Then the same call made again answers the same copy, and a take-over is told to wait
    assert (
        await idem.schedule_retry(
            "s1", "k1", "t1", "node-a", TOKEN, _envelope(), 1, "boom", SHORT, LONG
        )
        == message_id
    )
    early = await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG, message_id=message_id)
    assert not early.won and 0 < early.wait <= SHORT
    # And once the backoff is over it is won as attempt 2
    taken: list[Takeover] = []

    async def won() -> bool:
        taken.append(await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG))
        return taken[-1].won

    await wait_until(won)
    assert taken[-1] == Takeover(attempt=2)
    # And the message is pending, for a successor to collect should this holder die
    assert await _pending_ids(backends, TOKEN) == [message_id]


async def test_a_retry_of_an_attempt_the_holder_does_not_hold_is_refused(
    backends: Backends,
) -> None:
    idem = backends.idempotency
    await _reserve(backends)
    # A wrong attempt number, another holder, another turn: nothing is written
    for holder, turn, attempt in (("node-a", "t1", 2), ("node-b", "t1", 1), ("node-a", "t2", 1)):
        refused = await idem.schedule_retry(
            "s1", "k1", turn, holder, TOKEN, _envelope(turn), attempt, "boom", 0.0, LONG
        )
        assert refused is None
    found = await _find(backends)
    assert (found.holder, found.attempt, found.history, found.durable) == ("node-a", 0, (), False)
    assert await backends.inbox.is_empty("s1")


async def test_a_stale_holder_with_a_durable_copy_is_taken_over_as_the_next_attempt(
    backends: Backends, wait_until: Any
) -> None:
    idem = backends.idempotency
    # Given a turn its submitter runs with a durable copy, then dies
    await _reserve(backends, secondary_ttl=SHORT)
    held = await idem.hold("s1", "k1", "t1", "node-a", TOKEN, _envelope())
    assert held is not None and (await _find(backends)).durable
    # Then before it is stale a successor allowed to steal is told to wait, one not allowed
    # (steal_below 0, the "fail" policy) is rejected
    early = await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG, steal_below=3)
    assert not early.won and early.wait > 0
    assert await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG) == REJECTED
    # And once stale it is taken as attempt 2, naming the attempt lost and its holder
    await kill(backends, "node-a")
    taken = await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG, steal_below=3)
    assert taken == Takeover(attempt=2, lost=1, lost_by="node-a")
    found = await _find(backends)
    assert (found.holder, found.attempt) == ("node-b", 2)
    assert [(h.attempt, h.node) for h in found.history] == [(1, "node-a")]


async def test_a_lost_attempt_is_not_run_again_past_the_maximum_or_without_a_copy(
    backends: Backends, wait_until: Any
) -> None:
    idem = backends.idempotency
    # Given two stale holders: one with a durable copy, one without
    await _reserve(backends, "copied", secondary_ttl=SHORT)
    await _reserve(backends, "bare", secondary_ttl=SHORT)
    assert await idem.hold("s1", "copied", "t1", "node-a", TOKEN, _envelope()) is not None
    await kill(backends, "node-a")
    # Then without a copy, or with attempt 1 already the maximum, nobody takes them over
    assert await idem.acquire_holder("s1", "bare", "t1", "node-b", LONG, steal_below=3) == REJECTED
    assert (
        await idem.acquire_holder("s1", "copied", "t1", "node-b", LONG, steal_below=1) == REJECTED
    )
    assert await idem.requeue_lost("s1", "bare", "t1", "node-a", "gone", 3, LONG) == 0
    assert await idem.requeue_lost("s1", "copied", "t1", "node-a", "gone", 1, LONG) == 0
    assert (await _find(backends, "copied")).holder == "node-a"


async def test_requeue_gives_a_lost_attempt_back_for_the_next_holder(
    backends: Backends, wait_until: Any
) -> None:
    idem = backends.idempotency
    await _reserve(backends, secondary_ttl=SHORT)
    assert await idem.hold("s1", "k1", "t1", "node-a", TOKEN, _envelope()) is not None
    # When the sweep gives the lost attempt back (twice: a rerun after a lost reply)
    assert await idem.requeue_lost("s1", "k1", "t1", "node-a", "gone", 3, LONG) == 1
    assert await idem.requeue_lost("s1", "k1", "t1", "node-a", "gone", 3, LONG) == 1
    # Then it is holderless, not stale, and the next take-over runs attempt 2
    found: Reservation = await _find(backends)
    assert (found.holder, found.stale, [h.error for h in found.history]) == (None, False, ["gone"])
    assert await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG) == Takeover(attempt=2)


async def test_a_stale_attempt_cannot_answer_once_another_took_over(
    backends: Backends, wait_until: Any
) -> None:
    idem = backends.idempotency
    await _reserve(backends, secondary_ttl=SHORT)
    await backends.records.provision("s1", "bot", TOKEN)
    assert await idem.hold("s1", "k1", "t1", "node-a", TOKEN, _envelope()) is not None
    await kill(backends, "node-a")
    assert (await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG, steal_below=3)).won
    # When the lost attempt 1 answers late, and a node answers for a wrong attempt
    late = await mark_done(backends, "s1", "k1", "node-a", _ok(by="node-a"), DAY, attempt=1)
    wrong = await mark_done(backends, "s1", "k1", "node-b", _ok(by="node-b"), DAY, attempt=1)
    # Then both are refused, and attempt 2's answer is recorded
    assert (late, wrong) == (False, False)
    assert await mark_done(backends, "s1", "k1", "node-b", _ok(by="node-b"), DAY, attempt=2)
    found = await _find(backends)
    assert found.outcome is not None and found.outcome.executed_by == "node-b"


async def test_an_attempt_answers_only_while_held(backends: Backends) -> None:
    # Given a reservation made holderless (forwarded): an answer for a started attempt is
    # refused (no attempt runs holderless), an answer for a turn that never started is not
    await _make_holderless(backends)
    assert not await mark_done(backends, "s1", "k1", "node-a", _ok(), DAY, attempt=1)
    assert await mark_done(backends, "s1", "k1", "node-a", _ok(), DAY)


async def test_an_answered_turn_is_never_taken_over_again(
    backends: Backends, wait_until: Any
) -> None:
    idem = backends.idempotency
    # Given a turn with a durable copy whose answer is recorded, the copy never acknowledged
    await _reserve(backends, secondary_ttl=SHORT)
    assert await idem.hold("s1", "k1", "t1", "node-a", TOKEN, _envelope()) is not None
    assert await mark_done(backends, "s1", "k1", "node-a", _ok(), DAY, attempt=1)
    # Then a successor collecting the copy, however late, cannot run it again
    taken = await idem.acquire_holder("s1", "k1", "t1", "node-b", LONG, steal_below=3)
    assert taken == REJECTED
    assert await idem.requeue_lost("s1", "k1", "t1", "node-a", "gone", 3, LONG) == 0
    found = await _find(backends)
    assert (found.holder, found.attempt, found.history) == ("node-a", 0, ())


async def test_a_not_run_answer_is_refused_once_an_attempt_started(backends: Backends) -> None:
    idem = backends.idempotency
    withdrawn = Outcome.failure("t1", FailureCode.FORWARD_TIMEOUT, "not run: still queued")
    # Given two holderless reservations: one never taken over, one between attempts (its first
    # attempt failed and a retry waits out its backoff)
    await _make_holderless(backends, "queued")
    await _reserve(backends, "retrying")
    parked = await idem.schedule_retry(
        "s1", "retrying", "t1", "node-a", TOKEN, _envelope(), 1, "boom", LONG, LONG
    )
    assert parked is not None
    # Then a "not run" withdraw wins only on the one that never started
    assert not await idem.compare_and_reset("s1", "retrying", None, withdrawn, unstarted_only=True)
    assert await idem.compare_and_reset("s1", "queued", None, withdrawn, unstarted_only=True)
    assert (await _find(backends, "retrying")).outcome is None


async def test_a_give_back_and_a_retry_never_take_each_others_write_for_their_own(
    backends: Backends,
) -> None:
    idem = backends.idempotency
    # Given attempt 1 given back by a sweep (lost), then a retry scheduled for the same attempt
    await _reserve(backends, "requeued")
    assert await idem.hold("s1", "requeued", "t1", "node-a", TOKEN, _envelope()) is not None
    assert await idem.requeue_lost("s1", "requeued", "t1", "node-a", "gone", 3, LONG) == 1
    # Then the retry is refused (no backoff is skipped by mistaking the give-back for itself)
    assert (
        await idem.schedule_retry(
            "s1", "requeued", "t1", "node-a", TOKEN, _envelope(), 1, "boom", LONG, LONG
        )
        is None
    )
    # And given a retry scheduled, a late give-back of that attempt is refused
    await _reserve(backends, "retried")
    parked = await idem.schedule_retry(
        "s1", "retried", "t1", "node-a", TOKEN, _envelope(), 1, "boom", LONG, LONG
    )
    assert parked is not None
    assert await idem.requeue_lost("s1", "retried", "t1", "node-a", "gone", 3, LONG) == 0
