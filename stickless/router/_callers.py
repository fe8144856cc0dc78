"""The callers waiting on this node: decisions about them, without I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._errors import FailureCode, RouterClosedError, TurnFailedError
from .._types import TurnResult
from ..backends.base import Reservation
from ..wire import Outcome


@dataclass
class Forward:
    """A caller on this node waiting for a turn that runs (or will run) elsewhere."""

    session_id: str
    key: str
    turn_id: str
    deadline: float
    #: Token of the lease the turn runs under; only an EVICT of that lease or a later one fails it.
    token: int


class CallerTable:
    """Futures of callers waiting on turns, and the forwards among them that need polling."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[tuple[asyncio.Future[TurnResult], str]]] = {}
        self._forwards: dict[str, Forward] = {}

    def add(self, turn_id: str, session_id: str) -> asyncio.Future[TurnResult]:
        """Register a caller of a new turn (before any I/O, so no answer can be missed)."""
        future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume_exception)
        self.follow(turn_id, future, session_id)
        return future

    def follow(self, turn_id: str, future: asyncio.Future[TurnResult], session_id: str) -> None:
        """Make an existing caller's future wait on `turn_id`."""
        self._waiters.setdefault(turn_id, []).append((future, session_id))

    def remove(self, turn_id: str, future: asyncio.Future[TurnResult]) -> None:
        waiters = self._waiters.get(turn_id)
        if waiters is None:
            return
        waiters[:] = [(f, s) for f, s in waiters if f is not future]
        if not waiters:
            del self._waiters[turn_id]
            self._forwards.pop(turn_id, None)

    def waiting(self, turn_id: str) -> bool:
        return turn_id in self._waiters

    def track(self, forward: Forward, *, replace: bool = True) -> None:
        """Poll for `forward`'s answer; with `replace=False` an existing forward is kept."""
        if replace:
            self._forwards[forward.turn_id] = forward
        else:
            self._forwards.setdefault(forward.turn_id, forward)

    def tracked(self, forward: Forward) -> bool:
        """Whether `forward` is still the one followed for its turn."""
        return self._forwards.get(forward.turn_id) is forward

    def forwards(self, session_id: str | None = None) -> Iterator[Forward]:
        """A snapshot of the forwards (of one session, when given)."""
        return iter(
            [f for f in self._forwards.values() if session_id is None or f.session_id == session_id]
        )

    def resolve(self, outcome: Outcome) -> None:
        """Answer every caller of the outcome's turn."""
        self._forwards.pop(outcome.turn_id, None)
        for future, session_id in self._waiters.pop(outcome.turn_id, ()):
            settle(future, session_id, outcome)

    def fail(self, turn_id: str, code: FailureCode, message: str) -> None:
        self.resolve(Outcome.failure(turn_id, code, message))

    def fail_all(self, message: str) -> None:
        """The router is closing or crashed: every waiting caller gets RouterClosedError."""
        waiters, self._waiters = self._waiters, {}
        self._forwards.clear()
        for turn_id, entries in waiters.items():
            for future, _ in entries:
                if not future.done():
                    future.set_exception(RouterClosedError(f"{message} (turn {turn_id})"))


def expired(forward: Forward, now: float, forward_ttl: float) -> Outcome | None:
    """The FORWARD_TIMEOUT answer of a forward past its deadline, else None."""
    if now < forward.deadline:
        return None
    return Outcome.failure(
        forward.turn_id,
        FailureCode.FORWARD_TIMEOUT,
        f"no answer within forward_ttl ({forward_ttl}s)",
    )


def judge_forward(forward: Forward, found: Reservation | None) -> Outcome | None:
    """The answer a forward gets from what the idempotency store holds; None: keep waiting."""
    if found is None:
        # Within forward_ttl a reservation only vanishes when its submit was refused
        # (discarded) or its entry was unreadable: nothing will run; say so now.
        return Outcome.failure(
            forward.turn_id,
            FailureCode.FAILED,
            "the request was refused before it was queued; retry it",
        )
    if found.turn_id != forward.turn_id:
        return Outcome.failure(
            forward.turn_id, FailureCode.FAILED, "the turn's reservation was superseded"
        )
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
            )
        )


def _consume_exception(future: asyncio.Future[Any]) -> None:
    # A caller may never await its result; do not let asyncio log the failure as unretrieved.
    if not future.cancelled():
        future.exception()
