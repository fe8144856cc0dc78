"""Shared fixtures: a simulated 3-node cluster running scripted agents."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener
from .redis_fixture import redis_server, redis_url  # noqa: F401  (fixtures, registered here)

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
