"""The submit path: validate, check the binding, reserve the idempotency key, then run the turn
here or forward it to the session's holder (see docs/architecture.md, "A local turn")."""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from .._errors import (
    BackendUnavailableError,
    ConflictingAgentError,
    FailureCode,
    IdempotencyConflictError,
    InputTooLargeError,
    InternalError,
    InvalidRequestError,
)
from .._trace import TraceContext
from .._types import SubmitRequest, TurnResult, invalid_request
from ..actors import SessionActor, TurnWork
from ..backends.base import (
    FencedOut,
    Forwarded,
    Forwarding,
    HeldElsewhere,
    Reservation,
    ReservationState,
)
from ..wire import Outcome
from ._api import SubmitDisposition, SubmitKind
from ._background import io, quiet
from ._callers import Forward, judge_turn, settle
from ._keys import in_flight_ttl, queued_staleness, reservation_key
from ._session_part import SessionPart

#: Token of a forward whose lease is unknown: larger than any real token, so no EVICT fails it.
_UNKNOWN_TOKEN = 2**62
#: Attempts at reserving a key whose reservation keeps changing under us.
_RESERVE_ATTEMPTS = 3


class Verdict(enum.Enum):
    """What a submit does, given the reservation its key already has."""

    PLACE = "place"  # the key was free and is now ours: run the turn
    ATTACH = "attach"  # the same request is in flight: follow that turn
    CACHED = "cached"  # the same request finished: answer from the store
    CONFLICT = "conflict"  # the key was used with a different input
    RESET_STALE = "reset-stale"  # its holder stopped answering: reset, then try again
    DROP_GHOST = "drop-ghost"  # this node's own refused submit: drop it, then try again


def classify(
    existing: Reservation | None,
    input_hash: str,
    refused_turn_id: str | None,
    turn_id: str | None = None,
) -> Verdict:
    """Decide a submit (of `turn_id`) from its key's existing reservation (None: we just
    reserved it)."""
    if existing is None:
        return Verdict.PLACE
    if existing.input_hash != input_hash:
        return Verdict.CONFLICT
    if existing.state is ReservationState.DONE and existing.outcome is not None:
        return Verdict.CACHED
    if existing.turn_id == turn_id and existing.outcome is not None:
        # This very submit's turn, answered already (declared lost while the reserve's reply
        # was on its way): that answer is the submit's.
        return Verdict.CACHED
    if existing.stale:
        return Verdict.RESET_STALE
    if refused_turn_id == existing.turn_id:
        return Verdict.DROP_GHOST
    return Verdict.ATTACH


def answer_attributes(answer: asyncio.Future[TurnResult]) -> dict[str, str | int | bool]:
    """How a forwarded turn's answer ended, for its forward span."""
    if answer.cancelled():
        return {"stickless.result": "cancelled"}
    error = answer.exception()
    if error is None:
        return {"stickless.result": "completed"}
    code = getattr(error, "code", None)
    name = code.name if isinstance(code, FailureCode) else type(error).__name__
    return {"stickless.result": name}


class Submitter(SessionPart):
    """Turns a request into a running (or followed, or answered) turn."""

    def _init_part(self) -> None:
        #: Reservations of this node's refused submits whose removal is still being retried.
        self._refused: dict[tuple[str, str], str] = {}

    def validate(self, request: SubmitRequest | Mapping[str, Any]) -> SubmitRequest:
        """Raises: InvalidRequestError naming the field and the rule."""
        if isinstance(request, SubmitRequest):
            req = request
        else:
            try:
                req = SubmitRequest.model_validate(dict(request))
            except ValidationError as exc:
                raise invalid_request(exc) from None
        try:
            size = len(req.input.canonical_bytes())
        except (TypeError, ValueError, OverflowError) as exc:  # a model built unvalidated
            raise InvalidRequestError(f"input: cannot be encoded: {type(exc).__name__}") from None
        if size > self._config.max_input_bytes:
            raise InputTooLargeError(
                f"input: encoded size {size} bytes exceeds max_input_bytes "
                f"({self._config.max_input_bytes})"
            )
        return req

    async def submit(self, req: SubmitRequest) -> SubmitDisposition:
        """Run one turn for a validated request (the public contract is SessionRouter.submit)."""
        turn_id = uuid.uuid4().hex
        future = self._callers.add(turn_id, req.session_id)  # before any I/O
        attributes = {
            "stickless.session_id": req.session_id,
            "stickless.turn_id": turn_id,
            "stickless.node_id": self._node_id,
        }
        span = self._tracing.start("stickless.submit", req.trace, attributes, ambient=True)
        try:
            disposition = await self._submit(req, turn_id, future, span.context)
        except BaseException as exc:
            self._callers.remove(turn_id, future)
            span.end({"stickless.refused": type(exc).__name__})
            raise
        span.end({"stickless.submit_kind": disposition.kind.value})
        if disposition.kind is SubmitKind.FORWARDED and not disposition.result.done():
            # The wait for the holder's answer, as this node sees it.
            attributes["stickless.turn_id"] = disposition.turn_id
            forward = self._tracing.start("stickless.forward", span.context, attributes)
            disposition.result.add_done_callback(lambda done: forward.end(answer_attributes(done)))
        # A submit that follows an earlier turn answers with that turn's trace (if known).
        return replace(disposition, trace=disposition.trace or span.context)

    async def _submit(
        self,
        req: SubmitRequest,
        turn_id: str,
        future: asyncio.Future[TurnResult],
        trace: TraceContext,
    ) -> SubmitDisposition:
        session_id = req.session_id
        key = reservation_key(req, turn_id)
        input_hash = req.input_hash()
        # The reservation is held under this node's incarnation: never under a dead one.
        await io(self._renewer.ensure_alive(self._backends))
        epoch = self._renewer.epoch
        work = TurnWork.from_request(req, turn_id, key, self._node_id)
        work.trace = trace
        # Not held here: if another live node holds the session, the same call queues the
        # message for it and rings its doorbell (the one store call of a forwarded submit).
        forward = None
        if self._sessions.get(session_id) is None:
            envelope = work.to_envelope()
            forward = Forwarding(envelope, uuid.uuid4().hex, queued_staleness(self._config))
        for _ in range(_RESERVE_ATTEMPTS):
            # One store call: the binding check (a request bound to fail reserves nothing) and
            # the reservation.
            try:
                reserved = await io(
                    self._backends.hotpath.reserve(
                        session_id,
                        key,
                        turn_id,
                        input_hash,
                        self._node_id,
                        req.agent_ref,
                        self._config.idempotency_secondary_ttl,
                        in_flight_ttl(self._config),
                        forward,
                        trace.traceparent,
                    )
                )
            except (BackendUnavailableError, InternalError):
                # It may have been written, and queued for a holder: a refused submit must never
                # run, so it is withdrawn while no holder took it, followed if one did.
                if forward is not None and await self._taken(session_id, key, turn_id):
                    return self._follow_unknown(work, future)
                await self._discard(session_id, key, turn_id)
                raise
            if reserved.bound is not None:
                raise ConflictingAgentError(
                    f"session {session_id} is bound to agent {reserved.bound!r}, "
                    f"not {req.agent_ref!r}"
                )
            if reserved.forwarded is not None:
                return self._forwarded(work, future, reserved.forwarded)
            existing = reserved.existing
            verdict = classify(existing, input_hash, self._refused.get((session_id, key)), turn_id)
            if verdict is Verdict.PLACE:
                # Held under this node's incarnation: however long placing takes, the
                # reservation of a live submit never looks abandoned to a holder-loss sweep.
                break
            assert existing is not None
            if verdict is Verdict.CONFLICT:
                raise IdempotencyConflictError(
                    f"idempotency_key {req.idempotency_key!r} was used with a different input"
                )
            if verdict is Verdict.CACHED:
                return self._answer_cached(req, existing, turn_id, future)
            if verdict is Verdict.RESET_STALE:
                await self._outcomes.reset_stale(existing)
            elif verdict is Verdict.DROP_GHOST:
                # A ghost of this node's own refused submit: drop it now the store answers.
                await io(
                    self._backends.idempotency.discard_reservation(
                        session_id, key, existing.turn_id
                    )
                )
                self._refused.pop((session_id, key), None)
            else:
                return await self._attach(req, existing, turn_id, future)
        else:
            raise BackendUnavailableError(f"idempotency key of {session_id} keeps changing")
        work.epoch, work.inbox_quiet = epoch, reserved.quiet
        try:
            return await self._place(work, future)
        except BaseException:
            await self._discard(session_id, key, turn_id)
            raise

    async def _taken(self, session_id: str, key: str, turn_id: str) -> bool:
        """After a reserve whose reply never came: answer the turn "not run" if it was queued
        but no holder took it (so it never runs); True when a holder took it (it may run: its
        caller follows it). False also when nothing was written or the store cannot say."""
        withdrawn = Outcome.failure(
            turn_id, FailureCode.FAILED, "not run: its submit failed", self._node_id
        )
        idem = self._backends.idempotency
        if await quiet(
            idem.compare_and_reset(session_id, key, None, withdrawn, unstarted_only=True)
        ):
            return False
        found = await quiet(idem.find(session_id, key))
        if found is None or found.turn_id != turn_id:
            return False
        # A withdrawal whose reply was lost may have run all the same: then it never runs, and a
        # holderless reservation holding that answer was withdrawn here, not taken by a holder.
        return found.outcome != withdrawn and found.holder != self._node_id

    def _follow_unknown(
        self, work: TurnWork, future: asyncio.Future[TurnResult]
    ) -> SubmitDisposition:
        """Follow a turn its holder took although this node never heard its reserve answered."""
        self._callers.track(
            Forward(
                work.session_id,
                work.key,
                work.turn_id,
                self._deadline(),
                _UNKNOWN_TOKEN,
                work.trace,
            )
        )
        return self._disposition(SubmitKind.FORWARDED, work.session_id, work.turn_id, future)

    async def _discard(self, session_id: str, key: str, turn_id: str) -> None:
        """Drop a refused submit's reservation; retried in the background if the store is down,
        so the client's retry with the same key runs instead of following a ghost (a retry on
        this node drops the ghost itself; elsewhere a follower learns of it from the poll)."""
        try:
            await self._backends.idempotency.discard_reservation(session_id, key, turn_id)
        except Exception:
            self._refused[(session_id, key)] = turn_id
            self._bg.spawn(self._discard_later(session_id, key, turn_id), "discard-retry")

    async def _discard_later(self, session_id: str, key: str, turn_id: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.forward_ttl
        delay = 0.05
        try:
            while loop.time() < deadline:
                await asyncio.sleep(delay)
                try:
                    await self._backends.idempotency.discard_reservation(session_id, key, turn_id)
                except Exception:
                    delay = min(delay * 2, 1.0)
                else:
                    return
        finally:
            if self._refused.get((session_id, key)) == turn_id:
                del self._refused[(session_id, key)]

    def _answer_cached(
        self,
        req: SubmitRequest,
        existing: Reservation,
        turn_id: str,
        future: asyncio.Future[TurnResult],
    ) -> SubmitDisposition:
        assert existing.outcome is not None
        self._callers.remove(turn_id, future)
        settle(future, req.session_id, existing.outcome)
        return self._disposition(
            SubmitKind.CACHED, req.session_id, existing.turn_id, future, earlier=existing
        )

    async def _attach(
        self,
        req: SubmitRequest,
        existing: Reservation,
        turn_id: str,
        future: asyncio.Future[TurnResult],
    ) -> SubmitDisposition:
        """Same key, same input, in flight: follow the original turn (no new turn).

        A turn this node runs is followed like a local one (this node answers it, and the
        store is read once more for an answer given meanwhile); one running elsewhere is
        followed as a forward, with a deadline.

        Raises:
            BackendUnavailableError: the store could not be read again for a turn run here.
        """
        self._callers.remove(turn_id, future)
        actor = self._sessions.get(req.session_id)
        if existing.holder == self._node_id and actor is not None and actor.lease is not None:
            self._callers.follow(existing.turn_id, future, req.session_id, forwarded=False)
            await self._catch_up(req.session_id, existing, future)
            kind = SubmitKind.EXECUTED_LOCALLY
        else:
            token = await self._running_token(req.session_id)
            self._callers.follow(existing.turn_id, future, req.session_id, forwarded=True)
            self._callers.track(
                Forward(req.session_id, existing.key, existing.turn_id, self._deadline(), token),
                replace=False,
            )
            kind = SubmitKind.FORWARDED
        return self._disposition(
            kind, req.session_id, existing.turn_id, future, attached=True, earlier=existing
        )

    async def _catch_up(
        self, session_id: str, existing: Reservation, future: asyncio.Future[TurnResult]
    ) -> None:
        """Settle a local follower with an answer the turn got before it followed, if any.

        Raises:
            BackendUnavailableError: the store could not be read (the follower is dropped: a
                retry with the key attaches again).
        """
        # The reserve read the turn in flight, but its answer may have been announced here
        # while that reply was on its way (slow, or resent after a lost one): its callers were
        # resolved before this one joined them, and a local follower has no forward poll or
        # deadline to learn it later. Followed first, then read, it misses nothing: an answer
        # recorded before the read is found by it, one announced after the follow reaches it.
        try:
            found = await io(self._backends.idempotency.find(session_id, existing.key))
        except BaseException:
            self._callers.remove(existing.turn_id, future)
            raise
        answer = judge_turn(existing.turn_id, found)
        if answer is not None:
            settle(future, session_id, answer)
            self._callers.remove(existing.turn_id, future)

    def _disposition(
        self,
        kind: SubmitKind,
        session_id: str,
        turn_id: str,
        future: asyncio.Future[TurnResult],
        message_id: str | None = None,
        *,
        attached: bool = False,
        earlier: Reservation | None = None,
    ) -> SubmitDisposition:
        """The answer of a submit; one that follows an `earlier` turn names that turn's trace."""
        self._metrics.emit("on_submit", session_id, kind.value)
        trace = None if earlier is None else earlier.trace
        return SubmitDisposition(
            kind, session_id, turn_id, self._node_id, future, message_id, attached, trace
        )

    async def _running_token(self, session_id: str) -> int:
        """The lease token a followed turn runs under, as far as this node can tell.

        Only an EVICT of that lease (or a later one) may fail the follower. When no lease is
        visible the token is unknown: no EVICT fails the follower, whose answer then comes from
        the turn's result or the store poll, both of which record an eviction too.
        """
        actor = self._sessions.get(session_id)
        if actor is not None:
            return actor.token
        lease = await quiet(self._backends.leases.current(session_id))
        return lease.token if lease is not None else _UNKNOWN_TOKEN

    async def _place(self, work: TurnWork, future: asyncio.Future[TurnResult]) -> SubmitDisposition:
        """Run on this node's actor (claiming the session if free), else forward to the holder."""
        session_id = work.session_id
        async with self._sessions.locks.hold(session_id):
            actor = self._sessions.get(session_id)
            if self._renewer.epoch != work.epoch:
                # Reserved under an incarnation of this node that has ended since: the turn is
                # not this node's to run as it is; it is taken over (or found answered) first.
                work.owned = False
            if actor is not None and actor.accepting and actor.lease is not None:
                actor.enqueue(work)
                self._metrics.emit("on_cache_hit", session_id)
                return self._disposition(
                    SubmitKind.EXECUTED_LOCALLY, session_id, work.turn_id, future
                )
            if actor is None:
                try:
                    claimed = await self._sessions.claim(session_id, work.agent_ref)
                except FencedOut:
                    # A newer lease provisioned the record meanwhile, or ours was won too late
                    # to be sure it lasts: the session may be someone else's now, so the turn
                    # goes through the inbox like any forward.
                    claimed = HeldElsewhere(session_id, "", _UNKNOWN_TOKEN, 0.0)
                if isinstance(claimed, SessionActor):
                    claimed.enqueue(work)
                    return self._disposition(
                        SubmitKind.EXECUTED_LOCALLY, session_id, work.turn_id, future
                    )
                held_by, token = claimed.holder, claimed.token
            else:  # our actor is stopping: queue behind it; its hand-over rings the doorbell
                held_by, token = self._node_id, actor.token
        return await self._forward(work, future, held_by, token)

    async def _forward(
        self, work: TurnWork, future: asyncio.Future[TurnResult], held_by: str, token: int
    ) -> SubmitDisposition:
        idem = self._backends.idempotency
        await io(
            idem.release_holder(
                work.session_id, work.key, self._node_id, queued_staleness(self._config)
            )
        )
        handed = await self._outcomes.hand_on(
            work, FailureCode.FAILED, "its delivery could not be confirmed; retry it"
        )
        if isinstance(handed, Outcome):
            raise BackendUnavailableError(f"the turn's delivery failed: {handed.message}")
        message_id = handed
        self._callers.track(
            Forward(work.session_id, work.key, work.turn_id, self._deadline(), token, work.trace)
        )
        await self._control.ring_doorbell(work.session_id, held_by)
        return self._disposition(
            SubmitKind.FORWARDED, work.session_id, work.turn_id, future, message_id
        )

    def _forwarded(
        self, work: TurnWork, future: asyncio.Future[TurnResult], forwarded: Forwarded
    ) -> SubmitDisposition:
        """The reserve queued the message for the holder and rang its doorbell: follow it."""
        self._callers.track(
            Forward(
                work.session_id,
                work.key,
                work.turn_id,
                self._deadline(),
                forwarded.token,
                work.trace,
            )
        )
        return self._disposition(
            SubmitKind.FORWARDED, work.session_id, work.turn_id, future, forwarded.message_id
        )

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self._config.forward_ttl
