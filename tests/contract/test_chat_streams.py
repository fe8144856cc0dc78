"""Contract: the turn each chat last started (the AI SDK routes' resumable stream), on every
backend."""

from __future__ import annotations

from stickless.backends.base import Backends


async def test_the_last_started_turn_is_current(backends: Backends) -> None:
    assert await backends.chat_streams.current("s1") is None
    await backends.chat_streams.started("s1", "t-1")
    await backends.chat_streams.started("s1", "t-1")  # repeated: same effect
    assert await backends.chat_streams.current("s1") == "t-1"
    await backends.chat_streams.started("s1", "t-2")
    assert await backends.chat_streams.current("s1") == "t-2"
    assert await backends.chat_streams.current("s2") is None
