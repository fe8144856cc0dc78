"""The session actor: one per session this node holds; owns the live handle, turn gate and relay.

It exists only while the node holds the session's lease, and its task runs only while there is
work; messages are processed one at a time, so a turn, a drain and a stop never overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Coroutine
from typing import Any

from .._errors import FailureCode
from .._events import (
    Event,
    TurnStarted,
)
from .._logs import get_logger, log_context, task_context
from .._session import LiveSession, Transcript, TurnContext
from .._store_errors import store_error
from .._types import CommittedEntry, Priority, TurnOutput
from ..backends.base import (
    FencedOut,
    Lease,
    StagedCommit,
    check_version,
)
from ..wire import Outcome
from ._collecting import admitted, fetch_batch
from ._ending import (
    RunningTurn,
    close_handle,
    conclude,
    exhausted,
    finish_turn,
    retryable,
    retrying_frame,
    schedule,
    start_turn,
    tell_turn_ended,
)
from ._host import ActorHost, Later, StopReason
from ._mailbox import Mailbox
from ._relay import EventRelay
from ._unrun import answer_cancelled, answer_cut_short, fail_store, fail_unrun, reject
from ._work import TurnWork

log = get_logger("stickless.actor")


class SessionActor:
    """Serializes one session's turns on the node that holds its lease."""

    def __init__(
        self, host: ActorHost, session_id: str, lease: Lease, agent_ref: str | None, ready: bool
    ) -> None:
        self._host = host
        self.session_id = session_id
        self.lease: Lease | None = lease
        #: Token of the lease this actor was created under (kept after the lease is dropped).
        self.token = lease.token
        #: The session's agent binding (None: unbound), as read when the record was
        #: provisioned under this lease (`ready`: by the claim that made the actor).
        self.agent_ref = agent_ref
        self._provisioned = ready
        self._mailbox = Mailbox()
        #: The turn popped from the mailbox and being prepared (binding, handle), not started yet.
        self._starting: TurnWork | None = None
        #: Why `_starting` (or, when None, the next turn to start) was cancelled by an interrupt.
        self._cancel_starting: str | None = None
        #: Set to end a wait of `_starting` for its take-over (cancelled, or the actor stops).
        self._wake_starting = asyncio.Event()
        self._cancel_next: str | None = None
        #: True while the loop collects the inbox before a turn.
        self._collecting = False
        #: A collect failed: its batch may sit pending under this lease, unseen (the next full
        #: collect takes this lease's pending entries back too). True at first: an earlier
        #: actor of this very lease (the node got its own lease back after giving the session
        #: up) may have left entries pending under it that no actor has in its mailbox.
        self._collect_in_doubt = True
        self._task: asyncio.Task[None] | None = None
        self._handle: LiveSession | None = None
        self.running: RunningTurn | None = None
        #: The last turn's relay: the next one dispatches after it, and stop waits for it.
        self._last_relay: EventRelay | None = None
        self._rung = False
        self.accepting = True
        self.close_requested = False
        self._stopping: asyncio.Future[list[TurnWork]] | None = None
        self._side_tasks: set[asyncio.Task[Any]] = set()
        #: NOW work offered to the running turn whose `inject` has not answered yet.
        self._injecting: list[TurnWork] = []
        #: Concluded turns being recorded and announced (not cut short by a stop).
        self._finishing: set[asyncio.Task[None]] = set()
        self.last_active = asyncio.get_running_loop().time()

    # ------------------------------------------------------------------ state

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The actor's running task, if it is processing its mailbox."""
        return self._task

    @property
    def busy(self) -> bool:
        """True while the actor's task runs (a turn, a drain or a collect)."""
        return self._task is not None

    @property
    def queued(self) -> int:
        return len(self._mailbox)

    @property
    def has_handle(self) -> bool:
        return self._handle is not None

    # ------------------------------------------------------------------ messages

    def enqueue(self, work: TurnWork) -> None:
        """Add a turn to the mailbox (NOW work is first offered to a running turn)."""
        self.last_active = asyncio.get_running_loop().time()
        self._mailbox.admit(work.turn_id)
        if self.running is not None and work.priority is Priority.NOW:
            self._spawn(self._offer_injection([work]))
            return
        self._mailbox.push(work)
        self._kick()

    def ring(self) -> None:
        """The doorbell: collect the inbox before the next turn (NOW ones into a running turn)."""
        self._rung = True
        if self.running is not None:
            self._spawn(self._inject_from_inbox())
        self._kick()

    def interrupt(
        self, reason: str, turn_id: str | None = None, code: FailureCode = FailureCode.INTERRUPTED
    ) -> bool:
        """Interrupt the active turn, or cancel a turn before it starts; False if nothing was.

        With `turn_id`, only that turn: running, being prepared, or queued here (a turn that has
        not reached this actor yet is cancelled when it does, but that reports False). Without
        it: the running turn, else the turn about to start (being prepared, first in the
        mailbox, or the first one the collect in progress brings in). Stopping the actor (any
        code other than INTERRUPTED) only ends the running turn.
        """
        running = self.running
        if running is not None and (turn_id is None or running.work.turn_id == turn_id):
            if running.interrupt_code is not None:
                return False
            running.interrupt_code = code
            running.interrupt_reason = reason
            running.context.interrupted.set()
            self._spawn(self._escalate_interrupt(running, reason))
            return True
        if code is not FailureCode.INTERRUPTED:
            return False
        return self._cancel_queued(reason, turn_id, running is not None)

    def _cancel_queued(self, reason: str, turn_id: str | None, running: bool) -> bool:
        starting = self._starting
        if starting is not None and turn_id in (None, starting.turn_id):
            self._cancel_starting = reason
            self._wake_starting.set()
            return True
        if turn_id is not None:
            work = self._mailbox.take(turn_id)
            if work is None:
                self._mailbox.remember_cancel(turn_id, reason)
                return False
            self._spawn(answer_cancelled(self._host, work, reason))
            return True
        if running:
            return False
        if self._mailbox:
            self._spawn(answer_cancelled(self._host, self._mailbox.pop(), reason))
            return True
        if self._collecting or self._rung:  # a collect in progress or due brings the next turn
            self._cancel_next = reason
            return True
        return False

    def remember_cancel(self, turn_id: str, reason: str) -> None:
        """Cancel `turn_id` when it reaches this actor (an interrupt that came before it)."""
        self._mailbox.remember_cancel(turn_id, reason)

    def lose_lease(self) -> None:
        """Forget the lease at once (renewal failed or a write was fenced out): no further turn
        starts here, the next fenced commit is refused locally, and the host is told once so it
        hands queued work back to the inbox."""
        if self.lease is None:
            return
        self.lease = None
        self._host.lease_lost(self.session_id, self.token)

    async def stop(self, reason: StopReason) -> list[TurnWork]:
        """Stop accepting, end the running turn (interrupt, then cancel after the timeout), close
        the handle, and return the queued work that never started (the caller disposes of it)."""
        if self._stopping is not None:
            await asyncio.shield(self._stopping)
            return []
        self._stopping = asyncio.get_running_loop().create_future()
        try:
            pending = await self._stop(reason)
        except BaseException as exc:
            self._stopping.set_exception(exc)
            self._stopping.exception()
            raise
        self._stopping.set_result(pending)
        return pending

    def abort(self) -> None:
        """Cancel everything without any release or announcement (a simulated crash)."""
        self.accepting = False
        for task in (self._task, *self._side_tasks, *self._finishing):
            if task is not None:
                task.cancel()
        if self._last_relay is not None:
            self._last_relay.abort()
        if self.running is not None and self.running.task is not None:
            self.running.task.cancel()

    # ------------------------------------------------------------------ internals

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro, context=self._log_context())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def _log_context(self) -> contextvars.Context:
        """What the actor's tasks run in: their records name the node and the session."""
        return task_context(node_id=self._host.node_id, session_id=self.session_id)

    def _kick(self) -> None:
        if self._task is None and self.accepting:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"actor:{self.session_id}", context=self._log_context()
            )
            self._host.actor_state_changed(self.session_id, self.token)

    async def _loop(self) -> None:
        try:
            while self.accepting and self.lease is not None:
                quiet = not self._collect_in_doubt and self._mailbox.quiet_head()
                if self._rung or (self._mailbox and not quiet):
                    # Collect before a turn (orphans of an earlier holder, messages whose
                    # doorbell this node missed) unless its reserve saw nothing waiting;
                    # nothing to run and no doorbell: done.
                    self._rung = False
                    self._collecting = True
                    try:
                        await self._collect(Priority.LATER)
                    finally:
                        self._collecting = False
                if not self._mailbox:
                    if self._rung and self.accepting:
                        continue
                    break
                work = self._mailbox.pop()
                reason, self._cancel_next = self._cancel_next, None
                if reason is not None:
                    await answer_cancelled(self._host, work, reason)
                    continue
                await self._execute(work)
        finally:
            self._cancel_next = None
            self._task = None
            self.last_active = asyncio.get_running_loop().time()
            self._host.actor_state_changed(self.session_id, self.token)

    async def _collect(self, max_priority: Priority) -> list[TurnWork]:
        """Move inbox messages into the mailbox (or return them when `max_priority` is NOW)."""
        token = self.token
        if self.lease is None:
            return []
        host, in_doubt = self._host, self._collect_in_doubt
        try:
            # After a collect that failed, its batch may be pending under this lease unseen.
            # With nothing queued or running here, a lone message's take-over goes with it.
            lone = max_priority is Priority.LATER and not self._mailbox and self.running is None
            batch = await fetch_batch(
                host, self.session_id, max_priority, token, lone=lone, reclaim_own=in_doubt
            )
        except Exception as exc:
            log.warning("collect failed for %s: %s", self.session_id, exc)
            self._collect_in_doubt = True
            return []
        self._collect_in_doubt = self._collect_in_doubt and max_priority is not Priority.LATER
        if batch.redelivered or batch.reclaimed:
            self._host.entries_reclaimed(self.session_id, batch.redelivered, batch.reclaimed)
        for entry in batch.unreadable:
            await self._host.answer_unreadable(self.session_id, entry, token)
        kept = admitted(host, self._mailbox, batch, token)
        if max_priority is Priority.NOW:
            taken = []
            for work in kept:
                if work.cancelled is not None:
                    self._mailbox.push(work)  # cancelled like any queued turn, in order
                    continue
                answer = await self._host.take_over(work)
                if isinstance(answer, Later):
                    self._mailbox.push(work)  # waits for its take-over like any queued turn
                elif answer:
                    taken.append(work)
            return taken
        for work in kept:
            self._mailbox.push(work)
        return []

    async def _offer_injection(self, works: list[TurnWork]) -> None:
        """Offer NOW work to the running turn; what it does not take joins the mailbox.

        A message joins only if the agent accepts it while the turn is still running: an
        acceptance that arrives after the turn ended would join a turn whose callers were already
        answered, so such a message runs as a turn of its own. Until the agent answers, the work
        is held in `_injecting`, where a stopping actor finds it and hands it on.
        """
        running = self.running
        inject = getattr(self._handle, "inject", None)
        self._injecting.extend(works)
        for work in works:
            accepted = False
            if running is not None and self.running is running and inject is not None:
                if work.agent_ref != self.agent_ref:
                    self._injecting.remove(work)
                    await reject(self._host, work, self.agent_ref)
                    continue
                try:
                    accepted = bool(await inject(work.input))
                except Exception:
                    log.exception("inject failed for %s", self.session_id)
            self._injecting.remove(work)
            if accepted and running is not None and not running.concluded:
                running.joined.append(work)
            else:
                self._mailbox.push(work)
                self._kick()

    async def _inject_from_inbox(self) -> None:
        if self.running is None or getattr(self._handle, "inject", None) is None:
            return
        works = await self._collect(Priority.NOW)
        if works:
            await self._offer_injection(works)

    async def _escalate_interrupt(self, running: RunningTurn, reason: str) -> None:
        handle = self._handle
        if handle is not None:
            try:
                await handle.interrupt(reason)
            except Exception:
                log.exception("LiveSession.interrupt failed for %s", self.session_id)
        task = running.task
        if task is None:
            return
        await asyncio.wait({task}, timeout=self._host.config.interrupt_grace)
        if not task.done():
            task.cancel()

    async def _ensure_binding(self, work: TurnWork, bind: str | None = None) -> bool:
        """Provision the record under this lease once (and again to `bind` an agent the opener
        accepted, if the session is unbound), then check the work's agent against the binding;
        False when the message was answered or put back."""
        lease = self.lease
        if lease is None:
            self._put_back(work)  # handed back to the inbox when the host gives the session up
            return False
        if bind is not None or not self._provisioned:
            try:
                self.agent_ref = await self._host.backends.records.provision(
                    self.session_id, bind, lease.token
                )
            except FencedOut:
                self._put_back(work)
                self.lose_lease()
                return False
            except Exception as exc:
                await fail_store(self._host, work, exc)
                return False
            self._provisioned = True
        if self.agent_ref is not None and work.agent_ref != self.agent_ref:
            await reject(self._host, work, self.agent_ref)
            return False
        return True

    def _put_back(self, work: TurnWork) -> None:
        self._mailbox.push(work)

    async def _ensure_handle(self, work: TurnWork) -> LiveSession | None:
        """The live handle, opened for the work's agent when there is none; an unbound session
        is bound to that agent only once the opener accepted it ("Agent binding" in
        docs/architecture.md), so a refused agent leaves it unbound."""
        if self._handle is not None:
            return self._handle
        attributes: dict[str, Any] = {"options": dict(work.options), **work.open_attributes}
        try:
            handle = await self._host.open_handle(self.session_id, work.agent_ref, attributes)
        except Exception as exc:
            log.exception("opener failed for %s", self.session_id)
            await fail_unrun(self._host, work, f"opening the session failed: {exc}")
            return None
        if self.agent_ref is None and not await self._ensure_binding(work, bind=work.agent_ref):
            # (another agent was bound first, or the work was put back)
            await close_handle(self._host, self.session_id, handle)
            return None
        self._handle = handle
        return handle

    def _report_drops(self, relay: EventRelay) -> None:
        if relay.dropped:
            self._host.events_dropped(self.session_id, relay.drops)

    async def _load_transcript(self, after: int) -> tuple[tuple[CommittedEntry, ...], int]:
        """`turn.transcript.load`; a store failure reaches the agent as a stickless error (and
        answers the turn BACKEND_UNAVAILABLE when it is an outage: see `conclude`)."""
        check_version(after)
        try:
            record = await self._host.backends.records.load(self.session_id, after)
        except Exception as exc:
            raise store_error(exc) from exc
        return (record.entries, record.version) if record is not None else ((), 0)

    async def _execute(self, work: TurnWork) -> None:
        with log_context(turn_id=work.turn_id):
            await self._execute_turn(work)

    async def _execute_turn(self, work: TurnWork) -> None:
        self._starting, self._cancel_starting = work, work.cancelled
        try:
            handle = await self._prepare(work)
            reason = self._cancel_starting
        finally:
            self._starting, self._cancel_starting = None, None
        if reason is not None and (handle is not None or self._mailbox.take(work.turn_id)):
            await answer_cancelled(self._host, work, reason)  # prepared, or put back for later
        elif handle is not None and not await self._host.holds_lease(self.session_id, self.token):
            # Paused or cut off past the lease while preparing: another node may run the
            # session by now, so the turn is handed on, not started here.
            self._put_back(work)
            self.lose_lease()
        elif handle is not None:
            await self._run(work, handle)

    async def _prepare(self, work: TurnWork) -> LiveSession | None:
        """Take the reservation over (waiting while a retry's backoff or a lost holder's attempt
        lasts), check the binding and open the handle; None when the work was put back,
        answered or left to another node."""
        if not work.owned and not await self._take_over(work):
            return None
        if not await self._ensure_binding(work):
            return None
        if work.pending is None and self._host.config.on_holder_lost == "retry":
            await self._host.hold(work, self.token)
        return await self._ensure_handle(work)

    async def _take_over(self, work: TurnWork) -> bool:
        """The take-over of collected work, asked again after each wait it is told to make;
        False when it does not run now (answered, left elsewhere, or put back: cancelled
        meanwhile, the lease lost, or the actor stopping)."""
        while True:
            answer = await self._host.take_over(work)
            if not isinstance(answer, Later):
                return answer
            # A cancelled turn still held by a lost holder is taken over first (its answer can
            # only be recorded by its holder): it is cancelled once won.
            cancel_now = self._cancel_starting is not None and not answer.held
            self._wake_starting.clear()
            if not cancel_now and self.accepting and self.lease is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake_starting.wait(), answer.wait)
            if cancel_now or not self.accepting or self.lease is None:
                self._put_back(work)  # answered cancelled by `_execute`, or handed on
                return False

    async def _run(self, work: TurnWork, handle: LiveSession) -> None:
        host = self._host
        work.attempt = max(work.attempt, 1)
        span = host.tracing.start("stickless.turn", work.trace, work.span_attributes(host.node_id))
        relay = EventRelay(
            self.session_id,
            work.turn_id,
            host.deliver_frames,
            host.config.relay_queue_size,
            after=self._last_relay,
            attempt=work.attempt,
            trace=span.context,
            max_batch_bytes=host.config.max_relay_batch_bytes,
        )
        self._last_relay = relay
        relay.on_flushed(self._report_drops)
        context = TurnContext(
            session_id=self.session_id,
            turn_id=work.turn_id,
            input=work.input,
            priority=work.priority,
            submit_options=work.submit_options,
            initiator=work.initiator,
            emitter=relay.emit,
            transcript=Transcript(self._load_transcript),
            attempt=work.attempt,
            fencing_token=self.token,
        )
        running = RunningTurn(work=work, context=context, relay=relay)
        self.running = running
        host.actor_state_changed(self.session_id, self.token)
        relay.emit(TurnStarted(executed_by=host.node_id, token=self.token))
        task: asyncio.Task[TurnOutput] = asyncio.get_running_loop().create_task(
            start_turn(self._host, self.token, handle, context),
            name=f"turn:{self.session_id}:{work.turn_id}",
        )
        running.task = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            relay.abort()
            self.running = None
            span.end({"stickless.result": "aborted"})
            raise
        running.concluded = True
        if await self._retry(running, task):
            span.end({"stickless.result": "retrying"})
            return
        running.bury = exhausted(self._host, running, task)
        outcome, terminal, commit, lease_lost = await conclude(
            self._host, running, task, self.lease
        )
        span.end({"stickless.result": outcome.result})
        if lease_lost:
            self.lose_lease()
        self.running = None
        self.last_active = asyncio.get_running_loop().time()
        host.actor_state_changed(self.session_id, self.token)
        # Recording and announcing must not be cut short by a stop of this actor (its callers
        # would never be answered): it runs in a task that only a crash (abort) cancels.
        finish = asyncio.ensure_future(
            self._finish(running, outcome, terminal, commit, relay, handle)
        )
        self._finishing.add(finish)
        finish.add_done_callback(self._finishing.discard)
        await asyncio.shield(finish)

    async def _retry(self, running: RunningTurn, task: asyncio.Task[TurnOutput]) -> bool:
        """Schedule the next attempt of a turn the retry policy runs again; True when it is
        (the failed attempt's frame goes out, and the work waits at the head of the mailbox)."""
        work = running.work
        error = retryable(self._host, running, task)
        if error is None or not await schedule(self._host, work, self.token, error):
            return False
        running.relay.emit(retrying_frame(work, error, self._host.node_id))
        running.relay.close()
        self.running = None
        self._host.actor_state_changed(self.session_id, self.token)
        if running.interrupt_code is FailureCode.INTERRUPTED:
            work.cancelled = running.interrupt_reason  # (interrupted while it was scheduled)
        self._put_back(work)
        return True

    async def _finish(
        self,
        running: RunningTurn,
        outcome: Outcome,
        terminal: Event,
        commit: StagedCommit | None,
        relay: EventRelay,
        handle: LiveSession,
    ) -> None:
        """Record and announce a concluded turn (and the NOW messages that joined it), then tell
        the session how it ended."""
        if not await finish_turn(self._host, running, outcome, terminal, commit, relay):
            self.lose_lease()
        await tell_turn_ended(self._host, handle, running, commit)

    async def _stop(self, reason: StopReason) -> list[TurnWork]:
        self.accepting = False
        self._wake_starting.set()
        running = self.running
        if running is not None:
            self.interrupt(reason.value, code=reason.interrupt_code)
        task = self._task
        if task is not None:
            bound = self._host.config.release_interrupt_timeout + self._host.config.interrupt_grace
            await asyncio.wait({task}, timeout=bound)
            if not task.done():
                log.warning("turn of %s did not end in %.1fs; cancelling", self.session_id, bound)
                task.cancel()
                await asyncio.wait({task})
                if running is not None:  # its relay was aborted: the frame comes late
                    await answer_cut_short(self._host, running.work, reason)
        if self._last_relay is not None:
            # Terminal frames go out before the session's EVICT or hand-over is announced.
            await self._last_relay.flushed(self._host.config.release_interrupt_timeout)
        # Side tasks (NOW collects, injections) end before the queue is handed on, so nothing
        # they hold is lost: a collect gets the grace to finish taking its batch over, and an
        # injection cut short leaves its work in `_injecting`.
        if self._side_tasks:
            await asyncio.wait(tuple(self._side_tasks), timeout=self._host.config.interrupt_grace)
        for side in tuple(self._side_tasks):
            side.cancel()
        if self._side_tasks:
            await asyncio.wait(tuple(self._side_tasks))
        for work in self._injecting:
            self._mailbox.push(work)
        self._injecting.clear()
        pending = self._mailbox.drain()
        handle, self._handle = self._handle, None
        if handle is not None:
            await close_handle(self._host, self.session_id, handle)
        return pending
