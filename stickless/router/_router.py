"""SessionRouter: the node supervisor and the public face of one node.

It wins and renews leases, drains the shared inbox into session actors, turns cluster signals
into actor messages, runs the forward poll and the cache sweeper, and answers callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from .._config import DeploymentMode, RouterConfig
from .._errors import (
    BackendUnavailableError,
    ConflictingAgentError,
    FailureCode,
    IdempotencyConflictError,
    InvalidRequestError,
    RouterClosedError,
    SessionBusyError,
    SticklessError,
    TurnFailedError,
)
from .._events import Event, Interrupted
from .._metrics import NOOP_METRICS, SafeMetrics, SessionMetrics
from .._session import FactoryOpener, LiveSession, LiveSessionOpener
from .._types import SubmitRequest, TurnResult, invalid_request
from ..actors import SessionActor, StopReason, Subscriber, SubscriberHub, Takeover, TurnWork
from ..backends.base import (
    Backends,
    FencedOut,
    HeldElsewhere,
    HolderTakeover,
    InboundMessage,
    Lease,
    Reservation,
    ReservationState,
    Subscription,
    UnreadableEntry,
)
from ..wire import (
    EvictPayload,
    InterruptPayload,
    Outcome,
    Signal,
    SignalKind,
    StatusPayload,
    TurnResultPayload,
    WireError,
    YieldPayload,
    frames_from_payload,
    frames_to_payload,
)
from ._api import ClusterSessionStatus, SessionState, SubmitDisposition, SubmitKind
from ._renewal import LeaseRenewer
from ._stream import EventStream

log = logging.getLogger("stickless.router")

T = TypeVar("T")

#: Prefixes keep client idempotency keys and per-turn internal keys apart.
_CLIENT_KEY = "c:"
_TURN_KEY = "t:"
#: Seconds during which a session's state changes coalesce into one STATUS publish.
_STATUS_COALESCE = 0.05
#: Token of a forward whose lease is unknown: larger than any real token, so no EVICT fails it.
_UNKNOWN_TOKEN = 2**62


@dataclass
class _Forward:
    """A caller on this node waiting for a turn that runs (or will run) elsewhere."""

    session_id: str
    key: str
    turn_id: str
    deadline: float
    token: int


class _KeyedLocks:
    """One asyncio lock per session, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class SessionRouter:
    """One node's router: serializes session turns cluster-wide without sticky routing."""

    def __init__(
        self,
        config: RouterConfig,
        opener: LiveSessionOpener,
        backends: Backends,
        metrics: SessionMetrics,
    ) -> None:
        self._config = config
        self._node_id = config.effective_node_id
        self._opener = opener
        self._backends = backends
        self._metrics = SafeMetrics(metrics)
        self._actors: dict[str, SessionActor] = {}
        self._locks = _KeyedLocks()
        self._waiters: dict[str, list[tuple[asyncio.Future[TurnResult], str]]] = {}
        self._forwards: dict[str, _Forward] = {}
        #: Reservations of this node's refused submits whose removal is still being retried.
        self._refused: dict[tuple[str, str], str] = {}
        self._renewer = LeaseRenewer(
            backends.clone(),
            self._node_id,
            lease_ttl=config.lease_ttl,
            interval=config.lease_extend_interval,
            secondary_ttl=config.idempotency_secondary_ttl,
            watchdog_timeout=config.effective_watchdog_timeout,
            on_lost=self._lost_on_renewer_thread,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hub = SubscriberHub()
        self._event_channels: dict[str, asyncio.Future[None]] = {}
        self._projection: dict[str, ClusterSessionStatus] = {}
        self._projection_received: dict[str, float] = {}
        self._evict_waiters: dict[str, list[asyncio.Event]] = {}
        self._status_seq = 0
        self._last_status: dict[str, tuple[SessionState, str | None]] = {}
        self._status_dirty: set[str] = set()
        self._status_flush: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._control: Subscription | None = None
        self._started = False
        self._closed = False
        self._stopping = asyncio.Event()

    # ================================================================== construction

    @classmethod
    def build(
        cls,
        *,
        config: RouterConfig | None = None,
        opener: LiveSessionOpener | None = None,
        session_factory: Callable[[str, str], Any] | None = None,
        backends: Backends | None = None,
        metrics: SessionMetrics | None = None,
    ) -> SessionRouter:
        """Assemble a router.

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
        return cls(config, opener, backends, metrics or NOOP_METRICS)

    # ================================================================== properties

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
    def closed(self) -> bool:
        return self._closed

    @property
    def renewer(self) -> LeaseRenewer:
        """The lease renewer (diagnostics and failure tests)."""
        return self._renewer

    def local_sessions(self) -> list[str]:
        """Sessions this node currently holds (has an actor for)."""
        return list(self._actors)

    # ================================================================== lifecycle

    async def start(self) -> None:
        """Subscribe to the control channel and start the background loops."""
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        self._control = await self._backends.signals.subscribe(self._on_signal)
        self._started = True
        self._renewer.start()
        for loop in (
            self._heartbeat_loop(),
            self._forward_poll_loop(),
            self._cache_sweep_loop(),
            self._status_heartbeat_loop(),
            self._holder_loss_sweep_loop(),
        ):
            self._loops.append(asyncio.get_running_loop().create_task(loop))

    async def aclose(self, grace: float = 5.0) -> None:
        """Graceful shutdown (§6.3C): stop accepting, let turns finish up to `grace`, interrupt
        the rest, hand queued work back to the inbox, close handles, release leases."""
        if self._closed:
            return
        self._closed = True
        actors = list(self._actors.values())
        for actor in actors:
            actor.accepting = False
        busy = [t for a in actors if (t := a.task) is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace)
        await asyncio.gather(
            *(self._give_up(a, StopReason.SHUTDOWN) for a in actors), return_exceptions=True
        )
        await asyncio.to_thread(self._renewer.stop)
        await self._stop_background()
        for session_id in list(self._event_channels):
            with contextlib.suppress(Exception):
                await self._backends.signals.unsubscribe_events(session_id)
        self._event_channels.clear()
        if self._control is not None:
            with contextlib.suppress(Exception):
                await self._control.close()
        self._fail_all_waiters("router closed")
        self._hub.finish_all()

    async def kill(self) -> None:
        """Simulated crash: stop every task without releasing or announcing anything.

        Everything stops before the first await, so no turn of this node answers anyone after
        the crash instant; its own callers get RouterClosedError.
        """
        self._closed = True
        if self._status_flush is not None:
            self._status_flush.cancel()
        for loop in self._loops:
            loop.cancel()
        for actor in list(self._actors.values()):
            actor.abort()
        for task in list(self._tasks):
            task.cancel()
        self._actors.clear()
        self._fail_all_waiters("router killed")
        self._hub.finish_all()
        await asyncio.to_thread(self._renewer.stop)
        pending = [*self._loops, *self._tasks]
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        self._loops.clear()

    async def _pause(self, seconds: float) -> bool:
        """Sleep between rounds of a background loop; False once the router is stopping."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def _stop_background(self) -> None:
        """Let the loops finish their round (no backend call is cut off mid-flight, which
        would leave its connection half-open), then cancel whatever is still running."""
        if self._status_flush is not None:
            self._status_flush.cancel()
        self._stopping.set()
        running = [*self._loops, *self._tasks]
        if running:
            await asyncio.wait(running, timeout=2.0)
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        pending = [*self._loops, *self._tasks]
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        self._loops.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise RouterClosedError(f"router {self._node_id} is closed")
        if not self._started:
            raise RouterClosedError(f"router {self._node_id} is not started")

    def _spawn(self, coro: Awaitable[Any], name: str = "") -> None:
        task = asyncio.ensure_future(coro)
        if name:
            task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    # ================================================================== submit (§7.1 F0-F2)

    async def submit(self, request: SubmitRequest | Mapping[str, Any]) -> SubmitDisposition:
        """Run one turn for the request's session here or on its holder.

        Raises:
            InvalidRequestError: the request is malformed (nothing reserved).
            ConflictingAgentError: the session is bound to another agent.
            IdempotencyConflictError: the key was used with a different input.
            BackendUnavailableError: a shared backend failed (nothing reserved).
            RouterClosedError: this router is closed.
        """
        req = self._validate(request)
        self._check_open()
        turn_id = uuid.uuid4().hex
        future = self._add_waiter(turn_id, req.session_id)  # F0: before any I/O
        try:
            return await self._submit(req, turn_id, future)
        except BaseException:
            self._remove_waiter(turn_id, future)
            raise

    def _validate(self, request: SubmitRequest | Mapping[str, Any]) -> SubmitRequest:
        if isinstance(request, SubmitRequest):
            req = request
        else:
            try:
                req = SubmitRequest.model_validate(dict(request))
            except ValidationError as exc:
                raise invalid_request(exc) from None
        size = len(req.input.canonical_bytes())
        if size > self._config.max_input_bytes:
            raise InvalidRequestError(
                f"input: encoded size {size} bytes exceeds max_input_bytes "
                f"({self._config.max_input_bytes})"
            )
        return req

    async def _submit(
        self, req: SubmitRequest, turn_id: str, future: asyncio.Future[TurnResult]
    ) -> SubmitDisposition:
        session_id = req.session_id
        # F1: binding pre-check; a request bound to fail reserves nothing.
        bound = await self._io(self._backends.records.binding(session_id))
        if bound is not None and bound != req.agent_ref:
            raise ConflictingAgentError(
                f"session {session_id} is bound to agent {bound!r}, not {req.agent_ref!r}"
            )
        # F2: idempotency (§9.2).
        key = (
            _CLIENT_KEY + req.idempotency_key
            if req.idempotency_key is not None
            else _TURN_KEY + turn_id
        )
        input_hash = req.input_hash()
        primary = self._primary_ttl(key)
        for _ in range(3):
            try:
                existing = await self._io(
                    self._backends.idempotency.put_if_absent(
                        session_id,
                        key,
                        turn_id,
                        input_hash,
                        self._node_id,
                        self._config.idempotency_secondary_ttl,
                        primary,
                    )
                )
            except BackendUnavailableError:
                await self._discard(session_id, key, turn_id)  # it may have been written
                raise
            if existing is None:
                break
            if existing.input_hash != input_hash:
                raise IdempotencyConflictError(
                    f"idempotency_key {req.idempotency_key!r} was used with a different input"
                )
            if existing.state is ReservationState.DONE and existing.outcome is not None:
                return self._answer_cached(req, existing, turn_id, future)
            if existing.stale:
                await self._reset_stale(existing)
                continue
            if self._refused.get((session_id, key)) == existing.turn_id:
                # A ghost of this node's own refused submit: drop it now the store answers.
                await self._io(
                    self._backends.idempotency.discard_reservation(
                        session_id, key, existing.turn_id
                    )
                )
                self._refused.pop((session_id, key), None)
                continue
            return await self._attach(req, existing, turn_id, future)
        else:
            raise BackendUnavailableError(f"idempotency key of {session_id} keeps changing")
        work = TurnWork.from_request(req, turn_id, key, self._node_id)
        try:
            return await self._place(work, future)
        except BaseException:
            await self._discard(session_id, key, turn_id)
            raise

    async def _discard(self, session_id: str, key: str, turn_id: str) -> None:
        """Drop a refused submit's reservation; retried in the background if the store is down,
        so the client's retry with the same key runs instead of following a ghost (a retry on
        this node drops the ghost itself; elsewhere a follower learns of it from the poll)."""
        self._renewer.disown(session_id, key)
        try:
            await self._backends.idempotency.discard_reservation(session_id, key, turn_id)
        except Exception:
            self._refused[(session_id, key)] = turn_id
            self._spawn(self._discard_later(session_id, key, turn_id), "discard-retry")

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

    def _primary_ttl(self, key: str) -> float:
        # Internal per-turn keys only need to outlive the pollers that may read them.
        if key.startswith(_TURN_KEY):
            return min(self._config.idempotency_primary_ttl, self._config.forward_ttl * 2)
        return self._config.idempotency_primary_ttl

    def _answer_cached(
        self,
        req: SubmitRequest,
        existing: Reservation,
        turn_id: str,
        future: asyncio.Future[TurnResult],
    ) -> SubmitDisposition:
        assert existing.outcome is not None
        self._remove_waiter(turn_id, future)
        _settle(future, req.session_id, existing.outcome)
        self._metrics.emit("on_submit", req.session_id, SubmitKind.EXECUTED_LOCALLY.value)
        return SubmitDisposition(
            SubmitKind.EXECUTED_LOCALLY, req.session_id, existing.turn_id, self._node_id, future
        )

    async def _attach(
        self,
        req: SubmitRequest,
        existing: Reservation,
        turn_id: str,
        future: asyncio.Future[TurnResult],
    ) -> SubmitDisposition:
        """Same key, same input, in flight: follow the original turn (no new turn)."""
        token = await self._running_token(req.session_id)
        self._remove_waiter(turn_id, future)
        self._waiters.setdefault(existing.turn_id, []).append((future, req.session_id))
        self._forwards.setdefault(
            existing.turn_id,
            _Forward(req.session_id, existing.key, existing.turn_id, self._deadline(), token),
        )
        self._metrics.emit("on_submit", req.session_id, SubmitKind.FORWARDED.value)
        return SubmitDisposition(
            SubmitKind.FORWARDED, req.session_id, existing.turn_id, self._node_id, future
        )

    async def _running_token(self, session_id: str) -> int:
        """The lease token a followed turn runs under, as far as this node can tell.

        Only an EVICT of that lease (or a later one) may fail the follower. When no lease is
        visible the token is unknown: no EVICT fails the follower, whose answer then comes from
        the turn's result or the store poll, both of which record an eviction too.
        """
        actor = self._actors.get(session_id)
        if actor is not None:
            return actor.token
        lease = await self._quiet(self._backends.leases.current(session_id))
        return lease.token if lease is not None else _UNKNOWN_TOKEN

    async def _place(self, work: TurnWork, future: asyncio.Future[TurnResult]) -> SubmitDisposition:
        """Run on this node's actor (claiming the session if free), else forward to the holder."""
        session_id = work.session_id
        async with self._locks.hold(session_id):
            actor = self._actors.get(session_id)
            if actor is not None and actor.accepting and actor.lease is not None:
                self._renewer.own(session_id, work.key)
                actor.enqueue(work)
                self._metrics.emit("on_cache_hit", session_id)
                return self._local(work, future)
            if actor is None:
                claimed = await self._claim(session_id, work.agent_ref)
                if isinstance(claimed, SessionActor):
                    self._renewer.own(session_id, work.key)
                    claimed.enqueue(work)
                    return self._local(work, future)
                held_by, token = claimed.holder, claimed.token
            else:  # our actor is stopping: queue behind it; its hand-over rings the doorbell
                held_by, token = self._node_id, actor.token
        return await self._forward(work, future, held_by, token)

    def _local(self, work: TurnWork, future: asyncio.Future[TurnResult]) -> SubmitDisposition:
        self._metrics.emit("on_submit", work.session_id, SubmitKind.EXECUTED_LOCALLY.value)
        return SubmitDisposition(
            SubmitKind.EXECUTED_LOCALLY, work.session_id, work.turn_id, self._node_id, future
        )

    async def _forward(
        self, work: TurnWork, future: asyncio.Future[TurnResult], held_by: str, token: int
    ) -> SubmitDisposition:
        idem = self._backends.idempotency
        await self._io(
            idem.release_holder(work.session_id, work.key, self._node_id, self._config.forward_ttl)
        )
        message_id = await self._io(self._backends.inbox.deliver(work.to_envelope()))
        self._forwards[work.turn_id] = _Forward(
            work.session_id, work.key, work.turn_id, self._deadline(), token
        )
        await self._ring_doorbell(work.session_id, held_by)
        self._metrics.emit("on_submit", work.session_id, SubmitKind.FORWARDED.value)
        return SubmitDisposition(
            SubmitKind.FORWARDED, work.session_id, work.turn_id, self._node_id, future, message_id
        )

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self._config.forward_ttl

    async def _claim(self, session_id: str, agent_ref: str | None) -> SessionActor | HeldElsewhere:
        """Lease first, then binding, then record (seed §5.3); a loser touches no record.

        Raises:
            ConflictingAgentError: the record is bound to another agent (lease given back).
            BackendUnavailableError: a backend failed (lease given back).
        """
        started = time.perf_counter()
        won = await self._io(
            self._backends.leases.acquire(session_id, self._node_id, self._config.lease_ttl)
        )
        self._metrics.emit(
            "on_lock_acquire", session_id, isinstance(won, Lease), time.perf_counter() - started
        )
        if isinstance(won, HeldElsewhere):
            return won
        bound: str | None = None
        if agent_ref is not None:
            try:
                bound = await self._io(
                    self._backends.records.provision(session_id, agent_ref, won.token)
                )
            except BaseException:
                await self._quiet(self._backends.leases.release(won))
                raise
            if bound != agent_ref:
                await self._quiet(self._backends.leases.release(won))
                raise ConflictingAgentError(
                    f"session {session_id} is bound to agent {bound!r}, not {agent_ref!r}"
                )
        actor = SessionActor(self, session_id, won, bound)
        self._actors[session_id] = actor
        self._renewer.track(won)
        self._metrics.emit("on_cache_miss", session_id)
        self._enforce_lru()
        return actor

    async def _io(self, awaitable: Awaitable[T]) -> T:
        """Await a backend call; failures other than ours surface as BackendUnavailableError."""
        try:
            return await awaitable
        except (SticklessError, FencedOut):
            raise
        except Exception as exc:
            raise BackendUnavailableError(f"{type(exc).__name__}: {exc}") from exc

    async def _quiet(self, awaitable: Awaitable[T]) -> T | None:
        """Await a best-effort backend call; failures are logged, None returned."""
        try:
            return await awaitable
        except Exception as exc:
            log.warning("best-effort backend call failed: %s", exc)
            return None

    # ================================================================== waiters (F0 / F7)

    def _add_waiter(self, turn_id: str, session_id: str) -> asyncio.Future[TurnResult]:
        future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume_exception)
        self._waiters.setdefault(turn_id, []).append((future, session_id))
        return future

    def _remove_waiter(self, turn_id: str, future: asyncio.Future[TurnResult]) -> None:
        waiters = self._waiters.get(turn_id)
        if waiters is None:
            return
        waiters[:] = [(f, s) for f, s in waiters if f is not future]
        if not waiters:
            del self._waiters[turn_id]
            self._forwards.pop(turn_id, None)

    def _resolve(self, outcome: Outcome) -> None:
        self._forwards.pop(outcome.turn_id, None)
        for future, session_id in self._waiters.pop(outcome.turn_id, ()):
            _settle(future, session_id, outcome)

    def _fail_turn(self, turn_id: str, code: FailureCode, message: str) -> None:
        self._resolve(Outcome(turn_id=turn_id, ok=False, code=code.value, message=message))

    def _fail_all_waiters(self, message: str) -> None:
        waiters, self._waiters = self._waiters, {}
        self._forwards.clear()
        for turn_id, entries in waiters.items():
            for future, _ in entries:
                if not future.done():
                    future.set_exception(RouterClosedError(f"{message} (turn {turn_id})"))

    # ================================================================== ActorHost

    async def open_handle(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return await self._opener.open(session_id, agent_ref, attributes)

    async def deliver_frames(self, session_id: str, frames: Sequence[Event]) -> None:
        """Log a batch of frames (assigning event ids), fan out locally, then publish the whole
        batch on the rail as one signal."""
        batch = list(frames)
        ids: list[str] | None = None
        try:
            ids = await self._backends.events.append(session_id, batch)
        except Exception as exc:
            log.warning("event log append failed for %s: %s", session_id, exc)
        if self._hub.has(session_id):
            local = batch
            if ids is not None:
                local = [
                    f.model_copy(update={"event_id": i}) for f, i in zip(batch, ids, strict=True)
                ]
            self._hub.fan_out(session_id, local)
        signal = Signal(
            kind=SignalKind.EVENT.value,
            session_id=session_id,
            origin=self._node_id,
            payload=frames_to_payload(batch, ids),
        )
        try:
            await self._backends.signals.publish(signal)
        except Exception as exc:
            log.warning("event rail publish failed for %s: %s", session_id, exc)

    async def complete(self, work: TurnWork, outcome: Outcome) -> None:
        """F6: record the outcome (mark_done) first, then answer local callers and the rail.

        When the store refuses the outcome because it already holds another one for this turn
        (a holder-loss reset won the race), the stored answer is the one every caller gets.
        When the store cannot be reached the answer still goes out, and the outcome is recorded
        in the background: until then the reservation stays owned (touched by renewals), so it
        never looks abandoned and a retry never runs the turn a second time.
        """
        if work.takeover.owns:
            recorded = await self._mark_done(work, outcome)
            if recorded is None:
                self._spawn(self._record_later(work, outcome), "mark-done-retry")
            else:
                self._renewer.disown(work.session_id, work.key)
                if recorded is False:
                    outcome = await self._stored_outcome(work, outcome)
        else:
            self._renewer.disown(work.session_id, work.key)
        self._resolve(outcome)
        await self._publish_quiet(
            SignalKind.TURN_RESULT,
            work.session_id,
            TurnResultPayload(key=work.key, outcome=outcome).model_dump(mode="python"),
        )

    async def _mark_done(self, work: TurnWork, outcome: Outcome) -> bool | None:
        """True when recorded, False when the store refused (not ours), None when unknown."""
        try:
            return await self._backends.idempotency.mark_done(
                work.session_id, work.key, self._node_id, outcome, self._primary_ttl(work.key)
            )
        except Exception as exc:
            log.warning("mark_done failed for %s/%s: %s", work.session_id, work.turn_id, exc)
            return None

    async def _stored_outcome(self, work: TurnWork, fallback: Outcome) -> Outcome:
        """The outcome the store holds for this turn, if it holds one; else `fallback`."""
        found = await self._quiet(self._backends.idempotency.find(work.session_id, work.key))
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
        """F4: take over a collected message's reservation (won / rejected / unknown).

        Won or unknown: the message runs and this node records its outcome. Rejected: the store
        says the reservation is not this message's to take. If it already holds an answer for
        this turn, that answer is re-sent; if it names a newer attempt with the same key, or no
        longer exists (its caller was answered: refused, timed out or superseded), the message
        is answered without running, so no request runs after its caller got an answer. Only
        a reservation of this very turn held by another node still runs it (seed §6.3D).
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
                return TurnWork.from_envelope(env, takeover)  # held elsewhere: run (seed)
            answer = found.outcome
        else:
            answer = Outcome(
                turn_id=env.turn_id,
                ok=False,
                executed_by=self._node_id,
                code=FailureCode.FAILED.value,
                message="not run: its reservation was superseded or its caller already answered",
            )
        self._resolve(answer)
        await self._publish_quiet(
            SignalKind.TURN_RESULT,
            env.session_id,
            TurnResultPayload(key=env.key, outcome=answer).model_dump(mode="python"),
        )
        return None

    async def answer_unreadable(self, session_id: str, entry: UnreadableEntry) -> None:
        """Answer the submitter of an undecodable inbox entry at once with UNREADABLE."""
        if entry.turn_id is None:
            return
        outcome = Outcome(
            turn_id=entry.turn_id,
            ok=False,
            executed_by=self._node_id,
            code=FailureCode.UNREADABLE.value,
            message=f"inbox entry {entry.message_id} could not be decoded",
        )
        if entry.idempotency_key is not None:
            await self._quiet(
                self._backends.idempotency.discard_reservation(
                    session_id, entry.idempotency_key, entry.turn_id
                )
            )
        self._resolve(outcome)
        await self._publish_quiet(
            SignalKind.TURN_RESULT,
            session_id,
            TurnResultPayload(key=entry.idempotency_key or "", outcome=outcome).model_dump(
                mode="python"
            ),
        )

    def holds_lease(self, session_id: str, token: int) -> bool:
        return self._renewer.holds(session_id, token)

    def events_dropped(self, session_id: str, count: int) -> None:
        self._metrics.emit("on_events_dropped", session_id, count)

    def actor_state_changed(self, actor: SessionActor) -> None:
        if self._closed or self._actors.get(actor.session_id) is not actor:
            return
        self._publish_status(actor)
        if actor.busy or not actor.accepting or actor.running is not None:
            return
        if actor.close_requested:
            self._spawn(self._give_up_locked(actor, StopReason.LRU), "lru")
        elif not actor.has_handle and actor.queued == 0:
            # A doorbell claim that found nothing to run: hand the session straight back.
            self._spawn(self._give_up_locked(actor, StopReason.IDLE), "idle")

    # ================================================================== hand-over paths

    async def _give_up_locked(self, actor: SessionActor, reason: StopReason) -> None:
        async with self._locks.hold(actor.session_id):
            if self._actors.get(actor.session_id) is not actor:
                return
            if reason in (StopReason.IDLE, StopReason.LRU) and (actor.busy or actor.queued):
                return
            await self._give_up(actor, reason)

    async def _retire(self, actor: SessionActor, reason: StopReason) -> int:
        """Stop an actor and dispose of its unstarted work; returns how many were re-delivered."""
        pending = await actor.stop(reason)
        if self._actors.get(actor.session_id) is actor:
            del self._actors[actor.session_id]
            self._renewer.untrack(actor.session_id)
        self._metrics.emit("on_evict", actor.session_id, reason.name)
        self._publish_gone(actor)
        if reason.ends_queue:
            for work in pending:
                await self.complete(
                    work,
                    Outcome(
                        turn_id=work.turn_id,
                        ok=False,
                        executed_by=self._node_id,
                        code=FailureCode.EVICTED.value,
                        message=f"session ended ({reason.value}) before the message ran",
                    ),
                )
            return 0
        return await self._requeue(pending, actor.token)

    async def _requeue(self, works: list[TurnWork], token: int) -> int:
        """Put collected-but-unstarted work back in the inbox in order (else NOT_HOLDER)."""
        requeued = 0
        for work in works:
            try:
                if work.takeover.owns:
                    await self._backends.idempotency.release_holder(
                        work.session_id, work.key, self._node_id, self._config.forward_ttl
                    )
                self._renewer.disown(work.session_id, work.key)
                await self._backends.inbox.deliver(work.to_envelope())
            except Exception as exc:
                log.warning("re-delivery of %s failed: %s", work.turn_id, exc)
                await self.complete(
                    work,
                    Outcome(
                        turn_id=work.turn_id,
                        ok=False,
                        executed_by=self._node_id,
                        code=FailureCode.NOT_HOLDER.value,
                        message="this node gave the session up and could not re-queue the message",
                    ),
                )
                continue
            requeued += 1
            if work.turn_id in self._waiters:
                self._forwards[work.turn_id] = _Forward(
                    work.session_id, work.key, work.turn_id, self._deadline(), token
                )
        return requeued

    async def _give_up(self, actor: SessionActor, reason: StopReason) -> None:
        """Hand a session back (idle, LRU, shutdown, lost lease, hand-off) without ending it."""
        lease = actor.lease
        requeued = await self._retire(actor, reason)
        if lease is not None and reason is not StopReason.LEASE_LOST:
            await self._quiet(self._backends.leases.release(lease))
        if reason is StopReason.HANDOFF:
            return  # the requester takes the lease next
        if requeued or await self._quiet(self._backends.inbox.is_empty(actor.session_id)) is False:
            await self._ring_doorbell(actor.session_id, None)

    async def _end_session(self, session_id: str, lease: Lease, *, delete: bool) -> None:
        """Release/delete on the holder: stop, purge (EVICTED), release, broadcast EVICT."""
        actor = self._actors.get(session_id)
        if actor is not None:
            await self._retire(actor, StopReason.DELETE if delete else StopReason.RELEASE)
        if delete:
            await self._io(self._backends.records.delete(session_id))
            await self._quiet(self._backends.events.delete(session_id))
        purged = await self._quiet(self._backends.inbox.purge(session_id))
        if purged is not None:
            for message in purged.messages:
                await self._answer_evicted(message)
            for entry in purged.unreadable:
                await self.answer_unreadable(session_id, entry)
        await self._quiet(self._backends.leases.release(lease))
        await self._publish_quiet(
            SignalKind.EVICT, session_id, EvictPayload(token=lease.token).model_dump()
        )
        self._apply_evict(session_id, lease.token)

    async def _answer_evicted(self, message: InboundMessage) -> None:
        env = message.envelope
        work = TurnWork.from_envelope(env, Takeover.WON)
        await self.complete(
            work,
            Outcome(
                turn_id=env.turn_id,
                ok=False,
                executed_by=self._node_id,
                code=FailureCode.EVICTED.value,
                message="session released before the message ran",
            ),
        )

    def _apply_evict(self, session_id: str, token: int) -> None:
        """Node-local consequences of an EVICT: fail forwards, finish subscribers, drop status."""
        for forward in list(self._forwards.values()):
            if forward.session_id == session_id and forward.token <= token:
                self._spawn(self._settle_evicted_forward(forward), "evicted-forward")
        self._hub.finish_session(session_id)
        self._projection.pop(session_id, None)
        self._projection_received.pop(session_id, None)
        for waiter in self._evict_waiters.pop(session_id, []):
            waiter.set()

    async def _settle_evicted_forward(self, forward: _Forward) -> None:
        """Answer a forward of an evicted session EVICTED only once its message can no longer
        run: a message delivered after the purge must not run under the next lease while its
        caller was told it was evicted. Otherwise follow what the store says."""
        evicted = Outcome(
            turn_id=forward.turn_id,
            ok=False,
            executed_by=self._node_id,
            code=FailureCode.EVICTED.value,
            message=f"session {forward.session_id} was evicted",
        )
        idem = self._backends.idempotency
        try:
            if await idem.compare_and_reset(forward.session_id, forward.key, None, evicted):
                self._resolve(evicted)
                return
            found = await idem.find(forward.session_id, forward.key)
        except Exception as exc:
            log.warning("settling evicted forward %s failed: %s", forward.turn_id, exc)
            return  # the poll keeps following it, bounded by the forward deadline
        if found is not None and found.turn_id == forward.turn_id and found.outcome is not None:
            self._resolve(found.outcome)

    # ================================================================== public controls

    def events(
        self, session_id: str, turn_id: str | None = None, after: str | None = None
    ) -> EventStream:
        """Stream the session's frames from now (or replay from the event log after `after`).

        Registration is immediate; `await stream.ready()` waits until frames from other nodes
        are also received. With `turn_id` the stream ends after that turn's terminal frame.
        """
        self._check_open()
        sub = Subscriber(session_id, turn_id, self._config.subscriber_queue_size)
        self._hub.add(sub)
        ready = self._event_channels.get(session_id)
        if ready is None:
            ready = asyncio.get_running_loop().create_future()
            self._event_channels[session_id] = ready
            self._spawn(self._open_event_channel(session_id, ready), "event-channel")
        return EventStream(sub, self._backends.events, after, ready, self._close_subscriber)

    async def _open_event_channel(self, session_id: str, ready: asyncio.Future[None]) -> None:
        try:
            await self._backends.signals.subscribe_events(session_id, self._on_event_signal)
        except Exception as exc:
            log.warning("event channel of %s unavailable: %s", session_id, exc)
            self._event_channels.pop(session_id, None)
        if not ready.done():
            ready.set_result(None)

    async def _close_subscriber(self, sub: Subscriber) -> None:
        if sub.dropped:
            self._metrics.emit("on_events_dropped", sub.session_id, sub.dropped)
        if self._hub.remove(sub) and self._event_channels.pop(sub.session_id, None) is not None:
            await self._quiet(self._backends.signals.unsubscribe_events(sub.session_id))

    async def interrupt(
        self, session_id: str, reason: str = "USER", turn_id: str | None = None
    ) -> None:
        """Interrupt the session's active turn wherever it runs (only `turn_id`, when given)."""
        self._check_open()
        actor = self._actors.get(session_id)
        if actor is not None:
            actor.interrupt(reason, turn_id)
        await self._io(
            self._publish(
                SignalKind.INTERRUPT,
                session_id,
                InterruptPayload(reason=reason, turn_id=turn_id).model_dump(),
            )
        )

    async def release_session(self, session_id: str) -> None:
        """Drop the live handle, lease and queued messages (EVICTED); the history is kept."""
        self._check_open()
        async with self._locks.hold(session_id):
            lease = await self._holder_lease(session_id)
            if lease is not None:
                await self._end_session(session_id, lease, delete=False)
                return
        evicted = asyncio.Event()
        self._evict_waiters.setdefault(session_id, []).append(evicted)
        await self._io(
            self._publish(
                SignalKind.YIELD,
                session_id,
                YieldPayload(purpose="release", requester=self._node_id).model_dump(),
            )
        )
        bound = self._config.release_interrupt_timeout + self._config.interrupt_grace
        try:
            await asyncio.wait_for(evicted.wait(), bound)
        except TimeoutError:
            log.warning("release of %s: no EVICT from the holder within %.1fs", session_id, bound)
        finally:
            waiters = self._evict_waiters.get(session_id)
            if waiters is not None and evicted in waiters:
                waiters.remove(evicted)
                if not waiters:
                    del self._evict_waiters[session_id]

    async def _holder_lease(self, session_id: str) -> Lease | None:
        """This node's lease on the session (taken if free); None when held elsewhere."""
        actor = self._actors.get(session_id)
        if actor is not None and actor.lease is not None:
            return actor.lease
        if actor is not None:
            await self._retire(actor, StopReason.LEASE_LOST)
        won = await self._io(
            self._backends.leases.acquire(session_id, self._node_id, self._config.lease_ttl)
        )
        return won if isinstance(won, Lease) else None

    async def delete_session(self, session_id: str) -> None:
        """Delete the session's history; only the holder may, so take the lease (YIELD hand-off).

        Raises:
            SessionBusyError: the holder did not hand the session over within
                `release_interrupt_timeout`.
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.release_interrupt_timeout
        delay = 0.01
        asked = False
        while True:
            async with self._locks.hold(session_id):
                lease = await self._holder_lease(session_id)
                if lease is not None:
                    await self._end_session(session_id, lease, delete=True)
                    return
            if not asked:
                await self._io(
                    self._publish(
                        SignalKind.YIELD,
                        session_id,
                        YieldPayload(purpose="handoff", requester=self._node_id).model_dump(),
                    )
                )
                asked = True
            if loop.time() >= deadline:
                raise SessionBusyError(
                    f"session {session_id} is held by another node that did not hand it over"
                )
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 2, 0.25)

    async def status(self, session_id: str) -> ClusterSessionStatus:
        """Best-effort status of the session across the cluster; never use it as a control gate."""
        self._check_open()
        actor = self._actors.get(session_id)
        if actor is not None:
            return self._local_status(actor)
        seen = self._projection.get(session_id)
        fresh_for = 3 * self._config.status_heartbeat_interval
        received = self._projection_received.get(session_id, 0.0)
        if seen is not None and asyncio.get_running_loop().time() - received <= fresh_for:
            return seen.model_copy(update={"observed_by": self._node_id})
        lease = await self._io(self._backends.leases.current(session_id))
        return ClusterSessionStatus(
            session_id=session_id,
            holder=lease.holder if lease else None,
            token=lease.token if lease else None,
            state=SessionState.HELD if lease else SessionState.UNHELD,
            observed_by=self._node_id,
        )

    def _local_status(self, actor: SessionActor) -> ClusterSessionStatus:
        running = actor.running
        return ClusterSessionStatus(
            session_id=actor.session_id,
            holder=self._node_id,
            token=actor.token,
            state=SessionState.RUNNING if running is not None else SessionState.IDLE,
            active_turn_id=running.work.turn_id if running is not None else None,
            queued=actor.queued,
            seq=self._status_seq,
            origin=self._node_id,
            updated_at=time.time(),
            observed_by=self._node_id,
        )

    # ================================================================== signals

    async def _publish(self, kind: SignalKind, session_id: str, payload: dict[str, Any]) -> None:
        await self._backends.signals.publish(
            Signal(kind=kind.value, session_id=session_id, origin=self._node_id, payload=payload)
        )

    async def _publish_signals(self, signals: list[Signal]) -> None:
        """Best-effort publish of prepared signals (its coroutine starts only when run)."""
        await self._quiet(self._backends.signals.publish_many(signals))

    async def _publish_quiet(
        self, kind: SignalKind, session_id: str, payload: dict[str, Any]
    ) -> None:
        await self._quiet(self._publish(kind, session_id, payload))

    async def _ring_doorbell(self, session_id: str, held_by: str | None) -> None:
        await self._publish_quiet(
            SignalKind.MESSAGE_ENQUEUED, session_id, {"held_by": held_by} if held_by else {}
        )

    async def _on_signal(self, signal: Signal) -> None:
        if self._closed:
            return
        kind = signal.known_kind()
        if kind is None:
            log.warning("dropping signal of unknown kind %r from %s", signal.kind, signal.origin)
            return
        own = signal.origin == self._node_id
        try:
            if kind is SignalKind.MESSAGE_ENQUEUED:
                held_by = signal.payload.get("held_by")
                self._spawn(
                    self._on_doorbell(
                        signal.session_id, held_by if isinstance(held_by, str) else None
                    ),
                    "doorbell",
                )
            elif own:
                return
            elif kind is SignalKind.TURN_RESULT:
                self._resolve(TurnResultPayload.model_validate(signal.payload).outcome)
            elif kind is SignalKind.INTERRUPT:
                payload = InterruptPayload.model_validate(signal.payload)
                actor = self._actors.get(signal.session_id)
                if actor is not None:
                    actor.interrupt(payload.reason, payload.turn_id)
            elif kind is SignalKind.EVICT:
                token = EvictPayload.model_validate(signal.payload).token
                self._spawn(self._on_evict(signal.session_id, token), "evict")
            elif kind is SignalKind.YIELD:
                request = YieldPayload.model_validate(signal.payload)
                self._spawn(self._on_yield(signal.session_id, request), "yield")
            elif kind is SignalKind.STATUS:
                self._fold_status(signal)
        except (ValidationError, WireError) as exc:
            log.warning("dropping malformed %s signal from %s: %s", kind, signal.origin, exc)

    async def _on_event_signal(self, signal: Signal) -> None:
        if signal.origin == self._node_id or signal.known_kind() is not SignalKind.EVENT:
            return
        frames, unreadable = frames_from_payload(signal.payload)
        if unreadable:
            log.warning("dropped %d unreadable event frame(s) from %s", unreadable, signal.origin)
        self._hub.fan_out(signal.session_id, frames)

    async def _on_doorbell(self, session_id: str, held_by: str | None) -> None:
        """F3: the holder drains; when nobody holds the session, whoever claims it drains."""
        actor = self._actors.get(session_id)
        if actor is not None:
            if actor.accepting:
                actor.ring()
            return
        if held_by is not None and held_by != self._node_id:
            return
        await self._claim_and_drain(session_id)

    async def _claim_and_drain(self, session_id: str) -> bool:
        async with self._locks.hold(session_id):
            if self._closed:
                return False
            actor = self._actors.get(session_id)
            if actor is None:
                try:
                    claimed = await self._claim(session_id, None)
                except SticklessError as exc:
                    log.info("doorbell claim of %s failed: %s", session_id, exc)
                    return False
                if not isinstance(claimed, SessionActor):
                    return False
                actor = claimed
            if actor.accepting:
                actor.ring()
            return True

    async def _on_evict(self, session_id: str, token: int) -> None:
        async with self._locks.hold(session_id):
            actor = self._actors.get(session_id)
            if actor is not None and actor.token <= token:
                await self._retire(actor, StopReason.EVICTED)
        self._apply_evict(session_id, token)

    async def _on_yield(self, session_id: str, request: YieldPayload) -> None:
        async with self._locks.hold(session_id):
            actor = self._actors.get(session_id)
            if actor is None or actor.lease is None:
                return
            if request.purpose == "release":
                await self._end_session(session_id, actor.lease, delete=False)
            else:
                await self._give_up(actor, StopReason.HANDOFF)

    # ================================================================== status (§5.4)

    def _status_signal(self, actor: SessionActor) -> Signal | None:
        """A STATUS snapshot of the actor, or None when nothing observable changed."""
        running = actor.running
        state = SessionState.RUNNING if running is not None else SessionState.IDLE
        turn_id = running.work.turn_id if running is not None else None
        if self._last_status.get(actor.session_id) == (state, turn_id):
            return None
        self._last_status[actor.session_id] = (state, turn_id)
        self._status_seq += 1
        payload = StatusPayload(
            holder=self._node_id,
            token=actor.token,
            state=state.value,
            active_turn_id=turn_id,
            queued=actor.queued,
            seq=self._status_seq,
            updated_at=time.time(),
        )
        return Signal(
            kind=SignalKind.STATUS.value,
            session_id=actor.session_id,
            origin=self._node_id,
            payload=payload.model_dump(),
        )

    def _publish_status(self, actor: SessionActor) -> None:
        """Broadcast the actor's state once it settles: changes within a short window coalesce
        into one batched publish, and a state that bounced back publishes nothing."""
        self._status_dirty.add(actor.session_id)
        if self._status_flush is None and self._loop is not None:
            self._status_flush = self._loop.call_later(_STATUS_COALESCE, self._flush_status)

    def _flush_status(self) -> None:
        self._status_flush = None
        dirty, self._status_dirty = self._status_dirty, set()
        signals = [
            signal
            for session_id in dirty
            if (actor := self._actors.get(session_id)) is not None
            and (signal := self._status_signal(actor)) is not None
        ]
        if signals and not self._closed:
            self._spawn(self._publish_signals(signals), "status")

    def _publish_gone(self, actor: SessionActor) -> None:
        self._last_status.pop(actor.session_id, None)
        self._status_seq += 1
        payload = StatusPayload(
            holder=self._node_id,
            token=actor.token,
            state=SessionState.GONE.value,
            seq=self._status_seq,
            updated_at=time.time(),
        )
        self._spawn(self._publish_quiet(SignalKind.STATUS, actor.session_id, payload.model_dump()))

    def _fold_status(self, signal: Signal) -> None:
        """Keep the newest snapshot: another origin always wins (a new holder's seq is its own)."""
        payload = StatusPayload.model_validate(signal.payload)
        current = self._projection.get(signal.session_id)
        if current is not None and current.origin == signal.origin and payload.seq <= current.seq:
            return
        state = SessionState(payload.state)
        if state is SessionState.GONE:
            if current is None or current.origin == signal.origin:
                self._projection.pop(signal.session_id, None)
                self._projection_received.pop(signal.session_id, None)
            return
        self._projection_received[signal.session_id] = asyncio.get_running_loop().time()
        self._projection[signal.session_id] = ClusterSessionStatus(
            session_id=signal.session_id,
            holder=payload.holder,
            token=payload.token,
            state=state,
            active_turn_id=payload.active_turn_id,
            queued=payload.queued,
            seq=payload.seq,
            origin=signal.origin,
            updated_at=payload.updated_at,
        )

    # ================================================================== background loops

    async def _heartbeat_loop(self) -> None:
        """Tell the renewer's watchdog that this loop is alive."""
        interval = min(self._config.lease_extend_interval / 2, 1.0)
        while True:
            self._renewer.beat()
            if not await self._pause(interval):
                return

    def _lost_on_renewer_thread(self, session_id: str, token: int) -> None:
        """Renewer thread: a lease was lost; hand the reaction to the main loop, never block."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._on_lease_lost, session_id, token)

    def _on_lease_lost(self, session_id: str, token: int) -> None:
        actor = self._actors.get(session_id)
        if actor is not None and actor.token == token and not self._closed:
            self._metrics.emit("on_lease_extend_failed", session_id)
            actor.lose_lease()

    def lease_lost(self, actor: SessionActor) -> None:
        """ActorHost: the actor lost its lease; hand the session back (queued work re-queued)."""
        if not self._closed:
            self._spawn(self._give_up_lost(actor), "lease-lost")

    async def _give_up_lost(self, actor: SessionActor) -> None:
        async with self._locks.hold(actor.session_id):
            if self._actors.get(actor.session_id) is actor:
                await self._give_up(actor, StopReason.LEASE_LOST)

    async def _forward_poll_loop(self) -> None:
        while await self._pause(self._config.forward_poll_interval):
            for forward in list(self._forwards.values()):
                await self._poll_forward(forward)

    async def _poll_forward(self, forward: _Forward) -> None:
        """F7 fallback: deadline first, then the store's answer, then re-ring an orphaned inbox."""
        if self._forwards.get(forward.turn_id) is not forward:
            return
        if asyncio.get_running_loop().time() >= forward.deadline:
            self._fail_turn(
                forward.turn_id,
                FailureCode.FORWARD_TIMEOUT,
                f"no answer within forward_ttl ({self._config.forward_ttl}s)",
            )
            return
        try:
            found = await self._backends.idempotency.find(forward.session_id, forward.key)
        except Exception as exc:
            log.warning("forward poll of %s failed: %s", forward.turn_id, exc)
        else:
            if found is not None and found.turn_id == forward.turn_id and found.outcome is not None:
                self._resolve(found.outcome)
                return
            if found is not None and found.turn_id != forward.turn_id:
                self._fail_turn(
                    forward.turn_id, FailureCode.FAILED, "the turn's reservation was superseded"
                )
                return
            if found is None:
                # Within forward_ttl a reservation only vanishes when its submit was refused
                # (discarded) or its entry was unreadable: nothing will run; say so now.
                self._fail_turn(
                    forward.turn_id,
                    FailureCode.FAILED,
                    "the request was refused before it was queued; retry it",
                )
                return
        empty = await self._quiet(self._backends.inbox.is_empty(forward.session_id))
        if empty is True:
            return
        self._metrics.emit("on_forward_doorbell_rerung", forward.session_id)
        if forward.session_id not in self._actors:
            await self._claim_and_drain(forward.session_id)
        await self._ring_doorbell(forward.session_id, None)

    async def _cache_sweep_loop(self) -> None:
        interval = max(0.05, min(self._config.idle_ttl / 2, 30.0))
        while await self._pause(interval):
            now = asyncio.get_running_loop().time()
            for actor in list(self._actors.values()):
                if (
                    not actor.busy
                    and actor.accepting
                    and actor.queued == 0
                    and now - actor.last_active >= self._config.idle_ttl
                ):
                    self._spawn(self._give_up_locked(actor, StopReason.IDLE), "idle")

    def _enforce_lru(self) -> None:
        """Keep at most `max_cached_sessions` actors: close the least recently used idle ones;
        a busy (pinned) one is closed when its turn ends."""
        excess = len(self._actors) - self._config.max_cached_sessions
        if excess <= 0:
            return
        for actor in sorted(self._actors.values(), key=lambda a: a.last_active):
            if excess <= 0:
                break
            if actor.close_requested or not actor.accepting:
                continue
            actor.close_requested = True
            excess -= 1
            if not actor.busy:
                self._spawn(self._give_up_locked(actor, StopReason.LRU), "lru")

    async def _holder_loss_sweep_loop(self) -> None:
        while await self._pause(self._config.holder_loss_sweep_interval):
            await self._sweep_holder_loss()
            await self._scan_orphans()

    async def _sweep_holder_loss(self) -> None:
        """§6.3D: reset stale IN_FLIGHT reservations; each reset's one winner announces it."""
        try:
            stale = await self._backends.idempotency.find_stale_in_flight(limit=256)
        except Exception as exc:
            log.warning("holder-loss sweep failed: %s", exc)
            return
        owned = self._renewer.owned()
        for reservation in stale:
            if reservation.holder == self._node_id and (
                (reservation.session_id, reservation.key) in owned
            ):
                continue  # ours and alive: only our touches lag; never announce a live turn
            try:
                await self._reset_stale(reservation)
            except SticklessError as exc:
                log.warning("holder-loss reset of %s failed: %s", reservation.turn_id, exc)

    async def _scan_orphans(self) -> None:
        """Claim sessions whose inbox waited past a lease TTL with nobody collecting (§14)."""
        try:
            sessions = await self._backends.inbox.pending_sessions(self._config.lease_ttl)
        except Exception as exc:
            log.warning("orphan scan failed: %s", exc)
            return
        for session_id in sessions:
            if session_id not in self._actors:
                await self._claim_and_drain(session_id)

    async def _status_heartbeat_loop(self) -> None:
        """Re-announce every held session's state (one batched publish per heartbeat)."""
        while await self._pause(self._config.status_heartbeat_interval):
            self._last_status.clear()
            # Only running sessions: idle ones do not change, and status() of a session nobody
            # re-announced falls back to reading its lease.
            signals = [
                signal
                for actor in list(self._actors.values())
                if actor.running is not None and (signal := self._status_signal(actor)) is not None
            ]
            if signals:
                await self._quiet(self._backends.signals.publish_many(signals))

    # ================================================================== holder loss (§6.3D)

    async def peer_lost(self, node_id: str) -> list[str]:
        """Another node is known dead (e.g. its Ray actor died): expire its leases and make its
        reservations stale now, then sweep and drain its sessions instead of waiting for TTLs.

        Fencing keeps this safe: the dead node's late writes carry older tokens. Returns the
        sessions whose leases were revoked.

        Raises:
            BackendUnavailableError: the backends could not be reached.
        """
        self._check_open()
        if node_id == self._node_id:
            return []
        sessions = await self._io(self._backends.leases.revoke_holder(node_id))
        await self._io(self._backends.idempotency.expire_holder(node_id))
        await self._sweep_holder_loss()
        for session_id in sessions:
            if await self._quiet(self._backends.inbox.is_empty(session_id)) is False:
                await self._claim_and_drain(session_id)
        return sessions

    async def _reset_stale(self, stale: Reservation) -> None:
        """Reset a stale IN_FLIGHT reservation; the one node that wins announces the lost turn."""
        outcome = Outcome(
            turn_id=stale.turn_id,
            ok=False,
            code=FailureCode.HOLDER_LOST.value,
            message=f"holder {stale.holder or '(none)'} stopped answering",
        )
        won = await self._io(
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
        )
        await self.deliver_frames(stale.session_id, [frame])
        self._resolve(outcome)
        await self._publish_quiet(
            SignalKind.TURN_RESULT,
            stale.session_id,
            TurnResultPayload(key=stale.key, outcome=outcome).model_dump(mode="python"),
        )


def _settle(future: asyncio.Future[TurnResult], session_id: str, outcome: Outcome) -> None:
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
