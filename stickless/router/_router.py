"""SessionRouter: the node supervisor and the public face of one node.

It composes the parts that each do one job (see docs/architecture.md): the caller table, the
status board, the control channel, the local sessions, turn outcomes, hand-over, the submit path
and the periodic sweeps, and starts and stops them in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .._config import DeploymentMode, RouterConfig
from .._errors import (
    BackendUnavailableError,
    InternalError,
    InvalidRequestError,
    RouterClosedError,
    StoreMisconfiguredError,
)
from .._logs import as_node
from .._metrics import NOOP_METRICS, SafeMetrics, SessionMetrics
from .._session import FactoryOpener, LiveSession, LiveSessionOpener
from .._trace import Tracing
from .._types import CommittedEntry, SubmitRequest, TurnResult
from ..actors import SessionActor, StopReason
from ..backends.base import HOLDER_INDEX_TTL, Backends, Lease, check_version
from ..wire import (
    EvictPayload,
    Signal,
    SignalKind,
    TurnResultPayload,
    YieldPayload,
)
from ._api import ClusterSessionStatus, SessionState, SubmitDisposition, SubmitKind, TurnInfo
from ._background import Background, io, log, quiet
from ._callers import CallerTable, Forward
from ._context import NodeContext
from ._control import ControlChannel, SignalHandler
from ._dead_letters import DeadLetters
from ._handover import Handover
from ._host import NodeActorHost
from ._interrupts import Interrupts
from ._lookup import TurnLookup
from ._outcomes import TurnOutcomes
from ._renewal import LeaseRenewer
from ._sessions import LocalSessions
from ._status import STATUS_COALESCE, StatusBoard
from ._stream import EventStream, check_cursor
from ._submit import Submitter
from ._sweeps import Sweeps
from ._turn_stream import TurnStream


class SessionRouter:
    """One node's router: serializes session turns cluster-wide without sticky routing."""

    def __init__(
        self,
        config: RouterConfig,
        opener: LiveSessionOpener,
        backends: Backends,
        metrics: SessionMetrics,
        tracer_provider: Any | None = None,
    ) -> None:
        node_id = config.effective_node_id
        self._config = config
        self._node_id = node_id
        self._backends = backends
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._status_flush: asyncio.TimerHandle | None = None
        self._metrics = safe_metrics = SafeMetrics(metrics)
        self._store_warnings: tuple[str, ...] = ()
        self._bg = Background(
            node_id, lambda loop: safe_metrics.emit("on_loop_failure", node_id, loop)
        )
        self._renewer = LeaseRenewer(
            backends.clone(role="renewal"),
            node_id,
            lease_ttl=config.lease_ttl,
            interval=config.lease_extend_interval,
            index_ttl=HOLDER_INDEX_TTL,
            watchdog_timeout=config.effective_watchdog_timeout,
            path_timeout=config.command_path_timeout,
            on_lost=self._lost_on_renewer_thread,
        )
        self._callers = CallerTable(config.forward_ttl, on_expired=self._forward_expired)
        self._board = StatusBoard(node_id)
        ctx = NodeContext(
            node_id,
            config,
            backends,
            self._renewer,
            self._bg,
            safe_metrics,
            self._callers,
            self._board,
            Tracing(tracer_provider),
        )
        self._control = ControlChannel(ctx)
        self._sessions = LocalSessions(ctx, new_actor=self._new_actor, on_claimed=self._enforce_lru)
        self._outcomes = TurnOutcomes(ctx, control=self._control)
        acting = (ctx, self._sessions, self._outcomes, self._control)
        self._handover = Handover(*acting)
        self._submitter = Submitter(*acting)
        self._interrupts = Interrupts(*acting)
        self._sweeps = Sweeps(*acting, handover=self._handover)
        self._lookup = TurnLookup(ctx, self._sessions)
        self._dead_letters = DeadLetters(backends.dead_letters, self.submit, self._check_open)
        self._host = NodeActorHost(
            ctx,
            opener=opener,
            sessions=self._sessions,
            control=self._control,
            outcomes=self._outcomes,
            handover=self._handover,
            state_changed=self._actor_state_changed,
        )

    # ------------------------------------------------------------ construction

    @classmethod
    def build(
        cls,
        *,
        config: RouterConfig | None = None,
        opener: LiveSessionOpener | None = None,
        session_factory: Callable[[str, str], Any] | None = None,
        backends: Backends | None = None,
        metrics: SessionMetrics | None = None,
        tracer_provider: Any | None = None,
    ) -> SessionRouter:
        """Assemble a router; `tracer_provider` is an OpenTelemetry TracerProvider (default: the
        global one) for the spans of its submits, forwards and turns.

        Raises:
            ValueError: not exactly one of `opener` / `session_factory`, or DISTRIBUTED mode
                without distributed backends.
        """
        config = (config or RouterConfig()).resolved()
        if (opener is None) == (session_factory is None):
            raise ValueError("pass exactly one of opener= or session_factory=")
        if session_factory is not None:
            opener = FactoryOpener(_as_async_factory(session_factory))
        assert opener is not None
        if backends is None:
            if config.mode is DeploymentMode.DISTRIBUTED:
                raise ValueError("DISTRIBUTED mode requires backends= (e.g. RedisBackends)")
            from ..backends.memory import MemoryBackends

            backends = MemoryBackends()
        elif config.mode is DeploymentMode.DISTRIBUTED and not getattr(
            backends, "distributed", False
        ):
            raise ValueError(
                "DISTRIBUTED mode refuses in-process backends: they would split the brain"
            )
        return cls(config, opener, backends, metrics or NOOP_METRICS, tracer_provider)

    def _new_actor(
        self, session_id: str, lease: Lease, agent_ref: str | None, provisioned: bool
    ) -> SessionActor:
        return SessionActor(self._host, session_id, lease, agent_ref, provisioned)

    def _enforce_lru(self) -> None:
        self._sweeps.enforce_lru()

    # ------------------------------------------------------------ properties

    @property
    def node_id(self) -> str:
        """This node's id (the lease holder name and `executed_by` of its turns)."""
        return self._node_id

    @property
    def config(self) -> RouterConfig:
        return self._config

    @property
    def backends(self) -> Backends:
        return self._backends

    @property
    def dead_letters(self) -> DeadLetters:
        """The namespace's dead letters: list, get, replay (under the original key), remove,
        purge; and `bury`, to keep a message that will not run again."""
        return self._dead_letters

    @property
    def closed(self) -> bool:
        return self._bg.closed

    @property
    def accepting(self) -> bool:
        """Started and not closed: calls are taken."""
        return self._started and not self._bg.closed

    @property
    def failing_loops(self) -> Mapping[str, str]:
        """Background loops failing now (each failed round after round, or stopped), by name,
        with why; empty while all are healthy. `/readyz` reports the node unready meanwhile."""
        return self._bg.health.failing

    @property
    def renewer(self) -> LeaseRenewer:
        """The lease renewer (diagnostics and failure tests)."""
        return self._renewer

    @property
    def store_warnings(self) -> tuple[str, ...]:
        """What the store reported at start as weakening the guarantees (e.g. an evicting Redis
        the operator allowed); `/readyz` shows them."""
        return self._store_warnings

    def local_sessions(self) -> list[str]:
        """Sessions this node currently holds (has an actor for)."""
        return self._sessions.ids()

    # ------------------------------------------------------------ lifecycle

    @as_node
    async def start(self) -> None:
        """Check the store's configuration, subscribe to the control channel, register this
        node's incarnation (so it may hold sessions), then start the renewer and the sweeps.

        Raises:
            StoreMisconfiguredError: the store cannot keep the guarantees (nothing was started).
        """
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        self._store_warnings = await self._verify_store()
        self._backends.watch_answers(self._renewer.answered)
        await self._control.open(self._signal_handlers(), self._resubscribed)
        try:
            await io(self._renewer.register(self._backends))
        except (BackendUnavailableError, InternalError) as exc:  # the renewer keeps trying
            log.warning("node %s could not register its liveness yet: %s", self._node_id, exc)
        self._started = True
        self._renewer.start()
        self._sweeps.start()

    async def _verify_store(self) -> tuple[str, ...]:
        """The store's configuration warnings, each logged and counted."""
        try:
            warnings = await self._backends.verify()
        except StoreMisconfiguredError:
            raise
        except Exception as exc:  # out of reach: the Redis bundle checks each new connection
            log.warning("node %s could not check the store's configuration: %s", self._node_id, exc)
            return ()
        for warning in warnings:
            log.warning("store: %s", warning)
        self._metrics.emit("on_store_warnings", len(warnings))
        return warnings

    @as_node
    async def aclose(self, grace: float = 5.0) -> None:
        """Graceful shutdown: stop accepting, let turns finish up to `grace`, end the rest
        (SHUTDOWN), hand queued work back to the inbox, close handles, release leases; then wait
        out the grace for the answers of the work handed on, and withdraw what nobody took (its
        callers get SHUTDOWN, and it never runs)."""
        if self._bg.closed:
            return
        self._bg.closed = True
        deadline = asyncio.get_running_loop().time() + grace
        actors = self._sessions.actors()
        for actor in actors:
            actor.accepting = False
        busy = [t for a in actors if (t := a.task) is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace)
        await asyncio.gather(
            *(self._handover.give_up_locked(a, StopReason.SHUTDOWN) for a in actors),
            return_exceptions=True,
        )
        await self._sweeps.settle_before_close(deadline)
        await asyncio.to_thread(self._renewer.stop, True)
        self._cancel_status_flush()
        await self._bg.stop()
        await self._control.close()
        self._callers.fail_all("router closed")
        self._control.finish_subscribers()

    @as_node
    async def kill(self) -> None:
        """Simulated crash: stop every task without releasing or announcing anything.

        Everything stops before the first await, so no turn of this node answers anyone after
        the crash instant; its own callers get RouterClosedError.
        """
        self._bg.closed = True
        self._cancel_status_flush()
        self._bg.cancel()
        for actor in self._sessions.actors():
            actor.abort()
        self._sessions.clear()
        self._callers.fail_all("router killed")
        self._control.finish_subscribers()
        await asyncio.to_thread(self._renewer.stop)
        await self._bg.wait_cancelled()

    def _check_open(self) -> None:
        if self._bg.closed:
            raise RouterClosedError(f"router {self._node_id} is closed")
        if not self._started:
            raise RouterClosedError(f"router {self._node_id} is not started")

    # ------------------------------------------------------------ public controls

    @as_node
    async def submit(self, request: SubmitRequest | Mapping[str, Any]) -> SubmitDisposition:
        """Run one turn for the request's session here or on its holder.

        Raises:
            InvalidRequestError: the request is malformed (nothing reserved).
            ConflictingAgentError: the session is bound to another agent.
            IdempotencyConflictError: the key was used with a different input.
            BackendUnavailableError: a shared backend failed (nothing reserved).
            RouterClosedError: this router is closed.
        """
        req = self._submitter.validate(request)
        self._check_open()
        return await self._submitter.submit(req)

    @as_node
    async def result(
        self, session_id: str, turn_id: str, timeout: float | None = None  # noqa: ASYNC109 (the API's bound)
    ) -> TurnResult:
        """The turn's result, from any node (whichever took the submit, even if it died),
        waiting while the turn is queued or running.

        Raises:
            TurnFailedError: the turn failed (`.code` says why).
            UnknownTurnError: the session has no such turn, or it expired.
            TimeoutError: no answer within `timeout` seconds.
            BackendUnavailableError: the store could not be read.
            RouterClosedError: this router is (or got) closed.
        """
        self._check_open()
        return await self._lookup.result(session_id, turn_id, timeout)

    @as_node
    async def turn(self, session_id: str, turn_id: str) -> TurnInfo:
        """The turn's state (queued, running, completed, failed) and answer, without waiting.

        Raises:
            UnknownTurnError: the session has no such turn, or it expired.
            BackendUnavailableError: the store could not be read.
        """
        self._check_open()
        return await self._lookup.turn(session_id, turn_id)

    @as_node
    async def stream(self, request: SubmitRequest | Mapping[str, Any]) -> TurnStream:
        """Submit, and stream that turn's frames from its first one to its terminal one, be it
        new, attached to the running turn of the same key, or answered from the cache
        (`.disposition.origin` says which).

        Raises:
            the errors of `submit` (nothing is streamed then).
        """
        req = self._submitter.validate(request)
        self._check_open()
        live = self._control.stream(req.session_id, None, None)
        try:
            await live.ready()  # frames from other nodes are heard before the turn can start
            disposition = await self._submitter.submit(req)
        except BaseException:
            await live.aclose()
            raise
        return TurnStream(disposition, live, self._backends.events)

    @as_node
    async def follow(
        self, session_id: str, turn_id: str, after: str | None = None
    ) -> TurnStream:
        """Stream a submitted turn's frames (past the event id `after`, else from its first),
        live while it runs, ending with its terminal frame; on any node, whichever took it.

        Raises:
            UnknownTurnError: the session has no such turn, or it expired.
            InvalidRequestError: `after` is not an event id.
            BackendUnavailableError: the store could not be read.
        """
        self._check_open()
        if after is not None:
            check_cursor(after)
        info = await self._lookup.turn(session_id, turn_id)
        live = self._control.stream(session_id, None, None)
        try:
            await live.ready()
            answer = asyncio.ensure_future(self._lookup.result(session_id, turn_id, None))
        except BaseException:
            await live.aclose()
            raise
        disposition = SubmitDisposition(
            kind=SubmitKind.FORWARDED,
            session_id=session_id,
            turn_id=turn_id,
            node_id=info.executed_by or "",
            result=answer,
            attached=True,
        )
        return TurnStream(
            disposition, live, self._backends.events, after=after, owns_answer=True
        )

    @as_node
    async def transcript(self, session_id: str, after: int = 0) -> list[CommittedEntry]:
        """The session's committed transcript past version `after` (all of it by default),
        read from its record (empty without one).

        Raises:
            InvalidRequestError: `after` is not a transcript version (an int >= 0).
            BackendUnavailableError: the store could not be read.
        """
        self._check_open()
        try:
            check_version(after)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        record = await io(self._backends.records.load(session_id, after))
        return [] if record is None else list(record.entries)

    def events(
        self, session_id: str, turn_id: str | None = None, after: str | None = None
    ) -> EventStream:
        """Stream the session's frames from now (or replay from the event log after `after`).

        Registration is immediate; `await stream.ready()` waits until frames from other nodes
        are also received. With `turn_id` the stream ends after that turn's terminal frame.
        """
        self._check_open()
        return self._control.stream(session_id, turn_id, after)

    @as_node
    async def interrupt(
        self, session_id: str, reason: str = "USER", turn_id: str | None = None
    ) -> bool:
        """Interrupt the session's running turn wherever it runs, or, when none runs, cancel the
        turn about to start; with `turn_id`, only that turn, running or still queued (a
        cancelled turn never runs and its callers get INTERRUPTED).

        Returns whether a turn was interrupted or cancelled, as far as this node learns within
        `interrupt_grace` (the node that acted tells it); False at once for a `turn_id` the store
        records as answered (or does not know).

        Raises:
            BackendUnavailableError: the interrupt could not be sent to the cluster.
        """
        self._check_open()
        return await self._interrupts.interrupt(session_id, reason, turn_id)

    @as_node
    async def release_session(self, session_id: str) -> None:
        """Drop the live handle, lease and queued messages (EVICTED); the history is kept."""
        self._check_open()
        await self._handover.release(session_id)

    @as_node
    async def delete_session(self, session_id: str) -> None:
        """Delete the session's history; only the holder may, so take the lease (YIELD hand-off).

        Raises:
            SessionBusyError: the holder did not hand the session over within
                `release_interrupt_timeout`.
        """
        self._check_open()
        await self._handover.delete(session_id)

    @as_node
    async def status(self, session_id: str) -> ClusterSessionStatus:
        """Best-effort status of the session across the cluster; never use it as a control gate."""
        self._check_open()
        actor = self._sessions.get(session_id)
        if actor is not None:
            read = await quiet(self._backends.inbox.pending_stats([session_id]))
            backlog = read[session_id] if read else self._board.backlog(session_id)
            return self._board.local(actor, time.time(), backlog)
        fresh_for = 3 * self._config.status_heartbeat_interval
        now = asyncio.get_running_loop().time()
        seen = self._board.seen(session_id, now, fresh_for)
        if seen is not None:
            return seen.model_copy(update={"observed_by": self._node_id})
        lease = await io(self._backends.leases.current(session_id))
        return ClusterSessionStatus(
            session_id=session_id,
            holder=lease.holder if lease else None,
            token=lease.token if lease else None,
            state=SessionState.HELD if lease else SessionState.UNHELD,
            observed_by=self._node_id,
        )

    @as_node
    async def peer_lost(self, node_id: str) -> list[str]:
        """Another node is known dead (e.g. its Ray actor died): end its incarnation, so its
        leases are free and its reservations stale now, then sweep and drain its sessions
        instead of waiting for its liveness to run out.

        Fencing keeps this safe: the dead node's late writes carry older tokens. Returns the
        sessions whose leases were revoked.

        Raises:
            BackendUnavailableError: the backends could not be reached.
        """
        self._check_open()
        if node_id == self._node_id:
            return []
        await io(self._backends.liveness.retire(node_id))
        return await self._sweeps.bury_holder(node_id)

    # ------------------------------------------------------------ wiring between parts

    def _actor_state_changed(self, actor: SessionActor) -> None:
        """An actor's state changed: schedule its STATUS publish and let hand-over react."""
        if self._bg.closed or not self._sessions.holds(actor):
            return
        if self._board.changed(actor.session_id) and self._loop is not None:
            self._status_flush = self._loop.call_later(STATUS_COALESCE, self._flush_status)
        self._handover.settled(actor)

    def _resubscribed(self) -> None:
        """Signals were missed while the control channel was down: every pending forward looks
        for its answer in the store now (not at the next poll)."""
        if not self._bg.closed:
            self._bg.spawn(self._sweeps.poll_forwards(), "resubscribed")

    def _forward_expired(self, forward: Forward) -> None:
        self._bg.spawn(self._sweeps.withdraw(forward), "withdraw")

    def _flush_status(self) -> None:
        self._status_flush = None
        signals = self._board.flush(self._sessions.get, time.time())
        if signals and not self._bg.closed:
            self._bg.spawn(self._control.publish_signals(signals), "status")

    def _cancel_status_flush(self) -> None:
        if self._status_flush is not None:
            self._status_flush.cancel()

    def _lost_on_renewer_thread(self, session_id: str, token: int) -> None:
        """Renewer thread: a lease was lost; hand the reaction to the main loop, never block."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._handover.renewal_failed, session_id, token)

    def _signal_handlers(self) -> dict[SignalKind, SignalHandler]:
        """What each control signal from the cluster does on this node."""
        bg = self._bg

        def doorbell(signal: Signal) -> None:
            held_by = signal.payload.get("held_by")
            held = held_by if isinstance(held_by, str) else None
            bg.spawn(self._sessions.on_doorbell(signal.session_id, held), "doorbell")

        def turn_result(signal: Signal) -> None:
            self._callers.resolve(TurnResultPayload.model_validate(signal.payload).outcome)

        def evict(signal: Signal) -> None:
            token = EvictPayload.model_validate(signal.payload).token
            bg.spawn(self._handover.on_evict(signal.session_id, token), "evict")

        def yield_(signal: Signal) -> None:
            purpose = YieldPayload.model_validate(signal.payload).purpose
            bg.spawn(self._handover.on_yield(signal.session_id, purpose), "yield")

        def status(signal: Signal) -> None:
            self._board.fold(signal, asyncio.get_running_loop().time())

        return {
            SignalKind.MESSAGE_ENQUEUED: doorbell,
            SignalKind.TURN_RESULT: turn_result,
            SignalKind.INTERRUPT: self._interrupts.on_interrupt,
            SignalKind.INTERRUPT_ACK: self._interrupts.on_ack,
            SignalKind.EVICT: evict,
            SignalKind.YIELD: yield_,
            SignalKind.STATUS: status,
        }


def _as_async_factory(
    factory: Callable[[str, str], Any],
) -> Callable[[str, str], Awaitable[LiveSession]]:
    async def open_session(session_id: str, agent_ref: str) -> LiveSession:
        made = factory(session_id, agent_ref)
        if inspect.isawaitable(made):
            made = await made
        if not isinstance(made, LiveSession):
            raise TypeError("session_factory must return a LiveSession")
        return made

    return open_session
