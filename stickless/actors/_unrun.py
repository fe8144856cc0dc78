"""Answers of turns an actor ends without running them (cancelled, rejected, failed to
prepare), and the outcome helpers its turns share."""

from __future__ import annotations

from .._errors import BackendUnavailableError, FailureCode
from .._events import (
    LATE_TERMINAL_SEQ,
    Event,
    Interrupted,
    Rejected,
    TurnFailed,
    unfinished_frame,
)
from .._store_errors import store_error
from ..wire import Outcome
from ._host import ActorHost, StopReason
from ._work import TurnWork


def failure(work: TurnWork, code: FailureCode, message: str, node: str) -> Outcome:
    return Outcome.failure(work.turn_id, code, message, node)


def failed(work: TurnWork, code: FailureCode, message: str, node: str) -> tuple[Outcome, Event]:
    """A failure and its terminal frame (for the turn's relay to stamp)."""
    outcome = failure(work, code, message, node)
    # The outcome's message is already made safe for the wire (see Outcome.message).
    return outcome, TurnFailed(code=code, message=outcome.message, executed_by=node)


async def answer_cut_short(host: ActorHost, work: TurnWork, reason: StopReason) -> None:
    """A running turn a stop cancelled past its grace: its relay was aborted, so its frame
    comes late (after any of its own)."""
    node = host.node_id
    frame = unfinished_frame(
        reason.interrupt_code,
        reason.value,
        session_id=work.session_id,
        turn_id=work.turn_id,
        attempt=max(work.attempt, 1),
        seq=LATE_TERMINAL_SEQ,
        executed_by=node,
    )
    await host.complete(work, failure(work, reason.interrupt_code, reason.value, node), frame=frame)


async def answer_cancelled(host: ActorHost, work: TurnWork, reason: str) -> None:
    """A turn interrupted before it started: it never runs, its caller gets INTERRUPTED."""
    frame = Interrupted(
        session_id=work.session_id,
        turn_id=work.turn_id,
        seq=1,
        reason=reason,
        executed_by=host.node_id,
    )
    message = f"cancelled before it started: {reason}"
    await host.complete(
        work, failure(work, FailureCode.INTERRUPTED, message, host.node_id), frame=frame
    )


async def reject(host: ActorHost, work: TurnWork, bound_agent: str | None) -> None:
    """A turn for another agent than the session's: CONFLICTING_AGENT, never run."""
    message = f"session {work.session_id} is bound to agent {bound_agent!r}"
    frame = Rejected(
        session_id=work.session_id,
        turn_id=work.turn_id,
        seq=1,
        reason=FailureCode.CONFLICTING_AGENT.value,
        message=message,
        executed_by=host.node_id,
    )
    await host.complete(
        work, failure(work, FailureCode.CONFLICTING_AGENT, message, host.node_id), frame=frame
    )


async def fail_unrun(
    host: ActorHost, work: TurnWork, message: str, code: FailureCode = FailureCode.FAILED
) -> None:
    """A turn that could not be prepared (record store, live handle): FAILED (or
    BACKEND_UNAVAILABLE when the store was out of reach), never run."""
    outcome = failure(work, code, message, host.node_id)
    await host.complete(work, outcome, frame=outcome.unrun_frame(work.session_id))


async def fail_store(host: ActorHost, work: TurnWork, error: Exception) -> None:
    """A turn whose session record could not be provisioned: BACKEND_UNAVAILABLE when the store
    was out of reach, else FAILED; never run."""
    failed = store_error(error)
    unavailable = isinstance(failed, BackendUnavailableError)
    code = FailureCode.BACKEND_UNAVAILABLE if unavailable else FailureCode.FAILED
    await fail_unrun(host, work, f"record store: {failed}", code)
