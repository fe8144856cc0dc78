"""How a turn's agent task ends: an outcome to record, or another attempt (retry policy)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from .._errors import FailureCode
from .._events import Event, TurnCompleted, TurnFailed, unfinished_frame
from .._logs import get_logger
from .._retry import RetryPolicy
from .._session import LiveSession, TurnContext, TurnEnding
from .._store_errors import unavailable_cause
from .._types import TurnOutput
from ..backends.base import FencedOut, Lease, StagedCommit
from ..wire import Outcome
from ._host import ActorHost
from ._relay import EventRelay
from ._unrun import failed, failure
from ._work import TurnWork

log = get_logger("stickless.actor")


class NotStarted(Exception):
    """The turn task found, in its first step, that its lease may have run out: the agent was
    never called."""


async def start_turn(
    host: ActorHost, token: int, handle: LiveSession, context: TurnContext
) -> TurnOutput:
    """The agent's turn, once the lease is checked again in the task's first step: that step
    may come long after the task was made (the process paused in between).

    Raises:
        NotStarted: the lease may have run out meanwhile; the agent was not called.
    """
    if not await host.holds_lease(context.session_id, token):
        raise NotStarted("lease may have run out before the turn started")
    return await handle.run_turn(context)


@dataclass
class RunningTurn:
    """The turn in progress: its work, context, relay and agent task."""

    work: TurnWork
    context: TurnContext
    relay: EventRelay
    task: asyncio.Task[TurnOutput] | None = None
    interrupt_code: FailureCode | None = None
    interrupt_reason: str = ""
    #: NOW messages the agent accepted into this turn; they get this turn's outcome.
    joined: list[TurnWork] = field(default_factory=list)
    #: Set once the agent task ended: no message joins the turn after that.
    concluded: bool = False
    #: Why the turn's message goes to the dead letters with its answer (its last attempt
    #: failed under the retry policy); None: it does not.
    bury: str | None = None
    #: When the attempt started (`time.monotonic`), for the turn's duration.
    started: float = field(default_factory=time.monotonic)
    #: The answer its finish announced (None: decided elsewhere, or unknown).
    answer: Outcome | None = None


def _retried_error(
    running: RunningTurn, task: asyncio.Task[TurnOutput], policy: RetryPolicy
) -> BaseException | None:
    """The agent error of a turn the retry policy would run again (attempts left or not); None
    for an interrupted turn, one NOW messages joined (they joined this attempt), or an error
    the policy does not retry."""
    if running.interrupt_code is not None or running.joined or task.cancelled():
        return None
    error = task.exception()
    if error is None or isinstance(error, NotStarted) or not policy.retries(error):
        return None
    return error


def retryable(
    host: ActorHost, running: RunningTurn, task: asyncio.Task[TurnOutput]
) -> BaseException | None:
    """The agent error to run the turn again for, or None: the policy retries it and attempts
    are left."""
    policy = host.config.retry
    if policy is None or max(running.work.attempt, 1) >= policy.max_attempts:
        return None
    return _retried_error(running, task, policy)


def exhausted(host: ActorHost, running: RunningTurn, task: asyncio.Task[TurnOutput]) -> str | None:
    """Why a failed turn's message is dead-lettered: the retry policy would have run it again
    but its attempts are used up; None otherwise."""
    policy = host.config.retry
    attempt = max(running.work.attempt, 1)
    if policy is None or attempt < policy.max_attempts:
        return None
    error = _retried_error(running, task, policy)
    if error is None:
        return None
    return f"failed {attempt} attempt(s), the last with {type(error).__name__}: {error}"


async def schedule(host: ActorHost, work: TurnWork, token: int, error: BaseException) -> bool:
    """Schedule the next attempt after the policy's delay; True when it is scheduled (the work
    is then unowned and pending, for this node or a successor to take over when due)."""
    policy = host.config.retry
    assert policy is not None
    reason = f"{type(error).__name__}: {error}"
    return await host.schedule_retry(work, token, reason, policy.delay(max(work.attempt, 1)))


def retrying_frame(work: TurnWork, error: BaseException, node: str) -> TurnFailed:
    """The frame ending a failed attempt that runs again (not the turn's end); its message is
    the one an outcome would keep (cut: see `Outcome.message`), so the frame stays bounded."""
    message = failure(work, FailureCode.FAILED, f"{type(error).__name__}: {error}", node).message
    return TurnFailed(message=message, executed_by=node, retrying=True)


async def conclude(
    host: ActorHost, running: RunningTurn, task: asyncio.Task[TurnOutput], lease: Lease | None
) -> tuple[Outcome, Event, StagedCommit | None, bool]:
    """The agent task's end as an outcome, a terminal frame, on success the staged entries to
    commit with the outcome under `lease`, and whether the lease turned out lost."""
    work = running.work
    node = host.node_id
    if running.interrupt_code is not None:
        code, reason = running.interrupt_code, running.interrupt_reason
        frame = unfinished_frame(code, reason, executed_by=node)
        return failure(work, code, reason, node), frame, await _partial(host, running, lease), False
    if task.cancelled():
        return (*failed(work, FailureCode.FAILED, "turn task cancelled", node), None, False)
    error = task.exception()
    if isinstance(error, NotStarted):
        reason = str(error)
        frame = TurnFailed(code=FailureCode.LEASE_LOST, message=reason, executed_by=node)
        return failure(work, FailureCode.LEASE_LOST, reason, node), frame, None, True
    if error is not None:
        # The error's text may quote the conversation: only its type above DEBUG.
        log.warning("turn failed: %s", type(error).__name__)
        log.debug("turn failed: %r", error)
        message = f"{type(error).__name__}: {error}"
        # A store out of reach is the infrastructure's fault, not the agent's.
        outage = unavailable_cause(error)
        if outage is None:
            return (*failed(work, FailureCode.FAILED, message, node), None, False)
        if outage is not error:
            message = f"{message} (the store: {outage})"
        return (*failed(work, FailureCode.BACKEND_UNAVAILABLE, message, node), None, False)
    output = task.result()
    if not isinstance(output, TurnOutput):
        message = "run_turn must return TurnOutput"
        return (*failed(work, FailureCode.FAILED, message, node), None, False)
    commit = None
    staged = running.context.transcript.staged
    if staged:
        if lease is None or not await host.holds_lease(work.session_id, lease.token):
            message = "lease lost before commit"
            return (*failed(work, FailureCode.LEASE_LOST, message, node), None, True)
        commit = StagedCommit(lease.token, tuple(staged))
    outcome = Outcome(
        turn_id=work.turn_id, ok=True, executed_by=node, text=output.text, data=output.data
    )
    completed = TurnCompleted(text=output.text, data=output.data, executed_by=node)
    return outcome, completed, commit, False


async def _partial(
    host: ActorHost, running: RunningTurn, lease: Lease | None
) -> StagedCommit | None:
    """What a turn the user interrupted commits: its staged entries, marked partial, when the
    deployment asks for it and the lease still holds (else nothing)."""
    staged = running.context.transcript.staged
    if (
        running.interrupt_code is not FailureCode.INTERRUPTED
        or not host.config.commit_partial_on_interrupt
        or not staged
        or lease is None
        or not await host.holds_lease(running.work.session_id, lease.token)
    ):
        return None
    return StagedCommit(lease.token, tuple(staged), partial=True)


async def tell_turn_ended(
    host: ActorHost, handle: LiveSession, running: RunningTurn, commit: StagedCommit | None
) -> None:
    """Tell a session that wants it (`SupportsTurnEnding`) how its finished turn ended, bounded
    by `interrupt_grace`; a hook that fails or hangs is logged, never the turn's concern."""
    hook = getattr(handle, "turn_ended", None)
    if hook is None:
        return
    version = running.work.committed_version
    answer = running.answer
    ending = TurnEnding(
        turn_id=running.work.turn_id,
        # (unknown: the store stayed out of reach; the caller was told the same)
        result=answer.result if answer is not None else "UNKNOWN",
        committed=version is not None,
        version=version,
        partial=commit is not None and commit.partial and version is not None,
    )
    try:
        await asyncio.wait_for(hook(ending), host.config.interrupt_grace)
    except Exception:
        log.exception("LiveSession.turn_ended failed")


async def close_handle(host: ActorHost, session_id: str, handle: LiveSession) -> None:
    """Close a live session, bounded by `release_interrupt_timeout`; a failure is logged."""
    try:
        await asyncio.wait_for(handle.aclose(), host.config.release_interrupt_timeout)
    except Exception:
        log.exception("closing the live session %s failed", session_id)


async def finish_turn(
    host: ActorHost,
    running: RunningTurn,
    outcome: Outcome,
    terminal: Event,
    commit: StagedCommit | None,
    relay: EventRelay,
) -> bool:
    """Record and announce a concluded turn (and the NOW messages that joined it); False when
    the node's hold of the session is in doubt: its commit was fenced out, or the answer was
    decided elsewhere (this node was declared lost) or is unknown (the decider then sent the
    turn's terminal frame)."""
    work = running.work
    work.ran = time.monotonic() - running.started
    # However long the store takes (stalled, out of reach, each call bounded only by its
    # client's timeouts), this node's callers are answered within forward_ttl of the turn's
    # end: "unknown" if it is not announced by then, while the finish goes on.
    waiting = [work.turn_id, *(joined.turn_id for joined in running.joined)]
    ttl = host.config.forward_ttl
    deadline = asyncio.get_running_loop().call_later(ttl, host.answer_unknown, waiting)
    try:
        announced, held = await _record_turn(host, running, outcome, terminal, commit, relay)
        running.answer = announced
        for joined in running.joined:
            joined.ran = work.ran
            answer = announced or Outcome.unknown(joined.turn_id, ttl)
            await host.complete(joined, answer.model_copy(update={"turn_id": joined.turn_id}))
    finally:
        deadline.cancel()
    return held and announced is outcome


async def _record_turn(
    host: ActorHost,
    running: RunningTurn,
    outcome: Outcome,
    terminal: Event,
    commit: StagedCommit | None,
    relay: EventRelay,
) -> tuple[Outcome | None, bool]:
    """Record and announce the turn itself: the outcome announced (None: decided elsewhere or
    unknown), and False when its commit was fenced out (then LEASE_LOST is what it records)."""
    work = running.work
    # The relay's last frames and the terminal one go in the step that records the answer
    # (their order kept: the relay hands over only once its batch in flight is logged), as
    # many as fit one batch with the terminal frame; the rest goes out through the relay first.
    tail = await relay.seal()
    last = await relay.last_frames(tail, relay.stamp(terminal))
    try:
        try:
            return await host.complete(work, outcome, commit, last, bury=running.bury), True
        except FencedOut:
            lost, terminal = failed(work, FailureCode.LEASE_LOST, "commit fenced out", host.node_id)
            last = await last.replaced(relay.stamp(terminal, seq=last.terminal.seq))
            return await host.complete(work, lost, None, last), False
    finally:
        if not last.consumed:  # (the finish failed outright: what is left still goes out)
            await last.send(terminal=False)
