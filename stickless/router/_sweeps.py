"""The router's periodic work: watchdog heartbeat, command-path probe, forward poll, cache sweep,
holder-loss sweep, orphan scan and status heartbeat; the choice of sessions to close is a pure
function."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from .._errors import FailureCode, SticklessError
from .._events import traced
from ..actors import SessionActor, StopReason
from ..wire import Outcome
from ._background import io, log, quiet
from ._callers import Forward, judge_forward
from ._context import NodeContext
from ._control import ControlChannel
from ._handover import Handover
from ._outcomes import TurnOutcomes
from ._session_part import SessionPart
from ._sessions import LocalSessions
from ._status import backlog_totals

#: Dead holders one sweep cleans up after (the rest wait for the next sweep).
_DEAD_HOLDERS_PER_SWEEP = 16
#: Attempts at withdrawing a message while the store is out of reach, and the first pause.
_WITHDRAW_ATTEMPTS = 5
_WITHDRAW_RETRY_FIRST = 0.1


def idle_victims(actors: Iterable[SessionActor], now: float, idle_ttl: float) -> list[SessionActor]:
    """Actors with nothing to do for at least `idle_ttl`."""
    return [
        actor
        for actor in actors
        if not actor.busy
        and actor.accepting
        and actor.queued == 0
        and now - actor.last_active >= idle_ttl
    ]


def lru_victims(actors: Iterable[SessionActor], keep: int) -> list[SessionActor]:
    """The least recently used actors past `keep` that are not already closing."""
    ordered = list(actors)
    excess = len(ordered) - keep
    victims: list[SessionActor] = []
    for actor in sorted(ordered, key=lambda a: a.last_active):
        if len(victims) >= excess:
            break
        if actor.close_requested or not actor.accepting:
            continue
        victims.append(actor)
    return victims


class Sweeps(SessionPart):
    """Runs the periodic loops until the router stops."""

    def __init__(
        self,
        ctx: NodeContext,
        sessions: LocalSessions,
        outcomes: TurnOutcomes,
        control: ControlChannel,
        handover: Handover,
    ) -> None:
        super().__init__(ctx, sessions, outcomes, control)
        self._handover = handover
        #: The last path probe failed (its failures are logged once until one answers).
        self._probe_failing = False

    def start(self) -> None:
        config, loop = self._config, self._bg.start_loop
        loop("heartbeat", config.heartbeat_interval, self._heartbeat, at_once=True)
        loop("path_probe", config.lease_extend_interval, self._path_probe, at_once=True)
        loop("forward_poll", config.forward_poll_interval, self.poll_forwards)
        loop("cache_sweep", max(0.05, min(config.idle_ttl / 2, 30.0)), self._cache_sweep)
        loop("status_heartbeat", config.status_heartbeat_interval, self.status_heartbeat)
        loop("holder_loss_sweep", config.holder_loss_sweep_interval, self._holder_loss_round)

    def enforce_lru(self) -> None:
        """Keep at most `max_cached_sessions` actors: close the least recently used idle ones;
        a busy (pinned) one is closed when its turn ends."""
        if len(self._sessions) <= self._config.max_cached_sessions:
            return  # (every claim asks: under the bound it costs nothing, however many held)
        for actor in lru_victims(self._sessions.actors(), self._config.max_cached_sessions):
            actor.close_requested = True
            if not actor.busy:
                self._handover.give_up_later(actor, StopReason.LRU)

    async def _heartbeat(self) -> None:
        """Tell the renewer's watchdog that the node's event loop is alive."""
        self._renewer.beat()

    async def _path_probe(self) -> None:
        """Show the renewer, every renewal interval, that this node's own connections reach the
        store (one round trip, bounded): unanswered past `command_path_timeout`, the node
        stops vouching for its sessions (see "Node liveness")."""
        # A probe is cut short only at twice the bound: one that answers late still proves the
        # path and keeps its connection (a new one costs several more round trips).
        self._renewer.probing()
        try:
            await asyncio.wait_for(
                self._backends.liveness.probe(), 2 * self._config.command_path_timeout
            )
        except Exception as exc:  # (the renewer judges how long it went unanswered)
            if not self._probe_failing:
                log.warning("store probe failed on %s: %r", self._node_id, exc)
            self._probe_failing = True
        else:
            self._probe_failing = False
            self._renewer.answered()

    async def poll_forwards(self) -> None:
        """Look up every pending forward's answer in the store (and re-ring orphaned inboxes)."""
        for forward in self._callers.forwards():
            await self._poll_forward(forward)

    async def _poll_forward(self, forward: Forward) -> None:
        """Deadline first, then the store's answer, then re-ring an orphaned inbox."""
        if not self._callers.tracked(forward) or self._callers.expire_if_due(forward):
            return
        try:
            found = await self._backends.idempotency.find(forward.session_id, forward.key)
        except Exception as exc:
            log.warning("forward poll of %s failed: %s", forward.turn_id, exc)
        else:
            answer = judge_forward(forward, found)
            if answer is not None:
                self._callers.resolve(answer)
                return
        empty = await quiet(self._backends.inbox.is_empty(forward.session_id))
        if empty is True:
            return
        self._metrics.emit("on_forward_doorbell_rerung", forward.session_id)
        await self._sessions.claim_unheld(forward.session_id)
        await self._control.ring_doorbell(forward.session_id, None)

    async def withdraw(
        self, forward: Forward, code: FailureCode = FailureCode.FORWARD_TIMEOUT
    ) -> Outcome | None:
        """Make sure a forward's message never runs if it is still queued (no node took it
        over): its reservation then records why, and a retry with the same key runs fresh.
        Returns that answer, or None when the message was taken over (or the store failed)."""
        if code is FailureCode.FORWARD_TIMEOUT:
            why = f"still queued when forward_ttl ({self._config.forward_ttl}s) passed"
        else:
            why = f"still queued when node {self._node_id} shut down"
        withdrawn = Outcome.failure(forward.turn_id, code, f"not run: {why}", self._node_id)
        idem = self._backends.idempotency
        delay = _WITHDRAW_RETRY_FIRST
        for _ in range(_WITHDRAW_ATTEMPTS):  # a store blip must not leave the message queued
            won = await quiet(
                idem.compare_and_reset(
                    forward.session_id, forward.key, None, withdrawn, unstarted_only=True
                )
            )
            if won:  # it never runs: its stream ends here
                frame = traced(withdrawn.unrun_frame(forward.session_id), forward.trace)
                await self._control.deliver_frames(forward.session_id, [frame])
                return withdrawn
            if won is not None:
                return None
            await asyncio.sleep(delay)
            delay *= 2
        return None

    async def settle_before_close(self, deadline: float) -> None:
        """Closing: wait (until `deadline`) for the answers of turns this node handed on, then
        withdraw what is still queued, so no caller is told "closed" about a turn that runs."""
        loop = asyncio.get_running_loop()
        pending = self._callers.futures()
        if pending and deadline > loop.time():
            await asyncio.wait(pending, timeout=deadline - loop.time())
        for forward in self._callers.forwards():
            withdrawn = await self.withdraw(forward, FailureCode.SHUTDOWN)
            if withdrawn is not None:
                self._callers.resolve(withdrawn)

    async def _cache_sweep(self) -> None:
        now = asyncio.get_running_loop().time()
        for actor in idle_victims(self._sessions.actors(), now, self._config.idle_ttl):
            self._handover.give_up_later(actor, StopReason.IDLE)

    async def _holder_loss_round(self) -> None:
        await self.sweep_holder_loss()
        await self._scan_orphans()

    async def sweep_holder_loss(self) -> None:
        """Clean up after every holder whose incarnation ended (its reservations made due),
        reset stale IN_FLIGHT reservations in one scan (each reset's one winner announces it:
        turns answered or given back to run again), then drop the dead holders' leases and take
        their sessions with queued work. Every node sweeps."""
        try:
            dead = await self._backends.liveness.dead_holders(limit=_DEAD_HOLDERS_PER_SWEEP)
        except Exception as exc:
            log.warning("dead-holder sweep failed: %s", exc)
            dead = []
        due: list[str] = []
        for holder in dead:
            try:
                await self._backends.idempotency.expire_holder(holder)
            except Exception as exc:
                log.warning("cleaning up after %s failed: %s", holder, exc)
            else:
                due.append(holder)
        await self._reset_stale()
        for holder in due:
            try:
                await self._release_dead(holder)
                await self._backends.liveness.forget(holder)
            except Exception as exc:
                log.warning("cleaning up after %s failed: %s", holder, exc)

    async def bury_holder(self, holder: str) -> list[str]:
        """A dead incarnation of `holder` (known at once, e.g. under Ray): make its reservations
        due, answer them (or give them back to run again), drop its leases and drain their
        sessions' queued work; the sessions whose leases were dropped.

        Raises:
            BackendUnavailableError: the backends could not be reached.
        """
        await io(self._backends.idempotency.expire_holder(holder))
        await self._reset_stale()
        return await self._release_dead(holder)

    async def _release_dead(self, holder: str) -> list[str]:
        """Drop the leases a dead incarnation of `holder` left and take their sessions that
        have queued work; those sessions.

        Raises:
            BackendUnavailableError: the backends could not be reached.
        """
        sessions = await io(self._backends.leases.revoke_holder(holder))
        for session_id in sessions:
            if await quiet(self._backends.inbox.is_empty(session_id)) is False:
                await self._sessions.claim_and_drain(session_id)
        return sessions

    async def _reset_stale(self) -> None:
        """Reset stale IN_FLIGHT reservations; each reset's one winner announces it."""
        try:
            stale = await self._backends.idempotency.find_stale_in_flight(limit=256)
        except Exception as exc:
            log.warning("holder-loss sweep failed: %s", exc)
            return
        for reservation in stale:
            try:
                await self._outcomes.reset_stale(reservation)
            except SticklessError as exc:
                log.warning("holder-loss reset of %s failed: %s", reservation.turn_id, exc)

    async def _scan_orphans(self) -> None:
        """Claim sessions whose inbox waited past a lease TTL with nobody collecting."""
        try:
            sessions = await self._backends.inbox.pending_sessions(self._config.lease_ttl)
        except Exception as exc:
            log.warning("orphan scan failed: %s", exc)
            return
        for session_id in sessions:
            await self._sessions.claim_unheld(session_id)

    async def status_heartbeat(self) -> None:
        """Read the backlog of every held session (one batched store call), feed the node
        gauge, and re-announce the running sessions and those with a backlog (one publish)."""
        held = self._sessions.ids()
        read = await quiet(self._backends.inbox.pending_stats(held)) if held else {}
        if read is not None:
            read = {s: stats for s, stats in read.items() if s in self._sessions}
            self._board.backlog_read(read)
            self._metrics.emit("on_pending_gauge", self._node_id, *backlog_totals(read.values()))
        signals = self._board.heartbeat(self._sessions.actors(), time.time())
        if signals:
            await quiet(self._backends.signals.publish_many(signals))
