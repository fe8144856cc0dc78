"""deploy / undeploy and handle lookup: exactly one NodeRouter per alive Ray node.

A detached reconciler actor keeps that true as nodes join or leave: it creates the router of a
node that has none (a fresh incarnation) on the node itself (`NodeAffinitySchedulingStrategy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._config import RouterConfig
from .._logs import get_logger
from ._actor import ROUTER_PREFIX, NodeRouter

log = get_logger("stickless.ray")

RECONCILER_NAME = "stickless-reconciler"
#: Concurrent calls one router actor serves (async actor; calls mostly wait on I/O).
_MAX_CONCURRENCY = 10_000


def router_name(ray_node_id: str) -> str:
    """The actor name of the router on a Ray node."""
    return ROUTER_PREFIX + ray_node_id


def _alive_nodes() -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


#: The resource Ray gives only the head node.
_HEAD_RESOURCE = "node:__internal_head__"


def _head_node() -> str | None:
    """The alive head node's id (the reconciler lives there: worker nodes may come and go)."""
    for node in ray.nodes():
        if node.get("Alive") and _HEAD_RESOURCE in node.get("Resources", {}):
            return str(node["NodeID"])
    return None


class RouterReconciler:
    """Creates the missing router of every alive node, forever (detached, num_cpus=0)."""

    def __init__(
        self,
        redis_url: str,
        opener: str,
        namespace: str,
        config_overrides: Mapping[str, Any],
        fast_failover: bool,
        interval: float,
    ) -> None:
        self._args = (redis_url, opener, namespace, dict(config_overrides), fast_failover)
        self._namespace = namespace
        self._interval = interval
        self._loop_task: asyncio.Task[None] | None = None

    async def reconcile(self) -> dict[str, str]:
        """Ensure one started router per alive node; returns {ray node id: router node id}."""

        async def place(ray_node: str) -> tuple[str, str | None]:
            try:
                handle = self._router_of(ray_node)
                return ray_node, await asyncio.wait_for(handle.start.remote(), 60)
            except Exception as exc:
                log.warning("router on node %s did not start: %s", ray_node, exc)
                return ray_node, None

        # Concurrently: a node that is going away must not hold up the others' routers.
        placed = await asyncio.gather(*(place(node) for node in _alive_nodes()))
        return {node: node_id for node, node_id in placed if node_id is not None}

    def _router_of(self, ray_node: str) -> Any:
        """The node's router handle, created (a new incarnation) when it has none."""
        name = router_name(ray_node)
        try:
            return ray.get_actor(name, namespace=self._namespace)
        except ValueError:
            pass
        try:
            return (
                _router_class()
                .options(
                    name=name,
                    namespace=self._namespace,
                    lifetime="detached",
                    num_cpus=0,
                    max_restarts=0,
                    max_concurrency=_MAX_CONCURRENCY,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node, soft=False),
                )
                .remote(*self._args)
            )
        except ValueError:
            # A concurrent reconcile (deploy() while the loop runs) created it first.
            return ray.get_actor(name, namespace=self._namespace)

    async def run(self) -> None:
        """Reconcile every `interval` seconds until killed."""
        while True:
            try:
                await self.reconcile()
            except Exception:
                log.exception("reconciling routers failed")
            await asyncio.sleep(self._interval)

    async def ping(self) -> bool:
        return True

    async def ray_node(self) -> str:
        """The Ray node this reconciler runs on (the head node)."""
        return str(ray.get_runtime_context().get_node_id())


def _router_class() -> Any:
    return ray.remote(NodeRouter)


def deploy(
    redis_url: str,
    opener: str,
    namespace: str = "stickless",
    *,
    fast_failover: bool = True,
    reconcile_interval: float = 2.0,
    timeout: float = 120.0,
    **config_overrides: Any,
) -> dict[str, Any]:
    """Place one router on every alive Ray node and keep it so; blocks until all answer.

    `opener` is an import path `"package.module:attribute"` naming a LiveSessionOpener (or a
    zero-argument factory of one) importable on every node; `namespace` is both the Ray
    namespace of the router actors and the Redis key prefix. Returns `routers(namespace)`.

    Raises:
        ValueError: `config_overrides` are not valid RouterConfig fields.
        TimeoutError: not every router answered within `timeout` seconds.
    """
    if not ray.is_initialized():
        raise RuntimeError("call ray.init(...) before deploy()")
    RouterConfig(node_id="validation", **config_overrides)  # fail fast on bad overrides
    try:
        reconciler = ray.get_actor(RECONCILER_NAME, namespace=namespace)
    except ValueError:
        # On the head node: a reconciler on a worker node would die with that node, and no
        # router would be created for nodes that join afterwards. (Hard affinity: with
        # soft=True Ray 2.60 was seen placing this 0-CPU actor on another node.)
        head = _head_node()
        reconciler = (
            ray.remote(RouterReconciler)
            .options(
                name=RECONCILER_NAME,
                namespace=namespace,
                lifetime="detached",
                num_cpus=0,
                max_concurrency=16,
                scheduling_strategy=(
                    NodeAffinitySchedulingStrategy(head, soft=False) if head else "DEFAULT"
                ),
            )
            .remote(
                redis_url, opener, namespace, config_overrides, fast_failover, reconcile_interval
            )
        )
    placed = ray.get(reconciler.reconcile.remote(), timeout=timeout)
    missing = set(_alive_nodes()) - set(placed)
    if missing:
        raise TimeoutError(f"routers did not answer on node(s) {sorted(missing)}")
    reconciler.run.remote()
    return routers(namespace)


def routers(namespace: str = "stickless") -> dict[str, Any]:
    """`{ray node id hex: router handle}` for every alive node that has a router."""
    found: dict[str, Any] = {}
    for ray_node in _alive_nodes():
        try:
            found[ray_node] = ray.get_actor(router_name(ray_node), namespace=namespace)
        except ValueError:
            continue
    return found


def local_router(namespace: str = "stickless") -> Any:
    """The router on the caller's own Ray node.

    Raises:
        LookupError: this node has no router (yet).
    """
    ray_node = ray.get_runtime_context().get_node_id()
    try:
        return ray.get_actor(router_name(ray_node), namespace=namespace)
    except ValueError:
        raise LookupError(f"no stickless router on Ray node {ray_node}") from None


def any_router(namespace: str = "stickless") -> Any:
    """Any alive router (random), e.g. to retry after the caller's own router died.

    Raises:
        LookupError: no router is deployed.
    """
    found = routers(namespace)
    if not found:
        raise LookupError(f"no stickless routers deployed in namespace {namespace!r}")
    return random.choice(list(found.values()))


def undeploy(namespace: str = "stickless", grace: float = 5.0) -> None:
    """Stop the reconciler, close every router gracefully, then remove the actors."""
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(RECONCILER_NAME, namespace=namespace))
    handles = list(routers(namespace).values())
    closing = [h.aclose.remote(grace) for h in handles]
    if closing:
        ray.wait(closing, num_returns=len(closing), timeout=grace + 10)
    for handle in handles:
        ray.kill(handle)
