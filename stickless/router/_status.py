"""The status projection: this node's STATUS signals and the folded view of other nodes', no I/O.

The board decides what to publish and when; the router does the publishing (the clock is passed
in, so every decision here is a plain function of its inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ..actors import SessionActor
from ..backends.base import PendingStats
from ..wire import Signal, SignalKind, StatusPayload
from ._api import ClusterSessionStatus, SessionState

#: Seconds during which a session's state changes coalesce into one STATUS publish.
STATUS_COALESCE = 0.05


class StatusBoard:
    """Seq-stamped snapshots of the sessions held here, and the newest snapshot seen of others."""

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._seq = 0
        self._last: dict[str, tuple[SessionState, str | None]] = {}
        self._dirty: set[str] = set()
        self._flush_pending = False
        self._projection: dict[str, ClusterSessionStatus] = {}
        self._received: dict[str, float] = {}
        #: The inbox backlog of each session held here, as of the last status heartbeat.
        self._backlog: dict[str, PendingStats] = {}
        #: The pending count each held session's last signal carried.
        self._told_pending: dict[str, int] = {}

    # ------------------------------------------------------------ this node's sessions

    def changed(self, session_id: str) -> bool:
        """Note a state change; True when the caller must schedule a flush in STATUS_COALESCE."""
        self._dirty.add(session_id)
        if self._flush_pending:
            return False
        self._flush_pending = True
        return True

    def flush(self, lookup: Callable[[str], SessionActor | None], now: float) -> list[Signal]:
        """The signals of the sessions that changed since the last flush and did not bounce back."""
        self._flush_pending = False
        dirty, self._dirty = self._dirty, set()
        return [
            signal
            for session_id in dirty
            if (actor := lookup(session_id)) is not None
            and (signal := self.snapshot(actor, now)) is not None
        ]

    def backlog_read(self, read: Mapping[str, PendingStats]) -> None:
        """Keep the backlog the heartbeat just read of the sessions held here (all of them)."""
        self._backlog = dict(read)
        self._told_pending = {s: n for s, n in self._told_pending.items() if s in read}

    def backlog(self, session_id: str) -> PendingStats:
        """The last backlog read of a session held here (none when never read)."""
        return self._backlog.get(session_id, PendingStats())

    def heartbeat(self, actors: Iterable[SessionActor], now: float) -> list[Signal]:
        """Re-announce the running sessions and those with a pending backlog, now or at their
        last signal (other idle ones do not change, and status() of a session nobody
        re-announced falls back to reading its lease)."""
        self._last.clear()
        return [
            signal
            for actor in actors
            if (
                actor.running is not None
                or self.backlog(actor.session_id).pending
                or self._told_pending.get(actor.session_id)
            )
            and (signal := self.snapshot(actor, now)) is not None
        ]

    def snapshot(self, actor: SessionActor, now: float) -> Signal | None:
        """A STATUS snapshot of the actor, or None when nothing observable changed."""
        state, turn_id = _state_of(actor)
        if self._last.get(actor.session_id) == (state, turn_id):
            return None
        self._last[actor.session_id] = (state, turn_id)
        return self._signal(actor, state, turn_id, actor.queued, now)

    def gone(self, actor: SessionActor, now: float) -> Signal:
        """The GONE signal of a session this node stopped holding."""
        self._last.pop(actor.session_id, None)
        self._backlog.pop(actor.session_id, None)
        signal = self._signal(actor, SessionState.GONE, None, 0, now)
        self._told_pending.pop(actor.session_id, None)
        return signal

    def local(self, actor: SessionActor, now: float, backlog: PendingStats) -> ClusterSessionStatus:
        """The status of a session held here, read from its actor and `backlog`."""
        state, turn_id = _state_of(actor)
        return ClusterSessionStatus(
            session_id=actor.session_id,
            holder=self._node_id,
            token=actor.token,
            state=state,
            active_turn_id=turn_id,
            queued=actor.queued,
            pending=backlog.pending,
            oldest_pending_idle=backlog.oldest_idle,
            seq=self._seq,
            origin=self._node_id,
            updated_at=now,
            observed_by=self._node_id,
        )

    def _signal(
        self,
        actor: SessionActor,
        state: SessionState,
        turn_id: str | None,
        queued: int,
        now: float,
    ) -> Signal:
        self._seq += 1
        backlog = self.backlog(actor.session_id)
        self._told_pending[actor.session_id] = backlog.pending
        payload = StatusPayload(
            holder=self._node_id,
            token=actor.token,
            state=state.value,
            active_turn_id=turn_id,
            queued=queued,
            seq=self._seq,
            updated_at=now,
            pending=backlog.pending,
            oldest_pending_idle=backlog.oldest_idle,
        )
        return Signal(
            kind=SignalKind.STATUS.value,
            session_id=actor.session_id,
            origin=self._node_id,
            payload=payload.model_dump(),
        )

    # ------------------------------------------------------------ other nodes' sessions

    def fold(self, signal: Signal, received_at: float) -> None:
        """Keep the newest snapshot: another origin always wins (a new holder's seq is its own).

        Raises:
            pydantic.ValidationError: the payload is not a STATUS payload.
        """
        payload = StatusPayload.model_validate(signal.payload)
        current = self._projection.get(signal.session_id)
        if current is not None and current.origin == signal.origin and payload.seq <= current.seq:
            return
        state = SessionState(payload.state)
        if state is SessionState.GONE:
            if current is None or current.origin == signal.origin:
                self.forget(signal.session_id)
            return
        self._received[signal.session_id] = received_at
        self._projection[signal.session_id] = ClusterSessionStatus(
            session_id=signal.session_id,
            holder=payload.holder,
            token=payload.token,
            state=state,
            active_turn_id=payload.active_turn_id,
            queued=payload.queued,
            pending=payload.pending,
            oldest_pending_idle=payload.oldest_pending_idle,
            seq=payload.seq,
            origin=signal.origin,
            updated_at=payload.updated_at,
        )

    def forget(self, session_id: str) -> None:
        self._projection.pop(session_id, None)
        self._received.pop(session_id, None)

    def seen(self, session_id: str, now: float, fresh_for: float) -> ClusterSessionStatus | None:
        """The folded snapshot of a session held elsewhere, if received within `fresh_for`."""
        seen = self._projection.get(session_id)
        received = self._received.get(session_id, 0.0)
        if seen is not None and now - received <= fresh_for:
            return seen
        return None


def backlog_totals(read: Iterable[PendingStats]) -> tuple[int, int, float | None]:
    """(sessions, pending entries, longest pending idle time) over a heartbeat's backlog read."""
    stats = list(read)
    idles = [s.oldest_idle for s in stats if s.oldest_idle is not None]
    return len(stats), sum(s.pending for s in stats), max(idles, default=None)


def _state_of(actor: SessionActor) -> tuple[SessionState, str | None]:
    running = actor.running
    if running is None:
        return SessionState.IDLE, None
    return SessionState.RUNNING, running.work.turn_id
