"""Probe contract: `Liveness.probe()` is one round trip over the bundle's own connections that
proves its path to the store works (see "Node liveness" in docs/architecture.md): it answers
while the store is reachable, fails while the path is cut, and vouches for nothing (it renews
no incarnation)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from stickless.backends.base import Backends, Lease
from stickless.backends.memory import MemoryBackends
from tests.faults import FaultProxy
from tests.redis_fixture import RedisServer

from .conftest import BACKENDS

SHORT = 0.3
LONG = 60.0
#: The socket timeout of the Redis bundle behind a proxy: a stalled probe fails within it.
SOCKET_TIMEOUT = 0.5

#: A bundle and what cuts its path to the store (for good, until the test ends).
Cuttable = tuple[Backends, Callable[[], None]]


@pytest.fixture(params=BACKENDS)
async def cuttable(request: pytest.FixtureRequest) -> AsyncIterator[Cuttable]:
    """A fresh bundle whose path to the store a test can cut: memory severs its link, Redis
    goes through a `FaultProxy` that stalls every byte (the connections stay open, unanswered:
    a gray failure, not a refused connection)."""
    if request.param == "memory":
        memory = MemoryBackends()
        yield memory, memory.sever
        await memory.aclose()
        return
    from stickless.backends.redis import RedisBackends

    server: RedisServer = request.getfixturevalue("redis_server")
    request.getfixturevalue("redis_url")  # (running and empty)
    proxy = FaultProxy("127.0.0.1", server.port, password=server.password).start()
    bundle = RedisBackends.from_url(
        proxy.url(), namespace="contract", socket_timeout=SOCKET_TIMEOUT
    )
    try:
        yield bundle, lambda: proxy.stall("both")
    finally:
        proxy.clear()
        await bundle.aclose()
        proxy.stop()


async def test_a_probe_answers_while_the_store_is_reachable(cuttable: Cuttable) -> None:
    backends, _ = cuttable
    # Given a bundle over a reachable store, used already
    await backends.liveness.register("node-x", "inc-1", LONG)
    # When it probes, several times
    for _ in range(3):
        # Then every probe answers
        assert await backends.liveness.probe() is None


async def test_a_probe_fails_while_the_path_is_cut(cuttable: Cuttable) -> None:
    backends, cut = cuttable
    # Given a bundle whose probe answered
    await backends.liveness.probe()
    # When its path to the store is cut (no answer comes)
    cut()
    # Then a probe fails instead of answering (Redis: within its socket timeout)
    with pytest.raises(Exception):  # noqa: B017 (the backend's own error, per the protocol)
        await backends.liveness.probe()


async def test_probes_renew_nothing(backends: Backends, wait_until: Any) -> None:
    # Given an incarnation with a short liveness holding a session
    await backends.liveness.register("node-x", "inc-1", SHORT)
    lease = await backends.leases.acquire("s1", "node-x")
    assert isinstance(lease, Lease), lease

    # When only probes go out, past its liveness
    async def expired() -> bool:
        await backends.liveness.probe()
        return await backends.leases.current("s1") is None

    # Then the incarnation runs out all the same and its lease is free (a probe proves the
    # path; only a renewal vouches for the holder)
    await wait_until(expired)
    assert not await backends.liveness.renew("node-x", "inc-1", LONG, LONG)
