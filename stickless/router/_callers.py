"""The callers waiting on this node: decisions about them, without I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .._errors import FailureCode, RouterClosedError, TurnFailedError
from .._trace import TraceContext
from .._types import TurnResult
from ..backends.base import Reservation
from ..wire import Outcome


@dataclass(eq=False)
class Forward:
    """A turn that runs (or will run) elsewhere, followed by callers on this node."""

    session_id: str
    key: str
    turn_id: str
    deadline: float
    #: Token of the lease the turn runs under; only an EVICT of that lease or a later one fails it.
    token: int
    #: The span its frames name when this node ends it unrun (None: no trace reached it).
    trace: TraceContext | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


@dataclass(eq=False, slots=True)
class _Waiter:
    future: asyncio.Future[TurnResult]
    session_id: str
    #: True when the caller follows the turn from afar (a forward's deadline applies to it).
    forwarded: bool
    #: True for a `router.result` lookup: never made forwarded, so no forward deadline fails
    #: it (it waits for the stored answer, however long the turn takes).
    watching: bool = False


class CallerTable:
    """Futures of callers waiting on turns, and the forwards among them with their deadlines.

    A forward's deadline is a timer, not a poll: when it passes, the forwarded callers of the
    turn get FORWARD_TIMEOUT at once, whatever the store is doing, and `on_expired` is told so the
    router can withdraw the message. Callers of a turn that runs on this node are never failed
    by a deadline.
    """

    def __init__(self, forward_ttl: float, on_expired: Callable[[Forward], None]) -> None:
        self._forward_ttl = forward_ttl
        self._on_expired = on_expired
        self._waiters: dict[str, list[_Waiter]] = {}
        self._forwards: dict[str, Forward] = {}

    def add(self, turn_id: str, session_id: str) -> asyncio.Future[TurnResult]:
        """Register a caller of a new turn (before any I/O, so no answer can be missed)."""
        future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume_exception)
        self.follow(turn_id, future, session_id, forwarded=False)
        return future

    def follow(
        self,
        turn_id: str,
        future: asyncio.Future[TurnResult],
        session_id: str,
        *,
        forwarded: bool,
    ) -> None:
        """Make an existing caller's future wait on `turn_id`."""
        self._waiters.setdefault(turn_id, []).append(_Waiter(future, session_id, forwarded))

    def watch(self, turn_id: str, session_id: str) -> asyncio.Future[TurnResult]:
        """Register a lookup of a turn's answer (`router.result`): resolved with the turn's
        answer like any caller, never failed by a forward's deadline."""
        future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume_exception)
        waiter = _Waiter(future, session_id, forwarded=False, watching=True)
        self._waiters.setdefault(turn_id, []).append(waiter)
        return future

    def remove(self, turn_id: str, future: asyncio.Future[TurnResult]) -> None:
        waiters = self._waiters.get(turn_id)
        if waiters is None:
            return
        waiters[:] = [w for w in waiters if w.future is not future]
        if not waiters:
            del self._waiters[turn_id]
            self._drop_forward(turn_id)

    def waiting(self, turn_id: str) -> bool:
        """Whether a caller of the turn waits here (a `router.result` lookup does not count:
        it never makes this node follow the turn)."""
        return any(not w.watching for w in self._waiters.get(turn_id, ()))

    def futures(self) -> list[asyncio.Future[TurnResult]]:
        """Every waiting caller's future (not the lookups')."""
        return [w.future for waiters in self._waiters.values() for w in waiters if not w.watching]

    def track(self, forward: Forward, *, replace: bool = True) -> None:
        """Follow a turn from afar: its callers here become forwarded, with `forward`'s deadline.

        With `replace=False` an existing forward (and its deadline) is kept.
        """
        if not replace and forward.turn_id in self._forwards:
            return
        self._drop_forward(forward.turn_id)
        for waiter in self._waiters.get(forward.turn_id, ()):
            waiter.forwarded = not waiter.watching
        loop = asyncio.get_running_loop()
        forward.timer = loop.call_at(forward.deadline, self._deadline_reached, forward)
        self._forwards[forward.turn_id] = forward

    def run_here(self, turn_id: str) -> None:
        """The turn now runs on this node (it took the message over): its callers here wait on
        a local turn, past any forward deadline."""
        self._drop_forward(turn_id)
        for waiter in self._waiters.get(turn_id, ()):
            waiter.forwarded = False

    def tracked(self, forward: Forward) -> bool:
        """Whether `forward` is still the one followed for its turn."""
        return self._forwards.get(forward.turn_id) is forward

    def forwards(self, session_id: str | None = None) -> Iterator[Forward]:
        """A snapshot of the forwards (of one session, when given)."""
        return iter(
            [f for f in self._forwards.values() if session_id is None or f.session_id == session_id]
        )

    def _deadline_reached(self, forward: Forward) -> None:
        # A timer may fire a little early (the loop's clock resolution): then it is armed again.
        if not self.expire_if_due(forward) and self.tracked(forward):
            loop = asyncio.get_running_loop()
            forward.timer = loop.call_at(forward.deadline, self._deadline_reached, forward)

    def expire_if_due(self, forward: Forward) -> bool:
        """At or past its deadline, answer the forward's callers FORWARD_TIMEOUT; True if so."""
        if not self.tracked(forward):
            return False
        timeout = expired(forward, asyncio.get_running_loop().time(), self._forward_ttl)
        if timeout is None:
            return False
        self._drop_forward(forward.turn_id)
        waiters = self._waiters.pop(forward.turn_id, [])
        staying = [w for w in waiters if not w.forwarded]
        if staying:
            self._waiters[forward.turn_id] = staying
        for waiter in waiters:
            if waiter.forwarded:
                settle(waiter.future, waiter.session_id, timeout)
        self._on_expired(forward)
        return True

    def resolve(self, outcome: Outcome) -> None:
        """Answer every caller of the outcome's turn."""
        self._drop_forward(outcome.turn_id)
        for waiter in self._waiters.pop(outcome.turn_id, ()):
            settle(waiter.future, waiter.session_id, outcome)

    def fail(self, turn_id: str, code: FailureCode, message: str) -> None:
        self.resolve(Outcome.failure(turn_id, code, message))

    def fail_all(self, message: str) -> None:
        """The router is closing or crashed: every waiting caller gets RouterClosedError."""
        waiters, self._waiters = self._waiters, {}
        for turn_id in list(self._forwards):
            self._drop_forward(turn_id)
        for turn_id, entries in waiters.items():
            for waiter in entries:
                if not waiter.future.done():
                    waiter.future.set_exception(
                        RouterClosedError(
                            f"{message} before turn {turn_id} was answered; it may still run "
                            "elsewhere: retry with the same idempotency key to learn its outcome"
                        )
                    )

    def _drop_forward(self, turn_id: str) -> None:
        forward = self._forwards.pop(turn_id, None)
        if forward is not None and forward.timer is not None:
            forward.timer.cancel()


def expired(forward: Forward, now: float, forward_ttl: float) -> Outcome | None:
    """The FORWARD_TIMEOUT answer of a forward past its deadline, else None."""
    if now < forward.deadline:
        return None
    return Outcome.unknown(forward.turn_id, forward_ttl)


def judge_forward(forward: Forward, found: Reservation | None) -> Outcome | None:
    """The answer a forward gets from what the idempotency store holds; None: keep waiting."""
    return judge_turn(forward.turn_id, found)


def judge_turn(turn_id: str, found: Reservation | None) -> Outcome | None:
    """The answer a follower of `turn_id` gets from its key's reservation; None: keep waiting."""
    if found is None:
        # Within forward_ttl a reservation only vanishes when its submit was refused
        # (discarded) or its entry was unreadable: nothing will run; say so now.
        return Outcome.failure(
            turn_id,
            FailureCode.FAILED,
            "the request was refused before it was queued; retry it",
        )
    if found.turn_id != turn_id:
        return Outcome.failure(turn_id, FailureCode.FAILED, "the turn's reservation was superseded")
    return found.outcome


def settle(future: asyncio.Future[TurnResult], session_id: str, outcome: Outcome) -> None:
    """Complete a caller's future with the outcome (a result or a TurnFailedError)."""
    if future.done():
        return
    if outcome.ok:
        future.set_result(
            TurnResult(
                session_id=session_id,
                turn_id=outcome.turn_id,
                executed_by=outcome.executed_by,
                text=outcome.text,
                data=outcome.data,
            )
        )
    else:
        future.set_exception(
            TurnFailedError.of(
                outcome.failure_code,
                outcome.message,
                session_id=session_id,
                turn_id=outcome.turn_id,
                executed_by=outcome.executed_by,
            )
        )


def _consume_exception(future: asyncio.Future[Any]) -> None:
    # A caller may never await its result; do not let asyncio log the failure as unretrieved.
    if not future.cancelled():
        future.exception()
