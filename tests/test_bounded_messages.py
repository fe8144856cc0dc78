"""Bounded messages over a real Redis with its default pub/sub output-buffer limit (32 MiB
hard): a turn streaming tens of megabytes reaches a subscriber on another node in full, in
relay batches of at most `max_relay_batch_bytes`, and no node's pub/sub connection is closed
(an unbounded batch is one PUBLISH over the limit: Redis closes every subscribed connection)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from stickless import (
    DeploymentMode,
    Event,
    RouterConfig,
    SessionRouter,
    TextDelta,
    TurnCompleted,
    TurnContext,
    TurnOutput,
    TurnStarted,
)
from stickless._events import is_terminal
from stickless.backends.redis import RedisBackends
from stickless.wire import Signal, frames_from_payload

from .agents import req
from .conftest import FAST

#: Guards a hang only (the pytest timeout is 60 s): a run takes a few seconds.
TIMEOUT = 30.0
#: Redis's default limit for pub/sub clients, which the test server must keep.
DEFAULT_PUBSUB_LIMIT = ["pubsub", "33554432", "8388608", "60"]
BATCH_BYTES = 1024 * 1024


class Flood:
    """An agent that emits the given deltas, letting the loop run every 50 of them."""

    def __init__(self, deltas: list[str]) -> None:
        self.deltas = deltas

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        for n, text in enumerate(self.deltas):
            turn.emit(TextDelta(text=text))
            if n % 50 == 49:
                await asyncio.sleep(0)
        return TurnOutput(text="done")

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


Start = Callable[..., Any]


@pytest.fixture
async def start(redis_url: str) -> AsyncIterator[Start]:
    """`await start(agent)`: a started router over the test Redis (shared namespace) whose
    sessions run `agent`; all closed after the test."""
    namespace = f"bm{uuid.uuid4().hex[:8]}"
    routers: list[SessionRouter] = []

    async def make(agent: Flood) -> SessionRouter:
        config = RouterConfig(node_id=f"n{len(routers)}", mode=DeploymentMode.DISTRIBUTED, **FAST)
        backends = RedisBackends.from_url(redis_url, namespace=namespace)
        router = SessionRouter.build(
            config=config, session_factory=lambda s, a: agent, backends=backends
        )
        await router.start()
        routers.append(router)
        return router

    yield make
    for router in routers:
        await router.aclose(grace=0.5)
        await router.backends.aclose()


class ChannelSizes:
    """A raw reader of one session's event channel: the size of each EVENT message sent."""

    def __init__(self, backends: RedisBackends, session_id: str) -> None:
        self._pubsub = backends.client.pubsub()
        self._channel = backends.keys.event_channel(session_id)
        self.sizes: list[int] = []

    async def __aenter__(self) -> ChannelSizes:
        await self._pubsub.subscribe(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    async def until_terminal(self) -> None:
        """Read messages up to the one carrying a terminal frame."""
        while True:
            message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            if message is None or message["type"] != "message":
                continue
            self.sizes.append(len(message["data"]))
            frames, _ = frames_from_payload(Signal.decode(message["data"]).payload)
            if any(is_terminal(frame) for frame in frames):
                return


async def _pubsub_ids(client: Redis) -> set[str]:
    """The ids of every pub/sub connection the server has open."""
    return {str(entry["id"]) for entry in await client.client_list(_type="pubsub")}


async def _stream_from_another_node(start: Start, deltas: list[str]) -> None:
    """Run a turn emitting `deltas` on one node while another node streams it; check the
    stream is whole, the batches bounded and no pub/sub connection closed."""
    holder = await start(Flood(deltas))
    subscriber = await start(Flood([]))
    client: Redis = holder.backends.client  # type: ignore[attr-defined]
    # (the fault needs Redis's default limit: the fixture's server must not raise it)
    limit = (await client.config_get("client-output-buffer-limit"))["client-output-buffer-limit"]
    assert limit.split()[-4:] == DEFAULT_PUBSUB_LIMIT
    stream = subscriber.events("s1")
    await stream.ready()
    async with ChannelSizes(holder.backends, "s1") as channel:  # type: ignore[arg-type]
        connected = await _pubsub_ids(client)
        assert len(connected) >= 3  # both nodes' readers and the raw reader
        # When the holder runs the turn
        reading = asyncio.ensure_future(channel.until_terminal())
        disposition = await holder.submit(req("s1", "go"))
        frames: list[Event] = []
        try:
            async with asyncio.timeout(TIMEOUT):
                async for frame in stream:
                    frames.append(frame)
                    if is_terminal(frame):
                        break
                await reading
        finally:
            reading.cancel()
        await stream.aclose()
        assert (await disposition.result).text == "done"
        # Then no pub/sub connection was closed (none of them was replaced by a new one)
        assert connected <= await _pubsub_ids(client)
    # ...every message on the channel was within the bound
    assert max(channel.sizes) <= BATCH_BYTES
    # ...and the subscriber on the other node got the turn whole: its start, the text as
    # emitted, its terminal frame, in seq order
    assert isinstance(frames[0], TurnStarted)
    assert isinstance(frames[-1], TurnCompleted)
    texts = frames[1:-1]
    assert all(isinstance(f, TextDelta) for f in texts)
    assert "".join(f.text for f in texts) == "".join(deltas)  # type: ignore[union-attr]
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))


async def test_many_deltas_reach_another_node_in_bounded_batches(start: Start) -> None:
    # Given a turn that emits 3,500 deltas of 10 KB (35 MB, over the 32 MiB limit at once)
    deltas = [f"[{n}]".ljust(10_000, "x") for n in range(3500)]
    await _stream_from_another_node(start, deltas)


async def test_one_huge_delta_reaches_another_node_cut_between_characters(start: Start) -> None:
    # Given a turn that emits one 40 MB delta, with a 3-byte character every 100 bytes (so
    # the cuts fall next to, or inside, multi-byte characters)
    delta = ("x" * 97 + "\u20ac") * 400_000
    await _stream_from_another_node(start, [delta])
