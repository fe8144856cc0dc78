"""Memory-backend specifics: severable links (crash simulation), store clock, thread safety."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from stickless._errors import BackendUnavailableError
from stickless._events import TextDelta
from stickless._types import Priority, TranscriptEntry, UserInput
from stickless.backends.base import Lease, StagedCommit
from stickless.backends.memory import MemoryBackends
from stickless.wire import Envelope, Outcome, Signal, SignalKind
from tests.liveness import acquire_lease

TIMEOUT = 5.0


class FakeClock:
    """A store clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A signal handler that queues what it receives, noting the loop it ran on."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[Signal] = asyncio.Queue()
        self.loops: set[asyncio.AbstractEventLoop] = set()

    async def __call__(self, signal: Signal) -> None:
        self.loops.add(asyncio.get_running_loop())
        await self.received.put(signal)

    async def next(self) -> Signal:
        return await asyncio.wait_for(self.received.get(), TIMEOUT)


def _envelope(turn_id: str, session_id: str = "s1") -> Envelope:
    return Envelope(
        session_id=session_id,
        turn_id=turn_id,
        agent_ref="agent-a",
        input=UserInput.text("hi"),
        key=f"key-{turn_id}",
    )


def _signal(kind: SignalKind = SignalKind.STATUS, session_id: str = "s1", **payload: Any) -> Signal:
    return Signal(kind=kind, session_id=session_id, origin="node-a", payload=payload)


async def _noop(signal: Signal) -> None:
    """A handler for subscriptions whose deliveries the test does not inspect."""


Operation = Callable[[MemoryBackends], Awaitable[object]]
_LEASE = Lease("s1", "node-a", 1, 0.0)
_OK = Outcome(turn_id="t1", ok=True)

EVERY_OPERATION: dict[str, Operation] = {
    "leases.acquire": lambda b: acquire_lease(b, "s1", "node-a", 1.0),
    "liveness.register": lambda b: b.liveness.register("node-a", "inc", 1.0),
    "liveness.renew": lambda b: b.liveness.renew("node-a", "inc", 1.0, 1.0),
    "liveness.retire": lambda b: b.liveness.retire("node-a"),
    "liveness.dead_holders": lambda b: b.liveness.dead_holders(10),
    "liveness.forget": lambda b: b.liveness.forget("node-a"),
    "leases.release": lambda b: b.leases.release(_LEASE),
    "leases.current": lambda b: b.leases.current("s1"),
    "records.load": lambda b: b.records.load("s1"),
    "records.provision": lambda b: b.records.provision("s1", "agent-a", 1),
    "hotpath.finish with a commit": lambda b: b.hotpath.finish(
        "s1",
        "k1",
        "node-a",
        Outcome(turn_id="t1", ok=True),
        1.0,
        StagedCommit(1, (TranscriptEntry(role="user", content="x"),)),
    ),
    "records.delete": lambda b: b.records.delete("s1"),
    "inbox.deliver": lambda b: b.inbox.deliver(_envelope("t1")),
    "inbox.collect": lambda b: b.inbox.collect("s1", Priority.LATER, 1),
    "inbox.is_empty": lambda b: b.inbox.is_empty("s1"),
    "inbox.purge": lambda b: b.inbox.purge("s1"),
    "inbox.pending_sessions": lambda b: b.inbox.pending_sessions(0.0),
    "signals.publish": lambda b: b.signals.publish(_signal()),
    "signals.publish_many": lambda b: b.signals.publish_many([_signal()]),
    "signals.subscribe": lambda b: b.signals.subscribe(_noop),
    "signals.subscribe_events": lambda b: b.signals.subscribe_events("s1", _noop),
    "signals.unsubscribe_events": lambda b: b.signals.unsubscribe_events("s1"),
    "idempotency.put_if_absent": lambda b: b.idempotency.put_if_absent(
        "s1", "k", "t1", "h", "node-a", 1.0, 1.0
    ),
    "idempotency.acquire_holder": lambda b: b.idempotency.acquire_holder("s1", "k", "t", "n", 1.0),
    "idempotency.release_holder": lambda b: b.idempotency.release_holder("s1", "k", "n", 1.0),
    "hotpath.finish": lambda b: b.hotpath.finish("s1", "k", "n", _OK, 1.0, pending=(1, "m")),
    "idempotency.compare_and_reset": lambda b: b.idempotency.compare_and_reset(
        "s1", "k", None, _OK
    ),
    "idempotency.discard_reservation": lambda b: b.idempotency.discard_reservation("s1", "k", "t1"),
    "idempotency.find_stale_in_flight": lambda b: b.idempotency.find_stale_in_flight(10),
    "idempotency.find": lambda b: b.idempotency.find("s1", "k"),
    "events.append": lambda b: b.events.append("s1", [TextDelta(text="x")]),
    "events.read": lambda b: b.events.read("s1", None, 10),
    "events.delete": lambda b: b.events.delete("s1"),
}


# --------------------------------------------------------------------------- link / sever


@pytest.mark.parametrize("operation", EVERY_OPERATION.values(), ids=EVERY_OPERATION.keys())
async def test_severed_link_refuses_every_operation(operation: Operation) -> None:
    # Given two links over one data set with a provisioned session, one link severed
    shared = MemoryBackends()
    survivor = shared.link()
    await shared.records.provision("s1", "agent-a", 1)
    shared.sever()
    # When the operation runs through the severed link, and through the survivor
    # Then the severed one raises BackendUnavailableError and the survivor works
    with pytest.raises(BackendUnavailableError):
        await operation(shared)
    await operation(survivor)
    assert shared.severed and not survivor.severed
    await survivor.aclose()


async def test_links_share_data_and_survive_a_sibling_sever() -> None:
    # Given node-a's link wrote a lease, a record and a queued message
    node_a = MemoryBackends()
    node_b = node_a.link()
    lease = await acquire_lease(node_a, "s1", "node-a", 30.0)
    assert isinstance(lease, Lease)
    await node_a.records.provision("s1", "agent-a", lease.token)
    await node_a.inbox.deliver(_envelope("t1"))
    # When node-a's link is severed
    node_a.sever()
    # Then node-b still sees and uses all of it
    assert await node_b.leases.current("s1") == lease
    record = await node_b.records.load("s1")
    assert record is not None and record.agent_ref == "agent-a"
    batch = await node_b.inbox.collect("s1", Priority.LATER, 1)
    assert [m.envelope.turn_id for m in batch.messages] == ["t1"]


async def test_severed_subscriptions_stop_delivering() -> None:
    # Given control and event subscribers on two links
    node_a = MemoryBackends()
    node_b = node_a.link()
    a_control, a_events, b_control, b_events = Recorder(), Recorder(), Recorder(), Recorder()
    await node_a.signals.subscribe(a_control)
    await node_a.signals.subscribe_events("s1", a_events)
    await node_b.signals.subscribe(b_control)
    await node_b.signals.subscribe_events("s1", b_events)
    # When node-a is severed and node-b publishes on both channels
    node_a.sever()
    control = _signal(SignalKind.INTERRUPT, reason="USER")
    event = _signal(SignalKind.EVENT, seq=1)
    await node_b.signals.publish_many([control, event])
    # Then node-b's subscribers receive, node-a's never do, and node-a cannot publish
    assert await b_control.next() == control
    assert await b_events.next() == event
    assert a_control.received.empty() and a_events.received.empty()
    with pytest.raises(BackendUnavailableError):
        await node_a.signals.publish(control)
    await node_b.aclose()


async def test_sever_drops_signals_already_queued_for_the_link() -> None:
    # Given a subscriber on node-a whose handler is blocked on its first signal
    node_a = MemoryBackends()
    node_b = node_a.link()
    release = asyncio.Event()
    started: asyncio.Queue[Signal] = asyncio.Queue()
    delivered: list[Signal] = []

    async def blocking(signal: Signal) -> None:
        await started.put(signal)
        delivered.append(signal)
        await release.wait()

    await node_a.signals.subscribe(blocking)
    witness = Recorder()
    await node_b.signals.subscribe(witness)
    await node_b.signals.publish(_signal(n=1))
    await asyncio.wait_for(started.get(), TIMEOUT)
    # When more signals are queued behind it and node-a is severed before it unblocks
    queued = _signal(n=2)
    await node_b.signals.publish(queued)
    assert (await witness.next()).payload["n"] == 1
    assert await witness.next() == queued
    node_a.sever()
    release.set()
    # Then the queued signal is never handed to node-a's handler
    marker = _signal(n=3)
    await node_b.signals.publish(marker)
    assert await witness.next() == marker
    assert [s.payload["n"] for s in delivered] == [1]
    await node_b.aclose()


async def test_clone_is_the_same_bundle_and_is_severed_with_it() -> None:
    # Given a bundle and its clone (for a renewal thread)
    bundle = MemoryBackends()
    clone = bundle.clone()
    # When the bundle is severed
    bundle.sever()
    # Then the clone is the same bundle and is cut too
    assert clone is bundle
    with pytest.raises(BackendUnavailableError):
        await clone.leases.current("s1")


async def test_aclose_closes_only_this_links_subscriptions() -> None:
    # Given subscribers on two links
    node_a = MemoryBackends()
    node_b = node_a.link()
    a_sub, b_sub = Recorder(), Recorder()
    await node_a.signals.subscribe(a_sub)
    await node_b.signals.subscribe(b_sub)
    # When node-a's bundle is closed and node-a publishes
    await node_a.aclose()
    signal = _signal()
    await node_a.signals.publish(signal)
    # Then node-b's subscriber still receives and node-a's does not
    assert await b_sub.next() == signal
    assert a_sub.received.empty()
    await node_b.aclose()


# --------------------------------------------------------------------------- store clock


async def test_every_time_decision_uses_the_store_clock() -> None:
    # Given a bundle on a fake clock with a lease, a reservation, a queued message and a frame
    clock = FakeClock()
    backends = MemoryBackends(clock=clock)
    lease = await acquire_lease(backends, "s1", "node-a", 10.0)
    assert isinstance(lease, Lease) and lease.expires_at == 1010.0
    await backends.idempotency.put_if_absent("s1", "k", "t1", "h", "node-a", 5.0, 100.0)
    await backends.inbox.deliver(_envelope("t1"))
    first_ids = await backends.events.append("s1", [TextDelta(text="a"), TextDelta(text="b")])
    # When the store clock moves 20 s (the caller's wall clock barely moves)
    clock.now += 20.0
    # Then the lease expired, the reservation is stale, the message is pending,
    # and new event ids follow the store clock
    assert await backends.leases.current("s1") is None
    found = await backends.idempotency.find("s1", "k")
    assert found is not None and found.stale
    assert await backends.inbox.pending_sessions(15.0) == ["s1"]
    assert await backends.inbox.pending_sessions(25.0) == []
    later_ids = await backends.events.append("s1", [TextDelta(text="c")])
    assert first_ids == ["1000000-0", "1000000-1"]
    assert later_ids == ["1020000-0"]
    batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    assert batch.messages[0].envelope.enqueued_at == 1000.0
    # And past the primary TTL the reservation is gone
    clock.now += 100.0
    assert await backends.idempotency.find("s1", "k") is None


async def test_event_ids_increase_when_the_store_clock_stands_still() -> None:
    # Given a frozen store clock
    backends = MemoryBackends(clock=FakeClock())
    # When frames are appended in two calls
    ids = await backends.events.append("s1", [TextDelta(text="a")])
    ids += await backends.events.append("s1", [TextDelta(text="b")])
    # Then the ids still strictly increase
    assert ids == ["1000000-0", "1000000-1"]


# --------------------------------------------------------------------------- thread safety


async def test_publish_from_another_thread_reaches_the_subscribers_loop() -> None:
    # Given a subscriber on this loop
    backends = MemoryBackends()
    recorder = Recorder()
    await backends.signals.subscribe(recorder)
    signal = _signal(n=1)
    # When a thread with its own event loop publishes through the clone
    thread = threading.Thread(target=asyncio.run, args=(backends.clone().signals.publish(signal),))
    thread.start()
    # Then the handler runs on the subscriber's loop with the signal
    assert await recorder.next() == signal
    assert recorder.loops == {asyncio.get_running_loop()}
    await asyncio.to_thread(thread.join)
    await backends.aclose()


async def test_concurrent_delivers_from_threads_are_collected_exactly_once() -> None:
    # Given four threads, each with its own loop, delivering 100 messages each
    backends = MemoryBackends()

    async def deliver_many(worker: int) -> list[str]:
        return [await backends.inbox.deliver(_envelope(f"w{worker}-{n}")) for n in range(100)]

    threads = [asyncio.to_thread(asyncio.run, deliver_many(w)) for w in range(4)]
    # When this loop collects while they deliver
    collected: list[str] = []
    delivering = asyncio.gather(*threads)
    while not delivering.done() or not await backends.inbox.is_empty("s1"):
        batch = await backends.inbox.collect("s1", Priority.LATER, 1)
        collected += [m.message_id for m in batch.messages]
        await backends.inbox.ack("s1", 1, [m.message_id for m in batch.messages])
        await asyncio.sleep(0)
    delivered = [mid for ids in await delivering for mid in ids]
    # Then every message came out exactly once
    assert sorted(collected) == sorted(delivered)
    assert len(set(delivered)) == 400


async def test_renewal_thread_and_main_loop_share_leases() -> None:
    # Given leases acquired on this loop by a live incarnation
    backends = MemoryBackends()
    await backends.liveness.register("node-a", "inc-a", 30.0)
    leases = []
    for n in range(20):
        lease = await backends.leases.acquire(f"s{n}", "node-a")
        assert isinstance(lease, Lease)
        leases.append(lease)
    # When a renewal thread renews the incarnation on its own loop while this loop releases half
    renewer = backends.clone()

    async def renew_rounds() -> list[bool]:
        return [await renewer.liveness.renew("node-a", "inc-a", 30.0, 60.0) for _ in range(50)]

    renewing = asyncio.to_thread(asyncio.run, renew_rounds())
    released = [await backends.leases.release(lease) for lease in leases[::2]]
    rounds = await renewing
    # Then releases succeed, kept leases survive with their tokens, and a released lease is
    # never renewed back to life
    assert all(released) and all(rounds)
    for n, lease in enumerate(leases):
        current = await backends.leases.current(f"s{n}")
        if n % 2:
            assert current is not None and current.token == lease.token
        else:
            assert current is None


async def test_publish_to_a_subscriber_whose_loop_closed_is_harmless() -> None:
    # Given a subscription made on a thread's loop that has since closed
    backends = MemoryBackends()

    async def subscribe_then_leave() -> None:
        await backends.signals.subscribe(_noop)

    await asyncio.to_thread(asyncio.run, subscribe_then_leave())
    recorder = Recorder()
    await backends.signals.subscribe(recorder)
    # When a signal is published
    signal = _signal()
    await backends.signals.publish(signal)
    # Then the live subscriber still receives it and the publish did not fail
    assert await recorder.next() == signal
    await backends.aclose()
