"""Turn lookup on any node: a turn's answer (waiting for it) and its state, read from the
reservation every turn has (see docs/architecture.md, "Turn lookup")."""

from __future__ import annotations

import asyncio

from .._errors import BackendUnavailableError, InternalError, UnknownTurnError
from .._types import TurnResult
from ..backends.base import Reservation
from ._api import TurnInfo, TurnState
from ._background import io
from ._callers import settle
from ._context import NodeContext, RouterPart
from ._sessions import LocalSessions

#: Seconds between the store reads of a waiting `result` (doubling up to `_POLL_MAX`): the
#: backstop of a TURN_RESULT signal that never arrives.
_POLL_FIRST = 0.05
_POLL_MAX = 2.0


class TurnLookup(RouterPart):
    """`router.result` and `router.turn`: answers from the store, whichever node took the turn."""

    def __init__(self, ctx: NodeContext, sessions: LocalSessions) -> None:
        super().__init__(ctx)
        self._sessions = sessions

    async def find(self, session_id: str, turn_id: str) -> Reservation:
        """The turn's reservation.

        Raises:
            UnknownTurnError: the session has no such turn (or it expired, or was superseded).
            BackendUnavailableError: the store could not be read.
        """
        found = await io(self._backends.idempotency.find_turn(session_id, turn_id))
        if found is None:
            raise UnknownTurnError(f"session {session_id} has no turn {turn_id!r}")
        return found

    async def result(
        self, session_id: str, turn_id: str, timeout: float | None  # noqa: ASYNC109 (the API's bound)
    ) -> TurnResult:
        """The turn's result once it has one: a TURN_RESULT (or a local answer) resolves the
        wait, and the stored outcome is read again with backoff, so a lost signal never hangs
        (a store out of reach on such a read only delays it).

        Raises:
            TurnFailedError: the turn failed (with its code).
            UnknownTurnError: the session has no such turn.
            BackendUnavailableError: the first read of the store failed.
            TimeoutError: no answer within `timeout` seconds.
            RouterClosedError: this router closed while waiting.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        future = self._callers.watch(turn_id, session_id)  # before the read: nothing is missed
        try:
            found: Reservation | None = await self.find(session_id, turn_id)
            delay = _POLL_FIRST
            while not future.done():
                if found is not None and found.outcome is not None:
                    settle(future, session_id, found.outcome)
                    break
                wait = delay if deadline is None else min(delay, deadline - loop.time())
                if wait <= 0:
                    raise TimeoutError(f"turn {turn_id} of {session_id} is not answered yet")
                await asyncio.wait([future], timeout=wait)
                delay = min(delay * 2, _POLL_MAX)
                if not future.done():
                    try:
                        found = await self.find(session_id, turn_id)
                    except (BackendUnavailableError, InternalError):
                        found = None  # a backstop read: the signal may still come
            return future.result()
        finally:
            self._callers.remove(turn_id, future)

    async def turn(self, session_id: str, turn_id: str) -> TurnInfo:
        """The turn's state and answer as the store holds it now.

        Raises:
            UnknownTurnError: the session has no such turn.
            BackendUnavailableError: the store could not be read.
        """
        found = await self.find(session_id, turn_id)
        outcome = found.outcome
        if outcome is not None and outcome.ok:
            result = TurnResult(
                session_id=session_id,
                turn_id=turn_id,
                executed_by=outcome.executed_by,
                text=outcome.text,
                data=outcome.data,
            )
            return TurnInfo(
                session_id=session_id,
                turn_id=turn_id,
                state=TurnState.COMPLETED,
                executed_by=outcome.executed_by,
                attempt=max(found.attempt, 1),
                result=result,
            )
        if outcome is not None:
            return TurnInfo(
                session_id=session_id,
                turn_id=turn_id,
                state=TurnState.FAILED,
                executed_by=outcome.executed_by or None,
                attempt=found.attempt,
                failure_code=outcome.failure_code,
                failure_message=outcome.message,
            )
        if self._running(found):
            return TurnInfo(
                session_id=session_id,
                turn_id=turn_id,
                state=TurnState.RUNNING,
                executed_by=found.holder,
                attempt=max(found.attempt, 1),
            )
        return TurnInfo(
            session_id=session_id, turn_id=turn_id, state=TurnState.QUEUED, attempt=found.attempt
        )

    def _running(self, found: Reservation) -> bool:
        """Whether an unanswered turn runs: the actor here says so exactly when this node holds
        the session; elsewhere a holderless reservation is queued, a taken-over one (attempt
        above 0) started, and one its submitter holds (attempt 0, maybe still in that node's
        mailbox) runs unless the holder's last STATUS names another active turn."""
        actor = self._sessions.get(found.session_id)
        if actor is not None and actor.lease is not None:
            running = actor.running
            return running is not None and running.work.turn_id == found.turn_id
        if found.holder is None:
            return False
        if found.attempt > 0:
            return True
        now = asyncio.get_running_loop().time()
        seen = self._board.seen(found.session_id, now, 3 * self._config.status_heartbeat_interval)
        return seen is None or seen.active_turn_id == found.turn_id
