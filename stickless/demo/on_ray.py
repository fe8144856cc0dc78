"""`stickless demo --ray N`: the scenes on a local N-node Ray cluster, one router actor per node.

`run_ray_demo` starts a loopback Ray cluster and, unless given a Redis URL, a private
`redis-server` on a free loopback port (both from `stickless.local_services`); it deploys the
demo agent's opener (`stickless.demo.opener:make_opener`) with one router per Ray node, walks
through the scenes, then undeploys and stops Ray and Redis (the latter by its pid). Ray is
imported only once the demo runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from .._events import Event
from ..local_services import (
    ServiceError,
    find_redis_server,
    local_ray_cluster,
    private_redis,
    ray_loopback_env,
)
from ..router import ClusterSessionStatus
from .agent import AGENT_REF, DEMO_CONFIG, AgentLedger
from .cluster import DemoError, Ticket
from .console import Console
from .narration import ON_RAY
from .opener import OPENER_PATH
from .scenes import play


class RaySubscription:
    """A router's Ray streaming generator of one turn (replayed from the event log if its
    frames came before the subscription)."""

    def __init__(self, handle: Any, session_id: str) -> None:
        self._handle = handle
        self._session_id = session_id

    async def frames(self, turn_id: str) -> AsyncIterator[Event]:
        stream = self._handle.events.remote(self._session_id, after="0-0", turn_id=turn_id)
        async for ref in stream:
            event: Event = await ref
            yield event


class RayDemoCluster:
    """`DemoCluster` over router actors deployed in a Ray namespace (one per Ray node)."""

    narration = ON_RAY
    patience = 2.0
    ledger: AgentLedger | None = None  # the agents run in the router actors, elsewhere

    def __init__(
        self, namespace: str, redis_url: str, ray_nodes: list[str], token_delay: float
    ) -> None:
        self.namespace = namespace
        self.redis_url = redis_url
        self.ray_nodes = ray_nodes  # head first
        self._delay = token_delay
        self._routers: dict[str, str] = {}  # ray node id -> its router's node id
        self._handles: dict[str, Any] = {}  # router node id -> actor handle
        self._killed: set[str] = set()

    async def refresh(self) -> None:
        """Look the routers up (after the deployment)."""
        from ..ray import routers

        handles = routers(self.namespace)
        pings = await asyncio.gather(*(h.ping.remote() for h in handles.values()))
        self._routers = {p["ray_node_id"]: p["node_id"] for p in pings}
        self._handles = {p["node_id"]: handles[p["ray_node_id"]] for p in pings}

    async def armed(self) -> None:
        """Wait (bounded) until every router watches its peers, so a kill is noticed at once."""
        deadline = time.monotonic() + 30
        everyone = set(self._handles)
        while True:
            ids = list(self._handles)
            watching = await asyncio.gather(*(self._handles[n].watching.remote() for n in ids))
            if all(everyone - {n} <= set(seen) for n, seen in zip(ids, watching, strict=True)):
                return
            if time.monotonic() > deadline:
                raise DemoError("the routers did not start watching each other")
            await asyncio.sleep(0.1)

    def nodes(self) -> list[str]:
        routers = (self._routers.get(ray_node) for ray_node in self.ray_nodes)
        return [n for n in routers if n is not None and n not in self._killed]

    def roster(self) -> list[str]:
        return []  # routers are listed once they took part

    def label(self, node_id: str | None) -> str:
        """`n<index>/<incarnation>` for a router node id (index: the Ray node, head = n0)."""
        if not node_id:
            return "?"
        ray_node, _, incarnation = node_id.partition("/")
        index = self.ray_nodes.index(ray_node) if ray_node in self.ray_nodes else -1
        return f"n{index}/{incarnation[:4]}"

    async def submit(self, node: str, session_id: str, text: str, **extra: Any) -> Ticket:
        handle = self._handles[node]
        options = {"delay": self._delay, **extra.pop("submit_options", {})}
        request = {
            "session_id": session_id,
            "agent_ref": AGENT_REF,
            "input": text,
            "submit_options": options,
            **extra,
        }
        ticket = await handle.submit.remote(request)
        return Ticket(ticket.kind, ticket.turn_id, lambda: handle.result.remote(ticket.turn_id))

    async def subscribe(self, node: str, session_id: str) -> RaySubscription:
        return RaySubscription(self._handles[node], session_id)

    async def interrupt(self, node: str, session_id: str, reason: str) -> None:
        await self._handles[node].interrupt.remote(session_id, reason=reason)

    async def status(self, node: str, session_id: str) -> ClusterSessionStatus:
        status: ClusterSessionStatus = await self._handles[node].status.remote(session_id)
        return status

    async def kill(self, node: str) -> None:
        """`ray.kill` the router actor."""
        import ray

        ray.kill(self._handles[node])
        self._killed.add(node)

    async def replacement(self, node: str) -> str | None:
        """Wait (bounded) until the reconciler has a new router on the killed one's Ray node."""
        from ray.exceptions import RayActorError

        from ..ray import routers

        ray_node = node.partition("/")[0]
        deadline = time.monotonic() + 60
        while True:
            handle = routers(self.namespace).get(ray_node)
            if handle is not None:
                try:
                    current = str((await handle.ping.remote())["node_id"])
                except RayActorError:  # the old incarnation's name is not released yet
                    current = node
                if current != node:
                    self._routers[ray_node], self._handles[current] = current, handle
                    return current
            if time.monotonic() > deadline:
                raise DemoError("the reconciler did not recreate the killed router")
            await asyncio.sleep(0.1)

    async def committed(self, session_id: str) -> int:
        """Read from Redis."""
        from ..backends.redis import RedisBackends

        backends = RedisBackends.from_url(self.redis_url, namespace=self.namespace)
        try:
            view = await backends.records.load(session_id)
            return len(view.entries) if view is not None else 0
        finally:
            await backends.aclose()


def run_ray_demo(
    nodes: int,
    token_delay: float,
    redis_url: str | None,
    timeout: float,
    console: Console | None = None,
) -> int:
    """Run the scenes on a fresh local Ray cluster; 0 when all showed what they should.

    Starting the cluster is bounded by Ray itself; `timeout` bounds the scenes.
    """
    console = console or Console()
    ray_loopback_env()  # before Ray is first imported
    try:
        from ..ray import deploy, undeploy
    except ImportError as exc:
        sys.stdout.write(f"{exc}\n")
        return 1
    with contextlib.ExitStack() as stack:
        try:
            if redis_url is None:
                executable = find_redis_server()
                if executable is None:
                    raise DemoError("redis-server is not on PATH (install it, or pass --redis URL)")
                server = stack.enter_context(
                    private_redis(executable, prefix="stickless-demo-redis-")
                )
                redis_url = server.url
                where = f"a private redis-server at {redis_url}"
            else:
                where = f"Redis at {redis_url.rpartition('@')[2]}"
            console.line("ray", f"starting a local Ray cluster: {nodes} nodes on 127.0.0.1")
            ray_nodes = stack.enter_context(local_ray_cluster(nodes)).node_ids
        except (DemoError, ServiceError) as exc:
            console.line("FAILED", str(exc))
            return 1
        namespace = f"demo-{uuid.uuid4().hex[:6]}"
        deployed = time.monotonic()
        deploy(redis_url, OPENER_PATH, namespace, **DEMO_CONFIG)
        stack.callback(undeploy, namespace, 1.0)
        cluster = RayDemoCluster(namespace, redis_url, ray_nodes, token_delay)

        async def scenes() -> None:
            await cluster.refresh()
            await cluster.armed()
            console.line(
                "deploy",
                f"{len(cluster.nodes())} routers (one per Ray node, num_cpus=0) over {where}, "
                f"namespace {namespace!r}, in {time.monotonic() - deployed:.1f}s",
            )
            for router_id in cluster.nodes():
                console.line("router", f"{cluster.label(router_id):<8} = {router_id}")
            await play(cluster, console)

        try:
            asyncio.run(asyncio.wait_for(scenes(), timeout))
        except DemoError as exc:
            console.line("FAILED", str(exc))
            return 1
        except TimeoutError:
            console.line("FAILED", f"the scenes did not finish within {timeout:.0f}s")
            return 1
    console.line("done", f"demo finished in {console.elapsed():.2f}s (Ray and Redis stopped)")
    return 0
