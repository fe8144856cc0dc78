"""`PrometheusMetrics`: the hooks as prometheus-client metrics in a registry (extra `metrics`)."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from ._hooks import METRICS, MetricHooks, MetricSpec


def _metric(spec: MetricSpec, registry: CollectorRegistry) -> Any:
    """The prometheus-client metric of `spec`, registered in `registry`."""
    if spec.kind == "counter":
        return Counter(spec.name, spec.help, spec.labels, registry=registry)
    if spec.kind == "gauge":
        return Gauge(spec.name, spec.help, spec.labels, registry=registry)
    return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets)


class PrometheusMetrics(MetricHooks):
    """`SessionMetrics` exporting to a prometheus-client registry (a private one by default,
    so several routers in one process never collide); one per router."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self._metrics = {name: _metric(spec, self.registry) for name, spec in METRICS.items()}

    def _child(self, name: str, labels: dict[str, str]) -> Any:
        metric = self._metrics[name]
        return metric.labels(**labels) if labels else metric

    def _inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self._child(name, labels).inc(amount)

    def _set(self, name: str, value: float) -> None:
        self._metrics[name].set(value)

    def _observe(self, name: str, value: float, **labels: str) -> None:
        self._child(name, labels).observe(value)

    def exposition(self) -> tuple[bytes, str]:
        """The registry in the Prometheus text format, and its content type (for `/metrics`)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Serve the registry at `http://host:port/metrics` from a daemon thread; returns the
        server (its `shutdown()` stops it)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server
