"""HotPath contract, a non-holder's submit: when another live node holds the session, one
reserve makes the reservation holderless, queues the message and rings the holder's doorbell;
otherwise it reserves as usual and queues nothing."""

from __future__ import annotations

from stickless._types import Priority
from stickless.backends.base import Backends, Forwarding, Lease, Reserved
from stickless.wire import Signal, SignalKind
from tests.liveness import live

from .test_hotpath import _announced, _listening
from .test_idempotency import DAY, LONG, _find
from .test_inbox import _envelope, _turns


def _forwarding(turn_id: str = "t1", delivery_id: str = "d1") -> Forwarding:
    return Forwarding(_envelope(turn_id), delivery_id, LONG)


async def _reserve(backends: Backends, forward: Forwarding, turn_id: str = "t1") -> Reserved:
    return await backends.hotpath.reserve(
        "s1", "k1", turn_id, f"hash-{turn_id}", "node-a", "agent-a", LONG, DAY, forward
    )


async def _held_by(backends: Backends, holder: str) -> Lease:
    await live(backends, holder)
    lease = await backends.leases.acquire("s1", holder)
    assert isinstance(lease, Lease)
    return lease


async def test_a_reserve_for_a_session_held_elsewhere_queues_and_rings_the_holder(
    backends: Backends,
) -> None:
    # Given s1 held by a live node-x, and a control-channel subscriber
    lease = await _held_by(backends, "node-x")
    recorder = await _listening(backends)
    # When node-a's submit reserves with a forward
    reserved = await _reserve(backends, _forwarding())
    # Then the message is queued for node-x under a holderless reservation...
    forwarded = reserved.forwarded
    assert forwarded is not None and reserved.existing is None
    assert (forwarded.holder, forwarded.token) == ("node-x", lease.token)
    found = await _find(backends)
    assert (found.turn_id, found.holder, found.stale) == ("t1", None, False)
    batch = await backends.inbox.collect("s1", Priority.LATER, lease.token)
    assert _turns(batch) == ["t1"]
    assert [m.message_id for m in batch.messages] == [forwarded.message_id]
    # ...and node-x's doorbell rang, in the same step
    doorbell = Signal(
        kind=SignalKind.MESSAGE_ENQUEUED,
        session_id="s1",
        origin="node-a",
        payload={"held_by": "node-x"},
    )
    assert await _announced(recorder, backends) == [doorbell]


async def test_a_forwarding_reserve_run_again_queues_once(backends: Backends) -> None:
    # Given a reserve that queued its message for node-x
    lease = await _held_by(backends, "node-x")
    first = await _reserve(backends, _forwarding())
    # When the very same call runs again (a retry after its reply was lost)
    again = await _reserve(backends, _forwarding())
    # Then it answers the same message, queued once
    assert again == first
    batch = await backends.inbox.collect("s1", Priority.LATER, lease.token)
    assert _turns(batch) == ["t1"]


async def test_a_forwarding_reserve_of_a_free_or_own_session_only_reserves(
    backends: Backends,
) -> None:
    # Given s1 unheld, and a control-channel subscriber
    await live(backends, "node-a")
    recorder = await _listening(backends)
    # When node-a reserves with a forward, then again for another key once it holds s1
    free = await _reserve(backends, _forwarding())
    lease = await backends.leases.acquire("s1", "node-a")
    assert isinstance(lease, Lease)
    own = await backends.hotpath.reserve(
        "s1", "k2", "t2", "hash-t2", "node-a", "agent-a", LONG, DAY, _forwarding("t2", "d2")
    )
    # Then both are plain reservations held by node-a: nothing queued, no doorbell
    assert free == Reserved(quiet=True) and own == Reserved(quiet=True)
    assert (await _find(backends)).holder == "node-a"
    assert (await _find(backends, "k2")).holder == "node-a"
    assert await backends.inbox.is_empty("s1")
    assert await _announced(recorder, backends) == []


async def test_a_forwarding_reserve_finding_the_key_taken_queues_nothing(
    backends: Backends,
) -> None:
    # Given s1 held by node-x, and k1 reserved by another turn
    await _held_by(backends, "node-x")
    assert (await _reserve(backends, _forwarding("t0", "d0"), "t0")).forwarded is not None
    lease = await backends.leases.current("s1")
    assert lease is not None
    await backends.inbox.collect("s1", Priority.LATER, lease.token)
    # When another turn reserves the same key with a forward
    other = await _reserve(backends, _forwarding("t1", "d1"))
    # Then it gets the existing reservation back and nothing more is queued
    assert other.forwarded is None and other.existing is not None
    assert other.existing.turn_id == "t0"
    assert _turns(await backends.inbox.collect("s1", Priority.LATER, lease.token)) == []


async def test_a_reservation_keeps_its_submits_traceparent(backends: Backends) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    # Given s1 held by node-x: a forwarded reserve, and a local one of another key
    await _held_by(backends, "node-x")
    forwarded = await backends.hotpath.reserve(
        "s1", "k1", "t1", "hash-t1", "node-a", "agent-a", LONG, DAY, _forwarding(), traceparent
    )
    local = await backends.hotpath.reserve(
        "s1", "k2", "t2", "hash-t2", "node-x", "agent-a", LONG, DAY, None, traceparent
    )
    untraced = await backends.hotpath.reserve(
        "s1", "k3", "t3", "hash-t3", "node-x", "agent-a", LONG, DAY
    )
    assert forwarded.forwarded is not None and local.existing is untraced.existing is None
    # Then each reservation, read back, names the traceparent it was made with
    assert (await _find(backends, "k1")).traceparent == traceparent
    assert (await _find(backends, "k2")).traceparent == traceparent
    assert (await _find(backends, "k3")).traceparent == ""
