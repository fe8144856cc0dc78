"""Helpers of the Redis store tests: a bundle over the session's redis-server, and envelopes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

from stickless import UserInput
from stickless.wire import Envelope

if TYPE_CHECKING:
    from stickless.backends.redis import RedisBackends

#: The namespace of `bundle`.
NS = "t"
LONG = 60.0
DAY = 86400.0


@pytest.fixture
async def bundle(redis_url: str) -> AsyncIterator[RedisBackends]:
    """A bundle over the flushed session server (registered in conftest.py), with node-a and
    node-b alive (see `tests.liveness`)."""
    from stickless.backends.redis import RedisBackends
    from tests.liveness import live

    backends = RedisBackends.from_url(redis_url, namespace=NS, event_log_max_len=100)
    for holder in ("node-a", "node-b"):
        await live(backends, holder)
    yield backends
    await backends.aclose()


def envelope(turn_id: str, session_id: str = "s1", **extra: Any) -> Envelope:
    return Envelope(
        session_id=session_id,
        turn_id=turn_id,
        agent_ref="agent-a",
        input=UserInput.text(f"input of {turn_id}"),
        key=f"key-{turn_id}",
        **extra,
    )
