"""Metric exporters of the `SessionMetrics` hooks: Prometheus (extra `metrics`) and Ray's
metrics API (extra `ray`), each imported on first use so `stickless` needs neither."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._metrics import COMPLETED, DROP_RANKS, SUBSCRIBER_DROPS
from ._hooks import METRICS, MetricHooks, MetricSpec

if TYPE_CHECKING:
    from ._prometheus import PrometheusMetrics
    from ._ray import RayMetrics

__all__ = [
    "COMPLETED",
    "DROP_RANKS",
    "METRICS",
    "SUBSCRIBER_DROPS",
    "MetricHooks",
    "MetricSpec",
    "PrometheusMetrics",
    "RayMetrics",
]


def __getattr__(name: str) -> Any:
    if name == "PrometheusMetrics":
        from ._prometheus import PrometheusMetrics

        return PrometheusMetrics
    if name == "RayMetrics":
        from ._ray import RayMetrics

        return RayMetrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
