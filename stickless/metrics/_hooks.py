"""The exported metrics, one table for every exporter, and the hooks that move them."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass

#: Bounds (seconds) of the turn duration histogram: a quick tool call up to a long agent run.
TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Bounds (seconds) of the lease acquisition histogram: one store round trip and its tail.
ACQUIRE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric: its name, help text, type, label names and histogram bounds."""

    name: str
    help: str
    kind: str  # "counter", "gauge" or "histogram"
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


def _counter(name: str, help: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, help, "counter", labels)


def _gauge(name: str, help: str) -> MetricSpec:
    return MetricSpec(name, help, "gauge")


#: Every metric, by name (the README's "Metrics" section says what each answers).
METRICS: Mapping[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        _counter("stickless_submits_total", "Submits, by how they were routed", "kind"),
        _counter(
            "stickless_turns_total",
            "Turn answers this node recorded, by result (completed or the failure code)",
            "result",
        ),
        MetricSpec(
            "stickless_turn_duration_seconds",
            "Seconds a turn ran on its holder, by result",
            "histogram",
            ("result",),
            TURN_BUCKETS,
        ),
        MetricSpec(
            "stickless_lease_acquire_seconds",
            "Seconds a session lease acquisition took, by whether it was won",
            "histogram",
            ("won",),
            ACQUIRE_BUCKETS,
        ),
        _gauge("stickless_sessions_held", "Sessions this node holds (each status heartbeat)"),
        _gauge("stickless_pending_entries", "Collected, unanswered inbox entries of held sessions"),
        _gauge(
            "stickless_oldest_pending_idle_seconds",
            "Longest an entry pending on this node has waited (0: none pending)",
        ),
        _counter("stickless_cache_hits_total", "Local submits whose session was held here already"),
        _counter("stickless_cache_misses_total", "Sessions this node claimed (a new actor)"),
        _counter(
            "stickless_evictions_total", "Sessions this node stopped holding, by reason", "reason"
        ),
        _counter(
            "stickless_lease_extend_failures_total", "Lease renewals that found the lease lost"
        ),
        _counter("stickless_holder_loss_total", "Turns this node declared lost with their holder"),
        _counter(
            "stickless_takeover_rejected_total",
            "Take-overs the store refused: a second run of a message prevented",
        ),
        _counter(
            "stickless_forward_doorbell_rerung_total",
            "Forwarded messages whose holder had to be rung again",
        ),
        _counter(
            "stickless_events_dropped_total",
            "Event frames dropped, by rank (reasoning, text, other; subscriber: a slow reader)",
            "rank",
        ),
        _counter("stickless_redelivered_total", "Entries a failover delivered again"),
        _counter("stickless_reclaimed_total", "Own pending entries taken back after a lost reply"),
        _counter(
            "stickless_retries_total", "Turn attempts started again (retry policy, lost holder)"
        ),
        _counter("stickless_dead_letters_total", "Messages kept in the dead-letter store"),
        _gauge(
            "stickless_store_warnings",
            "Warnings the store reported at start (e.g. an evicting Redis allowed; see /readyz)",
        ),
        _counter(
            "stickless_loop_failures_total",
            "Rounds of a background loop that raised (the loop runs again after a backoff)",
            "loop",
        ),
    )
}


class MetricHooks(abc.ABC):
    """`SessionMetrics` over the `METRICS` table: each hook moves its metric through the three
    primitives an exporter implements (which must neither block nor raise)."""

    @abc.abstractmethod
    def _inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Add `amount` to counter `name`."""

    @abc.abstractmethod
    def _set(self, name: str, value: float) -> None:
        """Set gauge `name`."""

    @abc.abstractmethod
    def _observe(self, name: str, value: float, **labels: str) -> None:
        """Record `value` in histogram `name`."""

    def on_lock_acquire(self, session_id: str, acquired: bool, latency: float) -> None:
        self._observe("stickless_lease_acquire_seconds", latency, won=str(acquired).lower())

    def on_cache_hit(self, session_id: str) -> None:
        self._inc("stickless_cache_hits_total")

    def on_cache_miss(self, session_id: str) -> None:
        self._inc("stickless_cache_misses_total")

    def on_evict(self, session_id: str, reason: str) -> None:
        self._inc("stickless_evictions_total", reason=reason)

    def on_lease_extend_failed(self, session_id: str) -> None:
        self._inc("stickless_lease_extend_failures_total")

    def on_submit(self, session_id: str, kind: str) -> None:
        self._inc("stickless_submits_total", kind=kind)

    def on_holder_loss(self, session_id: str, turn_id: str) -> None:
        self._inc("stickless_holder_loss_total")

    def on_takeover_rejected(self, session_id: str, key: str) -> None:
        self._inc("stickless_takeover_rejected_total")

    def on_forward_doorbell_rerung(self, session_id: str) -> None:
        self._inc("stickless_forward_doorbell_rerung_total")

    def on_events_dropped(self, session_id: str, count: int, rank: str) -> None:
        self._inc("stickless_events_dropped_total", count, rank=rank)

    def on_turn_finished(self, session_id: str, turn_id: str, result: str, duration: float) -> None:
        self._inc("stickless_turns_total", result=result)
        self._observe("stickless_turn_duration_seconds", duration, result=result)

    def on_redelivered(self, session_id: str, count: int) -> None:
        self._inc("stickless_redelivered_total", count)

    def on_reclaimed(self, session_id: str, count: int) -> None:
        self._inc("stickless_reclaimed_total", count)

    def on_retried(self, session_id: str, turn_id: str, attempt: int) -> None:
        self._inc("stickless_retries_total")

    def on_dead_lettered(self, session_id: str, turn_id: str, reason: str) -> None:
        self._inc("stickless_dead_letters_total")

    def on_loop_failure(self, node_id: str, loop: str) -> None:
        self._inc("stickless_loop_failures_total", loop=loop)

    def on_pending_gauge(
        self, node_id: str, sessions: int, pending: int, oldest_idle: float | None
    ) -> None:
        self._set("stickless_sessions_held", sessions)
        self._set("stickless_pending_entries", pending)
        self._set("stickless_oldest_pending_idle_seconds", oldest_idle or 0.0)

    def on_store_warnings(self, count: int) -> None:
        self._set("stickless_store_warnings", count)
