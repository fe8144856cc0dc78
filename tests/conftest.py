"""Shared fixtures: a simulated 3-node cluster running scripted agents, over the memory
backends or (for tests parametrized over `BACKENDS`) over the session's redis-server."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener
from .redis_fixture import redis_server, redis_url  # noqa: F401  (fixtures, registered here)
from .redis_stores import bundle  # noqa: F401  (a fixture, registered here)

#: Short timings so failure paths resolve in well under a second or two.
FAST = dict(
    lease_ttl=2.0,
    lease_extend_interval=0.5,
    idempotency_secondary_ttl=1.0,
    holder_loss_sweep_interval=0.5,
    forward_ttl=20.0,
    release_interrupt_timeout=2.0,
    interrupt_grace=0.5,
    status_heartbeat_interval=0.5,
)


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
async def cluster(journal: Journal) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(3, opener=ScriptedOpener(journal), **FAST) as running:
        yield running


def make_cluster(journal: Journal, nodes: int = 3, **overrides: Any) -> LocalCluster:
    return LocalCluster(nodes, opener=ScriptedOpener(journal), **{**FAST, **overrides})


#: The backends a scenario parametrized with `cluster_over` / `backend_cluster` runs over.
BACKENDS = ["memory", "redis"]

ClusterFactory = Callable[..., LocalCluster]


@pytest.fixture(params=BACKENDS)
def cluster_over(request: pytest.FixtureRequest, journal: Journal) -> ClusterFactory:
    """`make_cluster` over the selected backend: `cluster_over(nodes=3, **overrides)`."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")

        def over_redis(nodes: int = 3, **overrides: Any) -> LocalCluster:
            opener = ScriptedOpener(journal)
            return LocalCluster.over_redis(url, nodes, opener=opener, **{**FAST, **overrides})

        return over_redis
    return functools.partial(make_cluster, journal)


@pytest.fixture
async def backend_cluster(cluster_over: ClusterFactory) -> AsyncIterator[LocalCluster]:
    """The `cluster` fixture over the selected backend."""
    async with cluster_over() as running:
        yield running
