"""Test helpers: an in-process cluster over shared memory backends, and counting metrics."""

from __future__ import annotations

import collections
import itertools
import uuid
from collections.abc import Callable
from typing import Any

from ._config import DeploymentMode, RouterConfig
from ._metrics import SessionMetrics
from ._session import LiveSessionOpener
from .backends.base import Backends
from .backends.memory import MemoryBackends
from .router import SessionRouter

#: Builds one node's own backends bundle (its own connections) from the node id.
NodeBackendsFactory = Callable[[str], Backends]

_cluster_ids = itertools.count(1)


class LocalCluster:
    """Several routers in one process over one shared `MemoryBackends`: a simulated cluster.

    Each node gets its own link to the shared data, so `kill(node)` can cut exactly that node
    off, the way a crashed process loses its connections. `LocalCluster.over_redis(...)` runs
    the same nodes over a real Redis instead, each with its own connections.
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        opener: LiveSessionOpener | None = None,
        session_factory: Callable[[str, str], Any] | None = None,
        backends: Backends | None = None,
        node_backends: NodeBackendsFactory | None = None,
        metrics: SessionMetrics | None = None,
        tracer_provider: Any | None = None,
        **config_overrides: Any,
    ) -> None:
        self._initial = nodes
        self._tracer_provider = tracer_provider
        self._opener = opener
        self._factory = session_factory
        self._metrics = metrics
        self._overrides = config_overrides
        #: The shared data as seen by the test itself (for reading records, inboxes, leases).
        self.backends: Backends = backends if backends is not None else MemoryBackends()
        if node_backends is None and not isinstance(self.backends, MemoryBackends):
            raise ValueError("node_backends= is required unless the backends are MemoryBackends")
        self._node_backends = node_backends
        self.nodes: list[SessionRouter] = []
        self._links: dict[str, Backends] = {}
        self._killed: set[str] = set()
        self._prefix = f"c{next(_cluster_ids)}"
        self._serial = itertools.count(1)

    @classmethod
    def over_redis(
        cls,
        url: str,
        nodes: int = 3,
        *,
        namespace: str | None = None,
        **kwargs: Any,
    ) -> LocalCluster:
        """Nodes in DISTRIBUTED mode over a real Redis, each node with its own connections.

        `kill(node)` stops the node's tasks and closes its connections; its leases and
        reservations stay in Redis until they expire, as after a real crash.
        """
        from .backends.redis import RedisBackends

        prefix = namespace or f"cluster-{uuid.uuid4().hex[:8]}"
        return cls(
            nodes,
            backends=RedisBackends.from_url(url, namespace=prefix),
            node_backends=lambda _: RedisBackends.from_url(url, namespace=prefix),
            mode=DeploymentMode.DISTRIBUTED,
            **kwargs,
        )

    @property
    def alive(self) -> list[SessionRouter]:
        """Nodes neither killed nor closed."""
        return [n for n in self.nodes if not n.closed]

    async def start(self) -> LocalCluster:
        """Build and start the initial nodes."""
        for _ in range(self._initial):
            await self.add_node()
        return self

    async def add_node(self, node_id: str | None = None) -> SessionRouter:
        """Start one more node (a fresh incarnation with its own id)."""
        node_id = node_id or f"{self._prefix}-node-{next(self._serial)}"
        if self._node_backends is not None:
            link = self._node_backends(node_id)
        else:
            assert isinstance(self.backends, MemoryBackends)
            link = self.backends.link()
        # Node ids here are unique per router already: keep them readable.
        config = RouterConfig(node_id=node_id, **{"node_incarnation": False, **self._overrides})
        router = SessionRouter.build(
            config=config,
            opener=self._opener,
            session_factory=self._factory,
            backends=link,
            metrics=self._metrics,
            tracer_provider=self._tracer_provider,
        )
        await router.start()
        self._links[node_id] = link
        self.nodes.append(router)
        return router

    async def kill(self, node: SessionRouter) -> None:
        """Crash a node: cut its backend access first, then stop its tasks with no release or
        announcement; its leases and reservations are left to expire."""
        link = self._links[node.node_id]
        self._killed.add(node.node_id)
        if isinstance(link, MemoryBackends):
            link.sever()
            await node.kill()
        else:
            await node.kill()  # stops every task before its first await
            await link.aclose()

    def is_killed(self, node: SessionRouter) -> bool:
        return node.node_id in self._killed

    async def aclose(self, grace: float = 1.0) -> None:
        """Close every node still running (killed or closed ones are skipped)."""
        for node in self.nodes:
            if not node.closed:
                await node.aclose(grace=grace)
        if self._node_backends is not None:
            for node_id, link in self._links.items():
                if node_id not in self._killed:
                    await link.aclose()
            await self.backends.aclose()

    async def __aenter__(self) -> LocalCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class CountingMetrics:
    """SessionMetrics that counts every hook call by name (and keeps the arguments)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _record(self, hook: str, *args: Any) -> None:
        self.counts[hook] += 1
        self.calls.append((hook, args))

    def on_lock_acquire(self, session_id: str, acquired: bool, latency: float) -> None:
        self._record("on_lock_acquire", session_id, acquired)

    def on_cache_hit(self, session_id: str) -> None:
        self._record("on_cache_hit", session_id)

    def on_cache_miss(self, session_id: str) -> None:
        self._record("on_cache_miss", session_id)

    def on_evict(self, session_id: str, reason: str) -> None:
        self._record("on_evict", session_id, reason)

    def on_lease_extend_failed(self, session_id: str) -> None:
        self._record("on_lease_extend_failed", session_id)

    def on_submit(self, session_id: str, kind: str) -> None:
        self._record("on_submit", session_id, kind)

    def on_holder_loss(self, session_id: str, turn_id: str) -> None:
        self._record("on_holder_loss", session_id, turn_id)

    def on_takeover_rejected(self, session_id: str, key: str) -> None:
        self._record("on_takeover_rejected", session_id, key)

    def on_forward_doorbell_rerung(self, session_id: str) -> None:
        self._record("on_forward_doorbell_rerung", session_id)

    def on_events_dropped(self, session_id: str, count: int, rank: str) -> None:
        self._record("on_events_dropped", session_id, count, rank)

    def on_turn_finished(self, session_id: str, turn_id: str, result: str, duration: float) -> None:
        self._record("on_turn_finished", session_id, turn_id, result)

    def on_redelivered(self, session_id: str, count: int) -> None:
        self._record("on_redelivered", session_id, count)

    def on_reclaimed(self, session_id: str, count: int) -> None:
        self._record("on_reclaimed", session_id, count)

    def on_retried(self, session_id: str, turn_id: str, attempt: int) -> None:
        self._record("on_retried", session_id, turn_id, attempt)

    def on_dead_lettered(self, session_id: str, turn_id: str, reason: str) -> None:
        self._record("on_dead_lettered", session_id, turn_id, reason)

    def on_loop_failure(self, node_id: str, loop: str) -> None:
        self._record("on_loop_failure", node_id, loop)

    def on_pending_gauge(
        self, node_id: str, sessions: int, pending: int, oldest_idle: float | None
    ) -> None:
        self._record("on_pending_gauge", node_id, sessions, pending, oldest_idle)


__all__ = ["CountingMetrics", "LocalCluster"]
