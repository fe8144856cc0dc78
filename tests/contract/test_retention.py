"""EventLog retention contract: a log expires whole `event_log_ttl` after its last append or
delete, on every backend (a short TTL and real time, so both stores use their own clocks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from stickless._errors import EventCursorTrimmedError
from stickless._events import Event, TextDelta
from stickless.backends.base import Backends
from stickless.backends.memory import MemoryBackends

from .conftest import BACKENDS

TTL = 1.0


@pytest.fixture(params=BACKENDS)
async def short_lived(request: pytest.FixtureRequest) -> AsyncIterator[Backends]:
    """A bundle whose event logs live TTL seconds after their last write."""
    bundle: Backends
    if request.param == "memory":
        bundle = MemoryBackends(max_len=50, event_log_ttl=TTL)
    else:
        from stickless.backends.redis import RedisBackends

        url = request.getfixturevalue("redis_url")
        bundle = RedisBackends.from_url(
            url, namespace="retention", event_log_max_len=50, event_log_ttl=TTL
        )
    yield bundle
    await bundle.aclose()


def _frames(count: int) -> list[Event]:
    return [TextDelta(session_id="s1", turn_id="t1", seq=n, text="x") for n in range(count)]


async def test_log_expires_whole_after_its_last_append(short_lived: Backends) -> None:
    # Given a log written twice, the second time just before the first write would expire
    await short_lived.events.append("s1", _frames(2))
    await asyncio.sleep(TTL * 0.6)
    ids = await short_lived.events.append("s1", _frames(1))
    await asyncio.sleep(TTL * 0.6)
    # Then it is still there (the second append refreshed it)
    assert len(await short_lived.events.read("s1", None, 100)) == 3
    # When no append comes for longer than the TTL
    await asyncio.sleep(TTL * 1.5)
    # Then the whole log is gone: reads from the start are empty, and a cursor into it is
    # reported, not answered with a silently empty page
    assert await short_lived.events.read("s1", None, 100) == []
    with pytest.raises(EventCursorTrimmedError) as raised:
        await short_lived.events.read("s1", ids[-1], 100)
    assert raised.value.last_id is None


async def test_deleted_log_tombstone_expires_too(short_lived: Backends) -> None:
    # Given a deleted log (its tombstone keeps the last id)
    ids = await short_lived.events.append("s1", _frames(2))
    await short_lived.events.delete("s1")
    assert await short_lived.events.read("s1", ids[-1], 100) == []
    # When the TTL passes without a write
    await asyncio.sleep(TTL * 1.5)
    # Then the tombstone is gone as well
    with pytest.raises(EventCursorTrimmedError) as raised:
        await short_lived.events.read("s1", ids[-1], 100)
    assert raised.value.last_id is None
