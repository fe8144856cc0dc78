"""EventRelayPath contract: one call logs a relay batch and publishes it as one EVENT signal
whose frames carry their ids; a repeated batch id logs and publishes nothing more."""

from __future__ import annotations

import asyncio

import pytest

from stickless._events import Event, TextDelta, TurnCompleted
from stickless.backends.base import RELAY_BATCH_WINDOW, Backends
from stickless.wire import Signal, SignalKind, frames_from_payload

TIMEOUT = 5.0


class Recorder:
    """An event-channel handler that queues what it receives, for the test to await."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[Signal] = asyncio.Queue()

    async def __call__(self, signal: Signal) -> None:
        await self.received.put(signal)

    async def next(self) -> Signal:
        return await asyncio.wait_for(self.received.get(), TIMEOUT)


def _frames(count: int, turn_id: str = "t1", session_id: str = "s1") -> list[Event]:
    return [
        TextDelta(session_id=session_id, turn_id=turn_id, seq=n, text=f"chunk {n}")
        for n in range(1, count + 1)
    ]


def _signal_frames(signal: Signal) -> list[Event]:
    frames, unreadable = frames_from_payload(signal.payload)
    assert unreadable == 0
    return frames


async def test_one_call_logs_the_batch_and_publishes_it_as_one_signal(
    backends: Backends,
) -> None:
    # Given a subscriber on s1's event channel
    events = Recorder()
    await backends.signals.subscribe_events("s1", events)
    batch = [*_frames(5), TurnCompleted(session_id="s1", turn_id="t1", seq=6, text="done")]
    # When a relay batch is logged and published in one call
    ids = await backends.append_and_publish("s1", "node-a", "b1", batch)
    # Then the log holds the frames under the returned ids
    logged = await backends.events.read("s1", None, 100)
    assert [e.event_id for e in logged] == ids and len(ids) == len(batch)
    assert [e.model_copy(update={"event_id": None}) for e in logged] == batch
    # ...and one EVENT signal from the caller carries all of them, in order, with their ids
    signal = await events.next()
    assert (signal.kind, signal.session_id, signal.origin) == (SignalKind.EVENT, "s1", "node-a")
    assert _signal_frames(signal) == logged


async def test_a_repeated_batch_id_logs_and_publishes_nothing_more(backends: Backends) -> None:
    # Given a batch logged and published, then as many other batches as the window keeps
    # besides it
    events = Recorder()
    await backends.signals.subscribe_events("s1", events)
    first = await backends.append_and_publish("s1", "node-a", "b-first", _frames(3))
    others: list[str] = []
    for n in range(RELAY_BATCH_WINDOW - 1):
        others += await backends.append_and_publish("s1", "node-a", f"b{n}", _frames(1, f"t{n}"))
    # When the first call is made again (a rerun after a lost reply)
    again = await backends.append_and_publish("s1", "node-a", "b-first", _frames(3))
    marker = await backends.append_and_publish("s1", "node-a", "b-marker", _frames(1, "tm"))
    # Then it answers the first call's ids, and neither the log nor the channel got it twice
    assert again == first
    assert [e.event_id for e in await backends.events.read("s1", None, 100)] == [
        *first,
        *others,
        *marker,
    ]
    published = [await events.next() for _ in range(RELAY_BATCH_WINDOW + 1)]
    assert [e.event_id for s in published for e in _signal_frames(s)] == [
        *first,
        *others,
        *marker,
    ]


async def test_relay_batches_follow_the_event_log_rules(
    backends: Backends, event_log_max_len: int
) -> None:
    # Given frames appended plainly and in relay batches, past the log's bound
    ids = await backends.events.append("s1", _frames(2, "t0"))
    for n in range(event_log_max_len // 10 + 1):
        ids += await backends.append_and_publish("s1", "node-a", f"b{n}", _frames(10, f"t{n}"))
    ids += await backends.events.append("s1", _frames(1, "tz"))
    # Then ids strictly increase across both kinds of call, the log keeps exactly its newest
    # `max_len` frames, and a resume from a kept id reads on from it
    keys = [tuple(map(int, i.split("-"))) for i in ids]
    assert keys == sorted(set(keys))
    kept = [e.event_id for e in await backends.events.read("s1", None, 1000)]
    assert kept == ids[-event_log_max_len:]
    resumed = await backends.events.read("s1", ids[-5], 1000)
    assert [e.event_id for e in resumed] == ids[-4:]


async def test_sessions_and_empty_batches(backends: Backends) -> None:
    # Given subscribers of two sessions
    s1, s2 = Recorder(), Recorder()
    await backends.signals.subscribe_events("s1", s1)
    await backends.signals.subscribe_events("s2", s2)
    # When an empty batch and a batch of s2 are relayed
    assert await backends.append_and_publish("s1", "node-a", "b-empty", []) == []
    ids = await backends.append_and_publish("s2", "node-a", "b1", _frames(2, session_id="s2"))
    marker = await backends.append_and_publish("s1", "node-a", "b-marker", _frames(1, "tm"))
    # Then only s2's log and channel got anything; an empty batch is nothing at all (the
    # first thing s1's channel carries is the marker relayed after it)
    assert [e.event_id for e in _signal_frames(await s2.next())] == ids
    assert [e.event_id for e in _signal_frames(await s1.next())] == marker
    assert [e.event_id for e in await backends.events.read("s1", None, 10)] == marker


@pytest.mark.parametrize("batch_id", ["", "a b", "a\nb"])
async def test_a_batch_id_must_be_one_token(backends: Backends, batch_id: str) -> None:
    with pytest.raises(ValueError, match="batch id"):
        await backends.append_and_publish("s1", "node-a", batch_id, _frames(1))
    assert await backends.events.read("s1", None, 10) == []
