"""`RayMetrics`: the hooks as `ray.util.metrics`, on Ray's own metrics endpoint (extra `ray`)."""

from __future__ import annotations

from typing import Any

from ray.util import metrics as ray_metrics

from ._hooks import METRICS, MetricHooks, MetricSpec

#: The tag naming the router (its node id) on every metric.
NODE_TAG = "node_id"


def _metric(spec: MetricSpec, node_id: str) -> Any:
    """The Ray metric of `spec`, tagged with the router's node id."""
    tags = (NODE_TAG, *spec.labels)
    if spec.kind == "counter":
        metric = ray_metrics.Counter(spec.name, spec.help, tag_keys=tags)
    elif spec.kind == "gauge":
        metric = ray_metrics.Gauge(spec.name, spec.help, tag_keys=tags)
    else:
        bounds = list(spec.buckets)
        metric = ray_metrics.Histogram(spec.name, spec.help, boundaries=bounds, tag_keys=tags)
    metric.set_default_tags({NODE_TAG: node_id})
    return metric


class RayMetrics(MetricHooks):
    """`SessionMetrics` recorded through Ray's metrics API from a router actor; Ray's metrics
    agent exports them (as `ray_stickless_...`) on the node's metrics endpoint."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._metrics = {name: _metric(spec, node_id) for name, spec in METRICS.items()}

    def _inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self._metrics[name].inc(amount, tags=labels or None)

    def _set(self, name: str, value: float) -> None:
        self._metrics[name].set(value)

    def _observe(self, name: str, value: float, **labels: str) -> None:
        self._metrics[name].observe(value, tags=labels or None)
