"""SignalBus contract: control vs per-session event channels, ordered, resilient delivery."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from stickless.backends.base import Backends
from stickless.wire import Signal, SignalKind

PublishRaw = Callable[[bytes, str | None], Awaitable[None]]

TIMEOUT = 5.0


class Recorder:
    """A signal handler that queues what it receives, for the test to await."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[Signal] = asyncio.Queue()

    async def __call__(self, signal: Signal) -> None:
        await self.received.put(signal)

    async def next(self) -> Signal:
        return await asyncio.wait_for(self.received.get(), TIMEOUT)

    async def until(self, marker: Signal) -> list[Signal]:
        """Everything received up to and including `marker`."""
        seen: list[Signal] = []
        while not seen or seen[-1] != marker:
            seen.append(await self.next())
        return seen


def _signal(kind: SignalKind, session_id: str = "s1", **payload: object) -> Signal:
    return Signal(kind=kind, session_id=session_id, origin="node-a", payload=payload)


async def test_control_and_event_channels_are_split(backends: Backends) -> None:
    # Given a control subscriber and an event subscriber for s1
    control, events = Recorder(), Recorder()
    await backends.signals.subscribe(control)
    await backends.signals.subscribe_events("s1", events)
    # When control signals and event frames of two sessions are published
    interrupt = _signal(SignalKind.INTERRUPT, reason="USER")
    doorbell = _signal(SignalKind.MESSAGE_ENQUEUED, "s2")
    s1_event = _signal(SignalKind.EVENT, seq=1)
    s1_marker = _signal(SignalKind.EVENT, seq=2)
    control_marker = _signal(SignalKind.STATUS, "s2", marker=True)
    for signal in [
        s1_event,
        _signal(SignalKind.EVENT, "s2", seq=1),
        interrupt,
        doorbell,
        s1_marker,
        control_marker,
    ]:
        await backends.signals.publish(signal)
    # Then the control subscriber saw only the control signals, and the event subscriber
    # only s1's frames
    assert await control.until(control_marker) == [interrupt, doorbell, control_marker]
    assert await events.until(s1_marker) == [s1_event, s1_marker]


async def test_many_signals_arrive_in_publish_order(backends: Backends) -> None:
    # Given a control subscriber
    control = Recorder()
    await backends.signals.subscribe(control)
    # When 50 signals are published one by one and 50 more in one batch
    singles = [_signal(SignalKind.STATUS, n=n) for n in range(50)]
    batch = [_signal(SignalKind.STATUS, n=n) for n in range(50, 100)]
    for signal in singles:
        await backends.signals.publish(signal)
    await backends.signals.publish_many(batch)
    # Then all 100 arrive, in publish order
    received = [await control.next() for _ in range(100)]
    assert [s.payload["n"] for s in received] == list(range(100))


async def test_event_frames_of_a_session_arrive_in_order(backends: Backends) -> None:
    # Given an event subscriber for s1
    events = Recorder()
    await backends.signals.subscribe_events("s1", events)
    # When a turn's frames are published in one batch
    frames = [_signal(SignalKind.EVENT, seq=n) for n in range(30)]
    await backends.signals.publish_many(frames)
    # Then they arrive in order
    assert [await events.next() for _ in frames] == frames


async def test_raising_handler_keeps_its_subscription(backends: Backends) -> None:
    # Given a handler that fails on its first signal
    received: asyncio.Queue[Signal] = asyncio.Queue()
    calls = 0

    async def flaky(signal: Signal) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("handler bug")
        await received.put(signal)

    await backends.signals.subscribe(flaky)
    # When two signals are published
    await backends.signals.publish(_signal(SignalKind.STATUS, n=1))
    second = _signal(SignalKind.STATUS, n=2)
    await backends.signals.publish(second)
    # Then the second one is still delivered
    assert await asyncio.wait_for(received.get(), TIMEOUT) == second
    assert calls == 2


async def test_undecodable_bytes_are_dropped(backends: Backends, publish_raw: PublishRaw) -> None:
    # Given a control subscriber and an event subscriber for s1
    control, events = Recorder(), Recorder()
    await backends.signals.subscribe(control)
    await backends.signals.subscribe_events("s1", events)
    # When garbage is published on both channels, followed by valid signals
    await publish_raw(b"\xc1 garbage", None)
    await publish_raw(b"\x93\x01\x02\x03", "s1")
    good_control = _signal(SignalKind.INTERRUPT, reason="USER")
    good_event = _signal(SignalKind.EVENT, seq=1)
    await backends.signals.publish(good_control)
    await backends.signals.publish(good_event)
    # Then each subscriber's first delivery is the valid signal
    assert await control.next() == good_control
    assert await events.next() == good_event


async def test_closed_subscription_stops_delivery(backends: Backends) -> None:
    # Given two control subscribers, one of which is closed
    closed, open_ = Recorder(), Recorder()
    subscription = await backends.signals.subscribe(closed)
    await backends.signals.subscribe(open_)
    await subscription.close()
    # When a signal is published
    signal = _signal(SignalKind.EVICT, token=3)
    await backends.signals.publish(signal)
    # Then the open subscriber gets it and the closed one never does
    assert await open_.next() == signal
    assert closed.received.empty()


async def test_unsubscribe_events_stops_that_session_only(backends: Backends) -> None:
    # Given event subscribers for s1 and s2, then s1 unsubscribed
    s1, s2 = Recorder(), Recorder()
    await backends.signals.subscribe_events("s1", s1)
    await backends.signals.subscribe_events("s2", s2)
    await backends.signals.unsubscribe_events("s1")
    # When frames of both sessions are published
    await backends.signals.publish(_signal(SignalKind.EVENT, "s1", seq=1))
    marker = _signal(SignalKind.EVENT, "s2", seq=1)
    await backends.signals.publish(marker)
    # Then only s2's subscriber receives
    assert await s2.next() == marker
    assert s1.received.empty()


async def test_subscribe_events_replaces_the_previous_handler(backends: Backends) -> None:
    # Given an event handler for s1 replaced by another
    old, new = Recorder(), Recorder()
    await backends.signals.subscribe_events("s1", old)
    await backends.signals.subscribe_events("s1", new)
    # When a frame of s1 is published
    frame = _signal(SignalKind.EVENT, seq=1)
    await backends.signals.publish(frame)
    # Then only the new handler receives it
    assert await new.next() == frame
    assert old.received.empty()


async def test_signals_reach_every_connection_including_the_publishers(backends: Backends) -> None:
    # Given subscribers on this bundle and on a second connection to the same data
    other = backends.clone()
    mine, theirs = Recorder(), Recorder()
    await backends.signals.subscribe(mine)
    await other.signals.subscribe(theirs)
    # When this bundle publishes
    signal = _signal(SignalKind.YIELD, purpose="handoff", requester="node-a")
    await backends.signals.publish(signal)
    # Then both receive it
    assert await mine.next() == signal
    assert await theirs.next() == signal
    if other is not backends:
        await other.aclose()
