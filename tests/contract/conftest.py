"""Fixtures of the storage contract suites: one parametrized bundle per backend under test.

Adding a backend is one more name in `BACKENDS` and one more branch in `_build`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from stickless._types import Priority
from stickless.backends.base import Backends
from stickless.backends.memory import (
    MemoryBackends,
    MemoryDeadLetterStore,
    MemoryInbox,
    MemorySignalBus,
)
from tests.liveness import live

T = TypeVar("T")

BACKENDS = ["memory", "redis"]

#: Event-log bound the contract bundles are built with (small, so trimming is testable).
EVENT_LOG_MAX_LEN = 50

PlantRaw = Callable[[str, Priority, bytes], Awaitable[str]]
PublishRaw = Callable[[bytes, str | None], Awaitable[None]]
PlantLetter = Callable[[str, str, bytes], Awaitable[None]]


def _build(name: str, request: pytest.FixtureRequest) -> Backends:
    """Build only the selected backend (so a missing redis-server affects only redis cases)."""
    if name == "memory":
        return MemoryBackends(max_len=EVENT_LOG_MAX_LEN)
    if name == "redis":
        from stickless.backends.redis import RedisBackends

        url = request.getfixturevalue("redis_url")
        return RedisBackends.from_url(
            url, namespace="contract", event_log_max_len=EVENT_LOG_MAX_LEN
        )
    raise LookupError(f"no contract builder for backend {name!r}")


#: Holders the contract tests act as, alive (see `tests.liveness`) unless a test ends one.
HOLDERS = ("node-a", "node-b", "node-c", "node-dead", "node-alive")


@pytest.fixture(params=BACKENDS)
async def backends(request: pytest.FixtureRequest) -> AsyncIterator[Backends]:
    """A fresh, empty bundle of the selected backend with `HOLDERS` alive, closed after the
    test."""
    bundle = _build(request.param, request)
    for holder in HOLDERS:
        await live(bundle, holder)
    yield bundle
    await bundle.aclose()


@pytest.fixture
def event_log_max_len() -> int:
    """The per-session event-log bound of the `backends` bundle."""
    return EVENT_LOG_MAX_LEN


@pytest.fixture
def plant_raw(backends: Backends) -> PlantRaw:
    """Append arbitrary bytes to a session's inbox tier (to plant corrupt entries)."""
    inbox = backends.inbox
    if isinstance(inbox, MemoryInbox):
        return inbox.deliver_raw
    if type(inbox).__name__ == "RedisInbox":
        from stickless.backends.redis import RedisInbox

        assert isinstance(inbox, RedisInbox)
        return inbox.deliver_raw
    raise LookupError(f"no raw inbox writer for {type(inbox).__name__}")


@pytest.fixture
def plant_letter(backends: Backends) -> PlantLetter:
    """Store arbitrary bytes as a session's dead letter (to plant corrupt ones)."""
    store = backends.dead_letters
    if isinstance(store, MemoryDeadLetterStore):
        return store.plant_raw
    if type(store).__name__ == "RedisDeadLetterStore":
        from stickless.backends.redis import RedisDeadLetterStore

        assert isinstance(store, RedisDeadLetterStore)
        return store.plant_raw
    raise LookupError(f"no raw dead-letter writer for {type(store).__name__}")


@pytest.fixture
def publish_raw(backends: Backends) -> PublishRaw:
    """Send arbitrary bytes on the control channel (session None) or a session's event channel."""
    bus = backends.signals
    if isinstance(bus, MemorySignalBus):
        return bus.publish_raw
    if type(bus).__name__ == "RedisSignalBus":
        from stickless.backends.redis import RedisSignalBus

        assert isinstance(bus, RedisSignalBus)
        return bus.publish_raw
    raise LookupError(f"no raw signal publisher for {type(bus).__name__}")


@pytest.fixture
def wait_until() -> Callable[..., Awaitable[Any]]:
    """Poll an async probe until it returns something truthy (bounded; fails the test if not)."""

    async def poll(probe: Callable[[], Awaitable[T | None]], within: float = 5.0) -> T:
        deadline = time.monotonic() + within
        while True:
            value = await probe()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"condition not met within {within} s")
            await asyncio.sleep(0.02)

    return poll
