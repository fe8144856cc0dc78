"""The stickless routers deployed on the test Ray cluster, and what their agents logged.

`deploy_routers` deploys one router per Ray node (tests.ray_agent's logged agents, short
timings, fast failover unless told otherwise); a `Deployment` builds its requests, lists its
router handles, reads its agents' execution log and its committed transcripts.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stickless import CommittedEntry

from .ray_agent import ExecutionRecord, read_log
from .ray_cluster import wait_for

TIMINGS: dict[str, float] = dict(
    lease_ttl=3.0,
    lease_extend_interval=1.0,
    idempotency_secondary_ttl=3.0,
    holder_loss_sweep_interval=1.0,
    status_heartbeat_interval=1.0,
    forward_ttl=30.0,
    release_interrupt_timeout=2.0,
    interrupt_grace=0.5,
)
#: Generous bounds for Ray itself (starting a worker process on a busy 2-CPU box).
RAY_BOUND = 60.0
RECONCILE_INTERVAL = 0.5
OPENER = "tests.ray_agent:make_logged_opener"


@dataclass
class Deployment:
    """One deploy() of the routers, with the Redis list its agents log executions to."""

    namespace: str
    redis_url: str
    log_key: str = field(default_factory=lambda: f"chaos-log:{uuid.uuid4().hex[:8]}")

    def request(
        self, session: str, tag: str, hold: float = 0.0, key: str | None = None
    ) -> dict[str, Any]:
        """A submit whose idempotency key is `tag` unless given; `hold`: seconds the turn
        lasts (-1: until interrupted)."""
        return {
            "session_id": session,
            "agent_ref": "bot",
            "input": f"{session}|{tag}",
            "idempotency_key": key or tag,
            "submit_options": {
                "log_url": self.redis_url,
                "log_key": self.log_key,
                "tag": tag,
                "hold": hold,
            },
        }

    def routers(self) -> dict[str, Any]:
        from stickless.ray import routers

        return routers(self.namespace)

    def log(self) -> list[ExecutionRecord]:
        import redis

        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            return read_log(client, self.log_key)
        finally:
            client.close()

    def redis_time(self) -> float:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            seconds, micros = client.time()
            return float(seconds) + micros / 1e6
        finally:
            client.close()

    def entries(self, session: str) -> list[CommittedEntry]:
        return asyncio.run(_entries(self.redis_url, self.namespace, [session]))[session]


async def _entries(url: str, namespace: str, sessions: list[str]) -> dict[str, list[Any]]:
    from stickless.backends.redis import RedisBackends

    backends = RedisBackends.from_url(url, namespace=namespace)
    try:
        found: dict[str, list[Any]] = {}
        for session in sessions:
            view = await backends.records.load(session)
            found[session] = list(view.entries) if view is not None else []
        return found
    finally:
        await backends.aclose()


def node_id(handle: Any) -> str:
    import ray

    return str(ray.get(handle.ping.remote(), timeout=10)["node_id"])


def armed(namespace: str) -> bool:
    """Every router watches every other router (fast failover is armed for all of them)."""
    import ray

    from stickless.ray import routers

    handles = list(routers(namespace).values())
    ids = [p["node_id"] for p in ray.get([h.ping.remote() for h in handles], timeout=10)]
    watching = ray.get([h.watching.remote() for h in handles], timeout=10)
    return len(handles) == len(_alive()) and all(
        set(ids) - {own} <= set(seen) for own, seen in zip(ids, watching, strict=True)
    )


def _alive() -> list[str]:
    import ray

    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


def wait_armed(namespace: str) -> None:
    wait_for(lambda: armed(namespace), RAY_BOUND, "every router watches its peers")


def replaced(namespace: str, ray_node: str, old: str) -> Callable[[], str | None]:
    """Probe: the node id of the router now on `ray_node` once it is not `old`."""

    def probe() -> str | None:
        from stickless.ray import routers

        handle = routers(namespace).get(ray_node)
        if handle is None:
            return None
        current = node_id(handle)
        return current if current != old else None

    return probe


def deploy_routers(redis_url: str, fast_failover: bool = True) -> Deployment:
    from stickless.ray import deploy

    deployment = Deployment(f"chaos{uuid.uuid4().hex[:6]}", redis_url)
    deploy(
        redis_url,
        OPENER,
        deployment.namespace,
        fast_failover=fast_failover,
        reconcile_interval=RECONCILE_INTERVAL,
        **TIMINGS,
    )
    if fast_failover:
        wait_armed(deployment.namespace)
    return deployment


def live(handle: Any, dead: set[str]) -> Any:
    return None if handle._actor_id.hex() in dead else handle
