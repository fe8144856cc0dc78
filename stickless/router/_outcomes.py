"""Recording and announcing turn outcomes: the one place that answers callers and publishes
TURN_RESULT, including take-over decisions, unreadable entries and holder-loss announcements."""

from __future__ import annotations

import asyncio

from .._errors import FailureCode
from .._events import Interrupted
from ..actors import Takeover, TurnWork
from ..backends.base import (
    HolderTakeover,
    InboundMessage,
    Reservation,
    UnreadableEntry,
)
from ..wire import Outcome, SignalKind, TurnResultPayload
from ._background import io, log, quiet
from ._context import NodeContext, RouterPart
from ._control import ControlChannel
from ._keys import primary_ttl


class TurnOutcomes(RouterPart):
    """Writes outcomes to the idempotency store, then answers local callers and the rail."""

    def __init__(
        self,
        ctx: NodeContext,
        control: ControlChannel,
    ) -> None:
        super().__init__(ctx)
        self._control = control

    async def announce(self, session_id: str, key: str, outcome: Outcome) -> None:
        """Answer the turn's callers here, then on every other node (TURN_RESULT)."""
        self._callers.resolve(outcome)
        await self._control.publish_quiet(
            SignalKind.TURN_RESULT,
            session_id,
            TurnResultPayload(key=key, outcome=outcome).model_dump(mode="python"),
        )

    async def complete(self, work: TurnWork, outcome: Outcome) -> None:
        """Record the outcome (mark_done) first, then answer local callers and the rail.

        When the store refuses the outcome because it already holds another one for this turn
        (a holder-loss reset won the race), the stored answer is the one every caller gets.
        When the store cannot be reached the answer still goes out, and the outcome is recorded
        in the background: until then the reservation stays owned (touched by renewals), so it
        never looks abandoned and a retry never runs the turn a second time.
        """
        if work.takeover.owns:
            recorded = await self._mark_done(work, outcome)
            if recorded is None:
                self._bg.spawn(self._record_later(work, outcome), "mark-done-retry")
            else:
                self._renewer.disown(work.session_id, work.key)
                if recorded is False:
                    outcome = await self._stored_outcome(work, outcome)
        else:
            self._renewer.disown(work.session_id, work.key)
        await self.announce(work.session_id, work.key, outcome)

    async def fail(self, work: TurnWork, code: FailureCode, message: str) -> None:
        """Complete work this node will not run with a failure of its own."""
        await self.complete(work, Outcome.failure(work.turn_id, code, message, self._node_id))

    async def _mark_done(self, work: TurnWork, outcome: Outcome) -> bool | None:
        """True when recorded, False when the store refused (not ours), None when unknown."""
        try:
            return await self._backends.idempotency.mark_done(
                work.session_id,
                work.key,
                self._node_id,
                outcome,
                primary_ttl(self._config, work.key),
            )
        except Exception as exc:
            log.warning("mark_done failed for %s/%s: %s", work.session_id, work.turn_id, exc)
            return None

    async def _stored_outcome(self, work: TurnWork, fallback: Outcome) -> Outcome:
        """The outcome the store holds for this turn, if it holds one; else `fallback`."""
        found = await quiet(self._backends.idempotency.find(work.session_id, work.key))
        if found is not None and found.turn_id == work.turn_id and found.outcome is not None:
            return found.outcome
        return fallback

    async def _record_later(self, work: TurnWork, outcome: Outcome) -> None:
        delay = 0.05
        while await self._mark_done(work, outcome) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._config.idempotency_secondary_ttl / 3)
        self._renewer.disown(work.session_id, work.key)

    async def take_over(self, message: InboundMessage) -> TurnWork | None:
        """Take over a collected message's reservation (won / rejected / unknown).

        Won or unknown: the message runs and this node records its outcome. Rejected: the store
        says the reservation is not this message's to take. If it already holds an answer for
        this turn, that answer is re-sent; if it names a newer attempt with the same key, or no
        longer exists (its caller was answered: refused, timed out or superseded), the message
        is answered without running, so no request runs after its caller got an answer. Only
        a reservation of this very turn held by another node still runs it.
        """
        env = message.envelope
        try:
            result = await self._backends.idempotency.acquire_holder(
                env.session_id,
                env.key,
                env.turn_id,
                self._node_id,
                self._config.idempotency_secondary_ttl,
            )
            takeover = Takeover.WON if result is HolderTakeover.WON else Takeover.REJECTED
        except Exception as exc:
            log.warning("acquire_holder for %s/%s unknown: %s", env.session_id, env.key, exc)
            takeover = Takeover.UNKNOWN
        if takeover is not Takeover.REJECTED:
            self._renewer.own(env.session_id, env.key)
            return TurnWork.from_envelope(env, takeover)
        self._metrics.emit("on_takeover_rejected", env.session_id, env.key)
        try:
            found = await self._backends.idempotency.find(env.session_id, env.key)
        except Exception as exc:
            log.warning("find for %s/%s failed: %s", env.session_id, env.key, exc)
            return TurnWork.from_envelope(env, takeover)
        if found is not None and found.turn_id == env.turn_id:
            if found.outcome is None:
                return TurnWork.from_envelope(env, takeover)  # held elsewhere: run
            answer = found.outcome
        else:
            answer = Outcome.failure(
                env.turn_id,
                FailureCode.FAILED,
                "not run: its reservation was superseded or its caller already answered",
                self._node_id,
            )
        await self.announce(env.session_id, env.key, answer)
        return None

    async def answer_unreadable(self, session_id: str, entry: UnreadableEntry) -> None:
        """Answer the submitter of an undecodable inbox entry at once with UNREADABLE."""
        if entry.turn_id is None:
            return
        outcome = Outcome.failure(
            entry.turn_id,
            FailureCode.UNREADABLE,
            f"inbox entry {entry.message_id} could not be decoded",
            self._node_id,
        )
        if entry.idempotency_key is not None:
            await quiet(
                self._backends.idempotency.discard_reservation(
                    session_id, entry.idempotency_key, entry.turn_id
                )
            )
        await self.announce(session_id, entry.idempotency_key or "", outcome)

    async def answer_evicted(self, message: InboundMessage) -> None:
        """A queued message of a released session: it never runs, its caller gets EVICTED."""
        work = TurnWork.from_envelope(message.envelope, Takeover.WON)
        await self.fail(work, FailureCode.EVICTED, "session released before the message ran")

    async def reset_stale(self, stale: Reservation) -> None:
        """Reset a stale IN_FLIGHT reservation; the one node that wins announces the lost turn.

        Raises:
            BackendUnavailableError: the store could not be reached.
        """
        outcome = Outcome.failure(
            stale.turn_id,
            FailureCode.HOLDER_LOST,
            f"holder {stale.holder or '(none)'} stopped answering",
        )
        won = await io(
            self._backends.idempotency.compare_and_reset(
                stale.session_id, stale.key, stale.holder, outcome
            )
        )
        if won:
            await self._announce_lost(stale, outcome)

    async def _announce_lost(self, stale: Reservation, outcome: Outcome) -> None:
        self._metrics.emit("on_holder_loss", stale.session_id, stale.turn_id)
        frame = Interrupted(
            session_id=stale.session_id,
            turn_id=stale.turn_id,
            seq=0,
            reason=FailureCode.HOLDER_LOST.value,
            executed_by=stale.holder or "",
        )
        await self._control.deliver_frames(stale.session_id, [frame])
        await self.announce(stale.session_id, stale.key, outcome)
