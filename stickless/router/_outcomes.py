"""Recording and announcing turn outcomes: the one place that answers callers and publishes
TURN_RESULT, including take-over decisions, unreadable entries and holder-loss announcements."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .._errors import BackendUnavailableError, FailureCode, InternalError
from .._events import Event, lost_frame, traced
from .._metrics import COMPLETED
from .._trace import TraceContext
from ..actors import LastFrames, Later, PendingEntry, TurnWork
from ..backends.base import (
    AttemptRecord,
    DeadLetter,
    FencedOut,
    Finished,
    InboundMessage,
    Reservation,
    StagedCommit,
    TurnFrames,
    UnreadableEntry,
    letter_for_envelope,
    letter_for_unreadable,
)
from ..wire import Outcome, Signal, SignalKind, TurnResultPayload
from ._background import RETRY_CAP, RETRY_FIRST, io, log, patiently, quiet
from ._context import NodeContext, RouterPart
from ._control import ControlChannel
from ._keys import primary_ttl

_T = TypeVar("_T")

#: How long (seconds) a delivery is sent again before it is withdrawn (or, failing that,
#: followed): enough to ride out a store restart or a dropped connection; at most a quarter of
#: `forward_ttl`, so a withdraw comes well before the message could be declared stale.
_DELIVER_PATIENCE = 4.0


def _result(key: str, outcome: Outcome) -> dict[str, Any]:
    """The payload of a turn's TURN_RESULT."""
    return TurnResultPayload(key=key, outcome=outcome).model_dump(mode="python")


class TurnOutcomes(RouterPart):
    """Writes outcomes to the idempotency store, then answers local callers and the rail."""

    def __init__(
        self,
        ctx: NodeContext,
        control: ControlChannel,
    ) -> None:
        super().__init__(ctx)
        self._control = control

    async def announce_unrun(
        self, session_id: str, key: str, failure: Outcome, trace: TraceContext | None
    ) -> None:
        """Announce the recorded answer of a turn withdrawn before it ran, its frame first."""
        frame = traced(failure.unrun_frame(session_id), trace)
        await self._control.deliver_frames(session_id, [frame])
        await self.announce(session_id, key, failure)

    async def announce(self, session_id: str, key: str, outcome: Outcome) -> None:
        """Answer the turn's callers here, then on every other node (TURN_RESULT)."""
        self._callers.resolve(outcome)
        await self._control.publish_quiet(SignalKind.TURN_RESULT, session_id, _result(key, outcome))

    def _turn_result(self, session_id: str, key: str, outcome: Outcome) -> Signal:
        """The TURN_RESULT `announce` sends, for the store to publish inside a fused call."""
        return self._control.signal(SignalKind.TURN_RESULT, session_id, _result(key, outcome))

    async def complete(
        self,
        work: TurnWork,
        outcome: Outcome,
        commit: StagedCommit | None = None,
        last: LastFrames | None = None,
        frame: Event | None = None,
        bury: str | None = None,
    ) -> Outcome | None:
        """Record the outcome (with the turn's transcript entries, the acknowledgement of its
        message and, unless `frame` must go first, its TURN_RESULT, in one atomic store call),
        then answer local callers; returns the outcome announced, or None when the turn's
        answer was decided elsewhere.

        A success or a final answer is never announced before it is recorded, so it is never
        contradicted later: when the store already holds another outcome for this turn (a
        holder-loss reset won), that one is what every caller gets and nothing of the turn is
        committed. A store that cannot be reached is retried (every write here is safe to
        repeat); when it stays out of reach for `forward_ttl`, this node's callers are told the
        answer is unknown (they may retry the key) and recording goes on in the background.
        A failure that commits nothing and leaves the key free goes out at once when the store
        is out of reach: whatever the store ends up holding for the turn says the same.

        `last` are a relayed turn's last frames (its terminal one last): the store logs and
        publishes them in the step that records the outcome, and they reach local subscribers
        ahead of the answer; when the outcome is not recorded by that step they go out through
        the relay, the terminal frame only with an outcome decided here (so a turn whose answer
        was decided elsewhere never gets a frame that contradicts it). `frame` is the terminal
        frame of a turn that did not run through a relay (cancelled, rejected or failed before
        it started): it is delivered right before the answer, under the same rule.
        With `bury`, the message is kept in the dead letters (with its attempts) in the very
        step that records its answer.

        Raises:
            FencedOut: `commit` is under a lease older than the record's fence (nothing written).
        """
        free = commit is None and not outcome.final
        letter = None if bury is None else await self._letter(work, outcome, bury)
        # The store publishes the TURN_RESULT in the very step that records it (one call for
        # the whole finish), unless a frame must go out first: a turn that never ran through a
        # relay gets its frame logged and sent ahead of its answer.
        result = self._turn_result(work.session_id, work.key, outcome) if frame is None else None
        frames = None if last is None else last.frames
        finished = await self._record(work, outcome, commit, not free, letter, result, frames)
        if finished is None:
            self._bg.spawn(self._record_later(work, outcome, commit, letter), "mark-done-retry")
            if not free:
                self.tell_unknown(work.turn_id)
                if last is not None:
                    await last.send(terminal=False)
                return None
            result = None  # whether the store published it is unknown: it is sent from here
        elif finished.recorded:
            work.committed_version = finished.version
            self._ended(work.session_id, work.turn_id, outcome, work.ran)
            if letter is not None:
                self._metrics.emit("on_dead_lettered", work.session_id, work.turn_id, bury)
        if finished is None or finished.recorded:
            if last is not None and finished is not None:
                logged = last.frames.frames
                self._control.fan_out_logged(work.session_id, logged, finished.event_ids)
                last.logged()
            elif last is not None:
                await last.send(terminal=True)
            if frame is not None:
                await self._control.deliver_frames(work.session_id, [traced(frame, work.trace)])
            if result is None:
                await self.announce(work.session_id, work.key, outcome)
            else:  # the rail had it from the store
                self._callers.resolve(outcome)
            return outcome
        # Refused (the store acknowledged the message unless its turn goes on): what the store
        # holds is the answer.
        if last is not None:
            await last.send(terminal=False)
        found = finished.found
        if found is not None and found.turn_id == work.turn_id:
            if found.outcome is not None:
                await self.announce(work.session_id, work.key, found.outcome)
            # else the turn started on another node: its holder (or the holder-loss sweep)
            # answers, and callers here keep following it
        else:
            self._callers.resolve(
                Outcome.failure(
                    work.turn_id,
                    FailureCode.FAILED,
                    "not recorded: the turn's reservation was reset or superseded",
                    self._node_id,
                )
            )
        return None

    async def fail(self, work: TurnWork, code: FailureCode, message: str) -> None:
        """Complete work this node will not run with a failure of its own (and its frame)."""
        failure = Outcome.failure(work.turn_id, code, message, self._node_id)
        await self.complete(work, failure, frame=failure.unrun_frame(work.session_id))

    async def _record(
        self,
        work: TurnWork,
        outcome: Outcome,
        commit: StagedCommit | None,
        patient: bool,
        letter: DeadLetter | None,
        result: Signal | None,
        frames: TurnFrames | None = None,
    ) -> Finished | None:
        """The fused finish, retried while the store is out of reach (only tried once unless
        `patient`); None when still unknown after `forward_ttl`."""
        within = self._config.forward_ttl if patient else 0.0
        answered = await self._patiently(
            lambda: self._finish(work, outcome, commit, letter, result, frames), within
        )
        return None if answered is None else answered[0]

    async def _letter(self, work: TurnWork, outcome: Outcome, reason: str) -> DeadLetter:
        """The dead letter of a message whose last attempt failed: its earlier attempts from
        the reservation (when it can be read), then this one."""
        looked_up = await self._patiently(
            lambda: self._backends.idempotency.find(work.session_id, work.key), 0.0
        )
        found = None if looked_up is None else looked_up[0]
        earlier = found.history if found is not None and found.turn_id == work.turn_id else ()
        last = AttemptRecord(max(work.attempt, 1), self._node_id, outcome.message, time.time())
        return self._letter_of(work, reason, (*earlier, last))

    @staticmethod
    def _letter_of(work: TurnWork, reason: str, attempts: Sequence[AttemptRecord]) -> DeadLetter:
        """The dead letter of a readable message, named by its pending entry (if any)."""
        source = "" if work.pending is None else work.pending.message_id
        return letter_for_envelope(work.to_envelope(), source, reason, attempts)

    async def _keep_letter(self, letter: DeadLetter) -> bool:
        """Keep a dead letter (`on_dead_lettered` when it is new); False when the store could not
        be reached (the message then stays pending, for a later holder to try again)."""
        try:
            if await io(self._backends.dead_letters.add(letter)):
                turn_id = letter.turn_id or ""
                self._metrics.emit("on_dead_lettered", letter.session_id, turn_id, letter.reason)
        except (BackendUnavailableError, InternalError) as exc:
            log.warning("dead letter %s not kept: %s", letter.letter_id, exc)
            return False
        return True

    def _ended(self, session_id: str, turn_id: str, outcome: Outcome, duration: float) -> None:
        """`on_turn_finished` for a turn whose answer this node recorded."""
        result = COMPLETED if outcome.ok else outcome.code
        self._metrics.emit("on_turn_finished", session_id, turn_id, result, duration)

    def tell_unknown(self, turn_id: str) -> None:
        """This node's callers of the turn learn its answer is unknown (they may retry)."""
        self._callers.resolve(Outcome.unknown(turn_id, self._config.forward_ttl))

    async def _finish(
        self,
        work: TurnWork,
        outcome: Outcome,
        commit: StagedCommit | None,
        letter: DeadLetter | None,
        result: Signal | None = None,
        frames: TurnFrames | None = None,
    ) -> Finished:
        """Record the outcome, acknowledge the message's pending entry, log `frames` and publish
        `result`, in one store call (see `HotPath.finish`)."""
        # A started attempt this node holds answers only while it is the reservation's: a stale
        # one is refused. Work between attempts (a retry waiting out its backoff) holds nothing:
        # it is answered like a turn that never started.
        pending = None if work.pending is None else (work.pending.token, work.pending.message_id)
        return await self._backends.hotpath.finish(
            work.session_id,
            work.key,
            self._node_id,
            outcome,
            primary_ttl(self._config, work.key),
            commit,
            (work.attempt or None) if work.owned else None,
            letter,
            pending=pending,
            announce=result,
            frames=frames,
        )

    async def _record_later(
        self,
        work: TurnWork,
        outcome: Outcome,
        commit: StagedCommit | None,
        letter: DeadLetter | None = None,
    ) -> None:
        """Keep recording an outcome whose callers were told it is unknown, until the store
        answers (acknowledging its message in the same call, as `complete` does); until then
        the reservation stays held by this live node, so it never looks abandoned."""
        delay = RETRY_FIRST
        fenced = False
        while True:
            try:
                finished = await self._finish(work, outcome, commit, letter)
            except FencedOut:
                fenced = True
            except Exception:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP)
                continue
            break
        if fenced:  # a fenced-out finish acknowledged nothing
            await self.ack(work.session_id, work.pending)
        elif finished.recorded:
            self._ended(work.session_id, work.turn_id, outcome, work.ran)

    async def hand_on(self, work: TurnWork, code: FailureCode, why: str) -> str | Outcome | None:
        """Queue a message for whoever holds its session, sending it again (with the same
        delivery id, so it is queued once) while the store is out of reach for a moment.

        Returns the message id; or, when that still fails, the answer of the message withdrawn
        so that it never runs (`code`, "not run: <why>"); or None when neither could be made
        sure (it may be queued, or taken over): its callers then follow it like any forward.
        """
        envelope, delivery_id = work.to_envelope(), uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(_DELIVER_PATIENCE, self._config.forward_ttl / 4)
        delay = RETRY_FIRST
        while True:
            try:
                return await io(self._backends.inbox.deliver(envelope, delivery_id))
            except (BackendUnavailableError, InternalError) as exc:
                log.warning("delivery of %s failed: %s", work.turn_id, exc)
            if loop.time() + delay >= deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP)
        withdrawn = Outcome.failure(work.turn_id, code, f"not run: {why}", self._node_id)
        idem = self._backends.idempotency
        won = await quiet(
            idem.compare_and_reset(work.session_id, work.key, None, withdrawn, unstarted_only=True)
        )
        return withdrawn if won else None

    @property
    def _steal_below(self) -> int:
        """The attempt below which a lost holder's turn is run again (0: never)."""
        if self._config.on_holder_lost == "retry":
            return self._config.holder_lost_max_attempts
        return 0

    async def hold(self, work: TurnWork, token: int) -> None:
        """Keep a durable copy of a turn its submitter runs (see `ActorHost.hold`); when the
        store cannot be reached for it, the turn runs without one (as under "fail")."""
        idem = self._backends.idempotency
        try:
            message_id = await idem.hold(
                work.session_id,
                work.key,
                work.turn_id,
                self._node_id,
                token,
                work.to_envelope().encode(),
            )
        except Exception as exc:
            log.warning("no durable copy of %s: %s", work.turn_id, exc)
            return
        if message_id is not None:
            work.pending = PendingEntry(token, message_id)

    async def schedule_retry(self, work: TurnWork, token: int, reason: str, delay: float) -> bool:
        """Durably schedule the next attempt of a failed one (see `ActorHost.schedule_retry`)."""
        idem = self._backends.idempotency
        attempt = max(work.attempt, 1)
        scheduled = await self._patiently(
            lambda: idem.schedule_retry(
                work.session_id,
                work.key,
                work.turn_id,
                self._node_id,
                token,
                work.to_envelope().encode(),
                attempt,
                reason,
                delay,
                self._config.forward_ttl,
            )
        )
        if scheduled is None or scheduled[0] is None:
            return False
        work.pending = PendingEntry(token, scheduled[0])
        work.owned = False
        return True

    def taken(self, work: TurnWork, attempt: int) -> None:
        """The message's reservation was taken over (at `attempt`): it runs here, and callers
        on this node that followed it from afar now wait on a local turn."""
        self._callers.run_here(work.turn_id)
        work.owned = True
        work.attempt = attempt
        if attempt > 1:
            self._metrics.emit("on_retried", work.session_id, work.turn_id, attempt)

    async def take_over(self, work: TurnWork) -> bool | Later:
        """Take over a collected message's reservation as its turn starts; False when the
        message must not run here.

        Won: the message runs here (callers on this node that followed it from afar now wait
        on a local turn). Rejected: the store says the reservation is not this message's to
        take. If it already holds an answer for this turn, that answer is re-sent; if it names
        a newer attempt with the same key, or no longer exists (its caller was answered:
        refused, timed out, withdrawn or superseded), the message is answered without running,
        so no request runs after its caller got an answer. A reservation of this very turn held
        by another node means the turn started there: it is left to that node (or, if it died,
        to the holder-loss sweep). Unknown (the store stayed out of reach): the message does not
        run, since it may have been withdrawn meanwhile; it stays pending for a later holder to
        decide, and callers here are told the answer is unknown. A message that does not run
        here is acknowledged (it leaves the pending set) once that is decided.
        """
        idem = self._backends.idempotency
        session_id, key, turn_id = work.session_id, work.key, work.turn_id
        message_id = None if work.pending is None else work.pending.message_id
        acquired = await self._patiently(
            lambda: idem.acquire_holder(
                session_id,
                key,
                turn_id,
                self._node_id,
                self._config.idempotency_secondary_ttl,
                message_id=message_id,
                steal_below=self._steal_below,
            )
        )
        if acquired is not None and acquired[0].won:
            takeover = acquired[0]
            if takeover.lost:
                await self._announce_lost_attempt(
                    session_id, turn_id, takeover.lost, takeover.lost_by, work.trace
                )
            self.taken(work, takeover.attempt)
            return True
        if acquired is not None and acquired[0].wait > 0:
            return Later(acquired[0].wait, held=acquired[0].held)
        if acquired is not None:
            self._metrics.emit("on_takeover_rejected", session_id, key)
            looked_up = await self._patiently(lambda: idem.find(session_id, key))
        if acquired is None or looked_up is None:
            log.warning("take-over of %s/%s left undecided: not run", session_id, key)
            self.tell_unknown(turn_id)
            return False
        (found,) = looked_up
        if found is not None and found.turn_id == turn_id and found.stale and not found.outcome:
            # Its holder is dead (not yet swept): decide it here as the sweep would (given back
            # for the next attempt, or answered), then ask again: this copy then runs, or is
            # kept as a dead letter, or is dropped, by that decision.
            # (patiently: a reset run again after a lost reply finds its own outcome and wins)
            if await self._patiently(lambda: self.reset_stale(found)) is None:
                # undecided: it stays pending for a later holder
                log.warning("reset of %s/%s left undecided", session_id, key)
                self.tell_unknown(turn_id)
                return False
            return Later(0.0, held=False)
        if found is not None and found.turn_id == turn_id:
            if found.outcome is None:  # it started on another node: it ends there
                await self.ack(session_id, work.pending)
                return False
            answer = found.outcome
            if not await self._bury_lost(work, found, answer):
                await self.announce(session_id, key, answer)
                return False  # still pending: a later holder keeps the letter
        else:
            answer = Outcome.failure(
                turn_id,
                FailureCode.FAILED,
                "not run: its reservation was superseded or its caller already answered",
                self._node_id,
            )
        await self.announce(session_id, key, answer)
        await self.ack(session_id, work.pending)
        return False

    async def _bury_lost(self, work: TurnWork, found: Reservation, answer: Outcome) -> bool:
        """Keep the message of a turn whose holders were lost on every attempt it was allowed
        (under on_holder_lost="retry", a HOLDER_LOST answer found for a message still pending)
        in the dead letters; False when the letter could not be kept."""
        if not self._steal_below or answer.code != FailureCode.HOLDER_LOST.value:
            return True
        attempt = max(found.attempt, 1)
        last = AttemptRecord(attempt, found.holder or "", answer.message, found.touched_at)
        reason = f"lost with its holder on each of {attempt} attempt(s)"
        return await self._keep_letter(self._letter_of(work, reason, (*found.history, last)))

    async def ack(self, session_id: str, pending: PendingEntry | None) -> None:
        """Drop an answered message from its session's pending set, retried in the background
        while the store is out of reach (what is still left then is answered without running,
        and acknowledged, by a later holder)."""
        if pending is None:
            return
        inbox = self._backends.inbox
        try:
            await inbox.ack(session_id, pending.token, [pending.message_id])
        except Exception as exc:
            log.warning("ack of %s in %s failed, retrying: %s", pending, session_id, exc)
            if not self._bg.closed:
                retry = self._patiently(
                    lambda: inbox.ack(session_id, pending.token, [pending.message_id])
                )
                self._bg.spawn(retry, "ack")

    async def _patiently(
        self, call: Callable[[], Awaitable[_T]], within: float | None = None
    ) -> tuple[_T] | None:
        """`patiently`, for up to `within` seconds (default `forward_ttl`)."""
        return await patiently(
            call, self._config.forward_ttl if within is None else within, self._bg
        )

    async def answer_unreadable(
        self, session_id: str, entry: UnreadableEntry, token: int | None = None
    ) -> None:
        """Keep an undecodable inbox entry in the dead letters, then drop it from the pending set
        of lease `token` (when it was collected; it stays pending when the letter could not be
        kept, for a later collect to try again) and answer its submitter, when known, with
        UNREADABLE."""
        letter = letter_for_unreadable(
            session_id,
            entry.message_id,
            entry.turn_id,
            entry.idempotency_key,
            f"unreadable inbox entry: {entry.reason}",
            entry.raw,
        )
        if await self._keep_letter(letter) and token is not None:
            await self.ack(session_id, PendingEntry(token, entry.message_id))
        if entry.turn_id is None:
            return
        outcome = Outcome.failure(
            entry.turn_id,
            FailureCode.UNREADABLE,
            f"inbox entry {entry.message_id} could not be decoded",
            self._node_id,
        )
        self._ended(session_id, entry.turn_id, outcome, 0.0)
        if entry.idempotency_key is not None:
            await quiet(
                self._backends.idempotency.discard_reservation(
                    session_id, entry.idempotency_key, entry.turn_id
                )
            )
        await self.announce(session_id, entry.idempotency_key or "", outcome)

    async def answer_evicted(self, message: InboundMessage) -> None:
        """A queued message of a released session: it never runs, its caller gets EVICTED."""
        work = TurnWork.from_envelope(message.envelope)
        await self.fail(work, FailureCode.EVICTED, "session released before the message ran")

    async def reset_stale(self, stale: Reservation) -> None:
        """Reset a stale IN_FLIGHT reservation; the one node that wins announces the lost turn.

        Raises:
            BackendUnavailableError: the store could not be reached.
        """
        if stale.holder is not None and stale.durable and self._steal_below:
            lost = await io(
                self._backends.idempotency.requeue_lost(
                    stale.session_id,
                    stale.key,
                    stale.turn_id,
                    stale.holder,
                    f"holder {stale.holder} stopped answering",
                    self._steal_below,
                    self._config.forward_ttl,
                )
            )
            if lost:
                await self._announce_lost_attempt(
                    stale.session_id,
                    stale.turn_id,
                    lost,
                    stale.holder,
                    stale.trace,
                )
                return
        # Named by its decider, so two sweepers never write the same outcome (a reset that finds
        # its own outcome recorded counts as won: that is the same call run again).
        outcome = Outcome.failure(
            stale.turn_id,
            FailureCode.HOLDER_LOST,
            f"holder {stale.holder or '(none)'} stopped answering",
            self._node_id,
        )
        won = await io(
            self._backends.idempotency.compare_and_reset(
                stale.session_id, stale.key, stale.holder, outcome
            )
        )
        if won:
            await self._announce_lost(stale, outcome)

    async def _announce_lost_attempt(
        self,
        session_id: str,
        turn_id: str,
        attempt: int,
        holder: str,
        trace: TraceContext | None,
    ) -> None:
        """Tell subscribers an attempt was lost with its holder and the turn runs again (the
        one node that gave the attempt up sends it)."""
        self._metrics.emit("on_holder_loss", session_id, turn_id)
        message = f"node {holder} stopped answering; the turn runs again"
        frame = lost_frame(session_id, turn_id, holder, message, trace, retrying_attempt=attempt)
        await self._control.deliver_frames(session_id, [frame])

    async def _announce_lost(self, stale: Reservation, outcome: Outcome) -> None:
        session_id, turn_id = stale.session_id, stale.turn_id
        self._metrics.emit("on_holder_loss", session_id, turn_id)
        ran = max(0.0, time.time() - stale.touched_at)  # (the store's clock: an estimate)
        self._ended(session_id, turn_id, outcome, ran)
        frame = lost_frame(session_id, turn_id, stale.holder or "", outcome.message, stale.trace)
        await self._control.deliver_frames(session_id, [frame])
        await self.announce(session_id, stale.key, outcome)
