"""Interrupts across the cluster: stop a running turn, or cancel a turn before it starts, and tell
the node that asked whether anything was stopped."""

from __future__ import annotations

import asyncio
import uuid

from .._errors import FailureCode, InvalidRequestError
from .._events import Interrupted, traced
from ..wire import InterruptAckPayload, InterruptPayload, Outcome, Signal, SignalKind
from ._background import io, log, quiet
from ._session_part import SessionPart

#: Longest interrupt reason accepted.
_MAX_REASON = 200


class Interrupts(SessionPart):
    """Acts on interrupts here and on INTERRUPT signals from other nodes."""

    def _init_part(self) -> None:
        self._acks: dict[str, asyncio.Future[None]] = {}

    async def interrupt(self, session_id: str, reason: str, turn_id: str | None) -> bool:
        """Interrupt or cancel wherever the turn is; True when this node or another one (that
        answered within `interrupt_grace`) interrupted or cancelled something.

        Raises:
            InvalidRequestError: `reason` is not 1-200 characters of valid UTF-8.
            BackendUnavailableError: the INTERRUPT could not be published.
        """
        _check_reason(reason)
        acted = await self._act(session_id, reason, turn_id)
        if not acted and turn_id is not None and await self._ended(session_id, turn_id):
            return False  # nothing to stop anywhere: no node would answer within the grace
        request_id = uuid.uuid4().hex
        ack = asyncio.get_running_loop().create_future()
        self._acks[request_id] = ack
        payload = InterruptPayload(reason=reason, turn_id=turn_id, request_id=request_id)
        try:
            await io(self._control.publish(SignalKind.INTERRUPT, session_id, payload.model_dump()))
            if acted:
                return True
            try:
                await asyncio.wait_for(ack, self._config.interrupt_grace)
            except TimeoutError:
                return False
            return True
        finally:
            del self._acks[request_id]

    async def _ended(self, session_id: str, turn_id: str) -> bool:
        """Whether the store records the turn as answered, or knows no such turn (expired,
        superseded, never submitted); False when it cannot be read (then ask the cluster)."""
        try:
            found = await self._backends.idempotency.find_turn(session_id, turn_id)
        except Exception as exc:
            log.warning("looking up turn %s before interrupting it failed: %s", turn_id, exc)
            return False
        return found is None or found.outcome is not None

    def on_interrupt(self, signal: Signal) -> None:
        """Another node asks to interrupt: act under the session's lock, so a doorbell or claim
        that came first (the turn's delivery) has been handled."""
        payload = InterruptPayload.model_validate(signal.payload)
        self._bg.spawn(self._on_interrupt(signal.session_id, payload), "interrupt")

    def on_ack(self, signal: Signal) -> None:
        ack = self._acks.get(InterruptAckPayload.model_validate(signal.payload).request_id)
        if ack is not None and not ack.done():
            ack.set_result(None)

    async def _on_interrupt(self, session_id: str, payload: InterruptPayload) -> None:
        async with self._sessions.locks.hold(session_id):
            acted = await self._act(session_id, payload.reason, payload.turn_id)
        if acted and payload.request_id is not None:
            ack = InterruptAckPayload(request_id=payload.request_id)
            await self._control.publish_quiet(
                SignalKind.INTERRUPT_ACK, session_id, ack.model_dump()
            )

    async def _act(self, session_id: str, reason: str, turn_id: str | None) -> bool:
        """What this node can do: its actor's turns, and (for a named turn) its own forward of
        that turn while the message still waits in the inbox."""
        actor = self._sessions.get(session_id)
        if actor is not None and actor.interrupt(reason, turn_id):
            return True
        if turn_id is None:
            return False
        # The turn may run here later, maybe under another actor: a next attempt after its
        # holder was lost, a retry, a message this node is yet to collect.
        self._sessions.remember_interrupt(session_id, turn_id, reason)
        return await self._withdraw(session_id, turn_id, reason)

    async def _withdraw(self, session_id: str, turn_id: str, reason: str) -> bool:
        """Cancel this node's queued forward of `turn_id`: only if no node took it over yet."""
        forward = next(
            (f for f in self._callers.forwards(session_id) if f.turn_id == turn_id), None
        )
        if forward is None:
            return False
        cancelled = Outcome.failure(
            turn_id,
            FailureCode.INTERRUPTED,
            f"cancelled before it started: {reason}",
            self._node_id,
        )
        idem = self._backends.idempotency
        won = await quiet(idem.compare_and_reset(session_id, forward.key, None, cancelled))
        if not won:
            return False
        frame = Interrupted(
            session_id=session_id, turn_id=turn_id, seq=1, reason=reason, executed_by=self._node_id
        )
        await self._control.deliver_frames(session_id, [traced(frame, forward.trace)])
        await self._outcomes.announce(session_id, forward.key, cancelled)
        return True


def _check_reason(reason: str) -> None:
    """Raises: InvalidRequestError when the reason cannot travel in a signal and a frame."""
    valid = isinstance(reason, str) and 0 < len(reason) <= _MAX_REASON
    if valid:
        try:
            reason.encode()
        except UnicodeEncodeError:
            valid = False
    if not valid:
        raise InvalidRequestError(f"reason: must be 1-{_MAX_REASON} characters of valid UTF-8")
