"""Operational hooks: no-op by default, never allowed to break a session."""

from __future__ import annotations

from typing import Any, Protocol

from ._logs import get_logger

log = get_logger("stickless.metrics")

#: `on_turn_finished`'s result of a turn that succeeded (any other is a `FailureCode` name).
COMPLETED = "completed"
#: `on_events_dropped`'s rank of frames a relay shed, by `drop_rank`, and of frames a
#: subscriber's full buffer dropped (a slow reader; the stream reads them back from the log).
DROP_RANKS = ("reasoning", "text", "other")
SUBSCRIBER_DROPS = "subscriber"


class SessionMetrics(Protocol):
    """Hooks a deployment may implement; each runs on the thread that raised the event and must
    not block. A hook that raises is ignored (its first failure logged); one the implementation
    lacks (written before the hook existed) is skipped."""

    def on_lock_acquire(self, session_id: str, acquired: bool, latency: float) -> None: ...

    def on_cache_hit(self, session_id: str) -> None: ...

    def on_cache_miss(self, session_id: str) -> None: ...

    def on_evict(self, session_id: str, reason: str) -> None: ...

    def on_lease_extend_failed(self, session_id: str) -> None: ...

    def on_submit(self, session_id: str, kind: str) -> None: ...

    def on_holder_loss(self, session_id: str, turn_id: str) -> None: ...

    def on_takeover_rejected(self, session_id: str, key: str) -> None: ...

    def on_forward_doorbell_rerung(self, session_id: str) -> None: ...

    def on_events_dropped(self, session_id: str, count: int, rank: str) -> None:
        """`count` frames of rank `rank` were dropped: one of `DROP_RANKS` when a relay shed
        them (overflow, or emitted after the turn ended), `SUBSCRIBER_DROPS` when a local
        subscriber's buffer was full."""
        ...

    def on_turn_finished(self, session_id: str, turn_id: str, result: str, duration: float) -> None:
        """This node recorded a turn's answer: `result` is `COMPLETED` or the `FailureCode`
        name; `duration` the seconds it ran on its holder (0 for one that never started; for
        HOLDER_LOST declared here, the seconds since its holder last touched the reservation)."""
        ...

    def on_redelivered(self, session_id: str, count: int) -> None:
        """A collect took over `count` entries an older lease had collected and never answered
        (its holder died or gave the session up): a failover delivered them again."""
        ...

    def on_reclaimed(self, session_id: str, count: int) -> None:
        """A collect took back `count` entries already pending under this holder's own lease,
        after a collect whose reply was lost (a store or network fault, not a failover)."""
        ...

    def on_retried(self, session_id: str, turn_id: str, attempt: int) -> None:
        """A turn starts again as `attempt` (2 or more) after an attempt that failed under the
        retry policy or was lost with its holder."""
        ...

    def on_dead_lettered(self, session_id: str, turn_id: str, reason: str) -> None:
        """A message went to the dead-letter store (attempts exhausted, or unreadable)."""
        ...

    def on_loop_failure(self, node_id: str, loop: str) -> None:
        """A round of one of the node's background loops (`loop`: heartbeat, forward_poll,
        cache_sweep, status_heartbeat, holder_loss_sweep) raised; the loop runs again after a
        backoff (see "Supervised loops" in docs/architecture.md)."""
        ...

    def on_pending_gauge(
        self, node_id: str, sessions: int, pending: int, oldest_idle: float | None
    ) -> None:
        """Each status heartbeat: the sessions this node holds, their collected but unanswered
        entries, and the longest any of them has waited (None when none is pending)."""
        ...

    def on_store_warnings(self, count: int) -> None:
        """At start: how many warnings the store reported about its configuration (e.g. an
        evicting Redis the operator allowed; `router.store_warnings` has their text)."""
        ...


class NoopMetrics:
    """The default: every hook does nothing."""

    def on_lock_acquire(self, session_id: str, acquired: bool, latency: float) -> None:
        return None

    def on_cache_hit(self, session_id: str) -> None:
        return None

    def on_cache_miss(self, session_id: str) -> None:
        return None

    def on_evict(self, session_id: str, reason: str) -> None:
        return None

    def on_lease_extend_failed(self, session_id: str) -> None:
        return None

    def on_submit(self, session_id: str, kind: str) -> None:
        return None

    def on_holder_loss(self, session_id: str, turn_id: str) -> None:
        return None

    def on_takeover_rejected(self, session_id: str, key: str) -> None:
        return None

    def on_forward_doorbell_rerung(self, session_id: str) -> None:
        return None

    def on_events_dropped(self, session_id: str, count: int, rank: str) -> None:
        return None

    def on_turn_finished(self, session_id: str, turn_id: str, result: str, duration: float) -> None:
        return None

    def on_redelivered(self, session_id: str, count: int) -> None:
        return None

    def on_reclaimed(self, session_id: str, count: int) -> None:
        return None

    def on_retried(self, session_id: str, turn_id: str, attempt: int) -> None:
        return None

    def on_dead_lettered(self, session_id: str, turn_id: str, reason: str) -> None:
        return None

    def on_loop_failure(self, node_id: str, loop: str) -> None:
        return None

    def on_pending_gauge(
        self, node_id: str, sessions: int, pending: int, oldest_idle: float | None
    ) -> None:
        return None

    def on_store_warnings(self, count: int) -> None:
        return None


NOOP_METRICS: SessionMetrics = NoopMetrics()


class SafeMetrics:
    """Wraps a SessionMetrics so that a failing hook is logged (once per hook), never raised."""

    def __init__(self, inner: SessionMetrics) -> None:
        self._inner = inner
        #: Hooks that raised once already: their later failures are not logged again.
        self._failed: set[str] = set()

    def emit(self, hook: str, *args: Any) -> None:
        call = getattr(self._inner, hook, None)
        if call is None:  # metrics written before this hook existed
            return
        try:
            call(*args)
        except Exception:
            if hook not in self._failed:
                self._failed.add(hook)
                log.exception("metrics hook %s failed (later failures of it are not logged)", hook)
