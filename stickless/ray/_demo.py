"""Old import path of the demo's opener and of the Ray demo, kept so that deployments naming
`stickless.ray._demo:make_opener` (as `cluster.yaml` once did) keep working.

New code imports the opener from `stickless.demo.opener` (`stickless.demo.opener:make_opener`),
the Ray demo from `stickless.demo.on_ray` and the local Redis and Ray starters from
`stickless.local_services`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import local_services
from ..demo.agent import AGENT_REF
from ..demo.agent import DEMO_CONFIG as RAY_DEMO_CONFIG
from ..demo.agent import ScriptedAgent as DemoAgent
from ..demo.cluster import DemoError as RayDemoError
from ..demo.on_ray import run_ray_demo
from ..demo.opener import DemoOpener, make_opener

__all__ = [
    "AGENT_REF",
    "RAY_DEMO_CONFIG",
    "DemoAgent",
    "DemoOpener",
    "RayDemoError",
    "local_ray_cluster",
    "make_opener",
    "private_redis",
    "run_ray_demo",
]


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A private redis-server (see `stickless.local_services.private_redis`); yields its URL."""
    with local_services.private_redis(prefix="stickless-demo-redis-") as server:
        yield server.url


@contextlib.contextmanager
def local_ray_cluster(nodes: int) -> Iterator[list[str]]:
    """A loopback Ray cluster (see `stickless.local_services.local_ray_cluster`); yields its
    Ray node ids, head first."""
    with local_services.local_ray_cluster(nodes) as local:
        yield local.node_ids
