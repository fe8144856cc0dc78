"""Relay batching over a real Redis: one batch is one script call that logs and publishes it,
frames emitted while a call is in flight go in the next call, a subscriber on another router
gets every frame in order and resumes by event id, and a call rerun after a lost reply
duplicates nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from stickless import (
    DeploymentMode,
    Event,
    RouterConfig,
    SessionRouter,
    TextDelta,
    TurnContext,
    TurnOutput,
)
from stickless._events import is_terminal
from stickless.backends.redis import RedisBackends
from stickless.wire import Signal, frames_from_payload

from .agents import req
from .conftest import FAST
from .faults import FaultProxy
from .faults.fixtures import fault_proxy_fixture  # noqa: F401  (fixture `fault_proxy`)

TIMEOUT = 10.0


class Streamer:
    """An agent that emits `count` text frames per turn; with `pause`, it emits one frame,
    waits for `pause`, emits the rest, sets `emitted` and waits for `finish`."""

    def __init__(self, count: int, pause: asyncio.Event | None = None) -> None:
        self.count = count
        self.pause = pause
        self.emitted = asyncio.Event()
        self.finish = asyncio.Event()

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        text = turn.input.as_text()
        start = 0
        if self.pause is not None:
            turn.emit(TextDelta(text=f"{text} 0"))
            start = 1
            await self.pause.wait()
        for n in range(start, self.count):
            turn.emit(TextDelta(text=f"{text} {n}"))
            if self.pause is None and n % 50 == 49:
                await asyncio.sleep(0)  # let the loop run, as a streaming agent does
        self.emitted.set()
        if self.pause is not None:
            await self.finish.wait()
        return TurnOutput(text="done")

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


Start = Callable[..., Any]


@pytest.fixture
async def start(redis_url: str) -> AsyncIterator[Start]:
    """`await start(url, agent)`: a started router over Redis at `url` (shared namespace) whose
    sessions run `agent`; all closed after the test."""
    namespace = f"rb{uuid.uuid4().hex[:8]}"
    routers: list[SessionRouter] = []

    async def make(url: str, agent: Streamer | None = None) -> SessionRouter:
        config = RouterConfig(node_id=f"n{len(routers)}", mode=DeploymentMode.DISTRIBUTED, **FAST)
        backends = RedisBackends.from_url(url, namespace=namespace)
        chosen = agent or Streamer(1)
        router = SessionRouter.build(
            config=config, session_factory=lambda s, a: chosen, backends=backends
        )
        await router.start()
        routers.append(router)
        return router

    yield make
    for router in routers:
        await router.aclose(grace=0.5)
        await router.backends.aclose()


class ChannelReader:
    """A raw pub/sub reader of one session's event channel: the EVENT messages as sent."""

    def __init__(self, backends: RedisBackends, session_id: str) -> None:
        self._pubsub = backends.client.pubsub()
        self._channel = backends.keys.event_channel(session_id)

    async def __aenter__(self) -> ChannelReader:
        await self._pubsub.subscribe(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    async def until_terminal(self) -> list[list[Event]]:
        """The frames of each message, in order, up to the one carrying a terminal frame."""
        messages: list[list[Event]] = []
        async with asyncio.timeout(TIMEOUT):
            while not messages or not any(is_terminal(f) for f in messages[-1]):
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is not None and message["type"] == "message":
                    frames, unreadable = frames_from_payload(Signal.decode(message["data"]).payload)
                    assert unreadable == 0
                    messages.append(frames)
        return messages


async def _read_turn(router: SessionRouter, session_id: str, after: str | None) -> list[Event]:
    """Frames of `router.events(session_id, after=...)` up to the first terminal frame."""
    frames: list[Event] = []
    async with asyncio.timeout(TIMEOUT), router.events(session_id, after=after) as stream:
        async for frame in stream:
            frames.append(frame)
            if is_terminal(frame):
                break
    return frames


def _relay_calls(proxy: FaultProxy) -> int:
    """Relay scripts clients sent through the proxy so far, less those the server refused with
    NOSCRIPT (which did not run). Counted as they are sent, so a call whose reply is still on
    its way back counts already (its PUBLISH may have been read before)."""
    return proxy.script_counts()["events_relay"] - proxy.noscript_replies()["events_relay"]


def _texts(frames: list[Event]) -> list[str]:
    return [f.text for f in frames if isinstance(f, TextDelta)]


async def test_one_batch_is_one_script_call(fault_proxy: FaultProxy, redis_url: str) -> None:
    node = RedisBackends.from_url(fault_proxy.url(), namespace="t")
    try:
        frames = [TextDelta(session_id="s1", turn_id="t1", seq=n, text="x") for n in range(50)]
        # When a batch of 50 frames is relayed
        ids = await node.append_and_publish("s1", "node-a", "b1", frames)
    finally:
        await node.aclose()
    # Then one script ran it (a flushed server first answers NOSCRIPT: loaded, sent again),
    # and no client sent an XADD or a PUBLISH of its own
    assert len(ids) == 50
    assert fault_proxy.script_runs() == {"events_relay": 1}
    counts = fault_proxy.command_counts()
    assert counts["XADD"] == counts["PUBLISH"] == 0
    assert counts["EVALSHA"] == 1 + fault_proxy.noscript_replies()["events_relay"]


async def test_a_turn_relays_each_batch_in_one_call(
    start: Start, fault_proxy: FaultProxy, redis_url: str
) -> None:
    # Given a holder over the proxy whose agent emits 30 frames at once, and a raw reader of
    # the session's event channel
    holder = await start(fault_proxy.url(), Streamer(30))
    async with ChannelReader(holder.backends, "s1") as reader:  # type: ignore[arg-type]
        before = _relay_calls(fault_proxy)
        # When a turn runs
        disposition = await holder.submit(req("s1", "go"))
        messages = await reader.until_terminal()
        assert (await disposition.result).text == "done"
    # Then every message on the channel came from one relay script run or, the last one with
    # the terminal frame, from the turn's finish, none from a plain append or publish, and the
    # 30 frames emitted at once went out in one message
    assert _relay_calls(fault_proxy) - before + 1 == len(messages)
    assert fault_proxy.script_runs()["turn_finish"] == 1
    assert is_terminal(messages[-1][-1])
    assert fault_proxy.script_counts()["events_append"] == 0
    assert max(len(_texts(m)) for m in messages) == 30
    assert [f.seq for m in messages for f in m] == list(range(1, 33))


async def test_frames_emitted_while_a_call_is_in_flight_go_in_one_following_call(
    start: Start, fault_proxy: FaultProxy
) -> None:
    pause = asyncio.Event()
    agent = Streamer(21, pause)
    holder = await start(fault_proxy.url(), agent)
    async with ChannelReader(holder.backends, "s1") as reader:  # type: ignore[arg-type]
        # Given the first relay call of a turn is held on its way back from Redis
        hold = fault_proxy.hold_reply(script="events_relay", seconds=None)
        disposition = await holder.submit(req("s1", "go"))
        await hold.wait_fired()
        # When the agent emits 20 more frames while that call is in flight
        pause.set()
        await agent.emitted.wait()
        runs = _relay_calls(fault_proxy)
        hold.release()
        agent.finish.set()
        messages = await reader.until_terminal()
        assert (await disposition.result).text == "done"
    # Then the producer never waited (it emitted them all during the call, which was the only
    # one sent), and the next call carried all 20 frames (after what else was queued)
    assert runs == 1
    assert _texts(messages[1])[-20:] == [f"go {n}" for n in range(1, 21)]
    assert _texts(messages[0] + messages[1]) == [f"go {n}" for n in range(21)]
    assert [f.seq for m in messages for f in m] == list(range(1, 24))


async def test_a_subscriber_on_another_router_gets_every_frame_in_order_and_resumes(
    start: Start, redis_url: str
) -> None:
    holder = await start(redis_url, Streamer(500))
    subscriber = await start(redis_url)
    # Given a live subscriber on another router
    stream = subscriber.events("s1")
    await stream.ready()
    # When two turns of 500 frames each run back to back on the holder
    first = await holder.submit(req("s1", "one"))
    second = await holder.submit(req("s1", "two"))
    live: list[Event] = []
    async with asyncio.timeout(TIMEOUT):
        async for frame in stream:
            live.append(frame)
            if is_terminal(frame) and frame.turn_id == second.turn_id:
                break
    await stream.aclose()
    await first.result
    await second.result
    # Then it got every frame of both turns, in turn order, each once, with increasing ids
    assert [f.turn_id for f in live] == [first.turn_id] * 502 + [second.turn_id] * 502
    assert _texts(live) == [f"one {n}" for n in range(500)] + [f"two {n}" for n in range(500)]
    ids = [f.event_id for f in live]
    assert None not in ids
    keys = [tuple(map(int, str(i).split("-"))) for i in ids]
    assert keys == sorted(set(keys))
    # ...and a reader resuming after any of those ids gets exactly the frames after it
    resumed = await _read_turn(subscriber, "s1", ids[700])
    assert [f.event_id for f in resumed] == ids[701:]


async def test_a_relay_call_rerun_after_a_lost_reply_duplicates_nothing(
    start: Start, fault_proxy: FaultProxy, redis_url: str
) -> None:
    holder = await start(fault_proxy.url(), Streamer(200))
    subscriber = await start(redis_url)
    stream = subscriber.events("s1")
    await stream.ready()
    async with ChannelReader(subscriber.backends, "s1") as reader:  # type: ignore[arg-type]
        # Given the holder's connection is cut right after Redis ran its first relay script
        # of the turn (redis-py sends the very same call again on a new connection)
        cut = fault_proxy.cut_after(script="events_relay")
        disposition = await holder.submit(req("s1", "go"))
        live: list[Event] = []
        async with asyncio.timeout(TIMEOUT):
            async for frame in stream:
                live.append(frame)
                if is_terminal(frame):
                    break
        await stream.aclose()
        messages = await reader.until_terminal()
    assert (await disposition.result).text == "done"
    assert cut.count == 1
    # Then the script ran once more than there were relay batches (the last batch went with
    # the finish), yet the channel carried each batch once, and the log and the live
    # subscriber hold every frame exactly once, in order
    assert _relay_calls(fault_proxy) == len(messages) - 1 + 1
    expected = [f"go {n}" for n in range(200)]
    logged = await subscriber.backends.events.read("s1", None, 1000)
    assert [f.seq for f in logged] == list(range(1, 203))
    assert _texts(logged) == expected
    assert [f.event_id for f in live] == [f.event_id for f in logged]
    # ...and a reader resuming from the first frame gets each later frame once
    resumed = await _read_turn(subscriber, "s1", logged[0].event_id)
    assert [f.event_id for f in resumed] == [f.event_id for f in logged[1:]]
