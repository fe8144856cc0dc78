"""Inbox contract: priority-then-FIFO collect, atomic removal, per-entry decoding."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from stickless._types import Priority, UserInput
from stickless.backends.base import Backends, CollectedBatch
from stickless.wire import Envelope, pack

PlantRaw = Callable[[str, Priority, bytes], Awaitable[str]]


def _envelope(
    turn_id: str, priority: Priority = Priority.NEXT, session_id: str = "s1", **extra: Any
) -> Envelope:
    return Envelope(
        session_id=session_id,
        turn_id=turn_id,
        agent_ref="agent-a",
        input=UserInput.text(f"input of {turn_id}"),
        priority=priority,
        key=f"key-{turn_id}",
        **extra,
    )


def _turns(batch: CollectedBatch) -> list[str]:
    return [m.envelope.turn_id for m in batch.messages]


async def test_deliver_returns_unique_ids_and_stamps_enqueue_time(backends: Backends) -> None:
    # Given an envelope without an enqueue time and one carrying its original time
    fresh = _envelope("t1")
    redelivered = _envelope("t2", enqueued_at=12.5)
    # When both are delivered and collected
    ids = [await backends.inbox.deliver(fresh), await backends.inbox.deliver(redelivered)]
    batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    # Then ids are distinct, the fresh one got the store's time, the original time was kept,
    # and everything else survived the round trip
    assert len(set(ids)) == 2
    assert [m.message_id for m in batch.messages] == [ids[1], ids[0]]
    by_turn = {m.envelope.turn_id: m.envelope for m in batch.messages}
    assert by_turn["t1"].enqueued_at > 12.5
    assert by_turn["t2"].enqueued_at == 12.5
    assert by_turn["t1"].model_copy(update={"enqueued_at": 0.0}) == fresh


async def test_collect_orders_by_priority_then_fifo(backends: Backends) -> None:
    # Given messages of mixed tiers delivered in this order
    for turn_id, priority in [
        ("later-1", Priority.LATER),
        ("next-1", Priority.NEXT),
        ("now-1", Priority.NOW),
        ("next-2", Priority.NEXT),
        ("now-2", Priority.NOW),
        ("later-2", Priority.LATER),
    ]:
        await backends.inbox.deliver(_envelope(turn_id, priority))
    # When every tier is collected
    batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    # Then NOW comes first, then NEXT, then LATER, each in delivery order, and nothing is left
    # once they are acknowledged
    assert _turns(batch) == ["now-1", "now-2", "next-1", "next-2", "later-1", "later-2"]
    assert batch.unreadable == []
    assert not await backends.inbox.is_empty("s1")
    await backends.inbox.ack("s1", 1, [m.message_id for m in batch.messages])
    assert await backends.inbox.is_empty("s1")


async def test_redelivered_message_keeps_its_place(backends: Backends) -> None:
    # Given a message delivered now and an older one handed back after a lease loss
    await backends.inbox.deliver(_envelope("newer"))
    await backends.inbox.deliver(_envelope("older", enqueued_at=1.0))
    # When the tier is collected
    batch = await backends.inbox.collect("s1", Priority.NEXT, 1)
    # Then the older message comes first
    assert _turns(batch) == ["older", "newer"]


async def test_collect_now_only_leaves_lower_tiers(backends: Backends) -> None:
    # Given one message per tier
    await backends.inbox.deliver(_envelope("later", Priority.LATER))
    await backends.inbox.deliver(_envelope("next", Priority.NEXT))
    await backends.inbox.deliver(_envelope("now", Priority.NOW))
    # When only NOW is collected
    batch = await backends.inbox.collect("s1", Priority.NOW, 1)
    # Then only the NOW message comes out; the rest stays queued in order
    assert _turns(batch) == ["now"]
    assert not await backends.inbox.is_empty("s1")
    rest = await backends.inbox.collect("s1", Priority.LATER, 1)
    assert _turns(rest) == ["next", "later"]


async def test_collect_of_empty_inbox_is_an_empty_batch(backends: Backends) -> None:
    # Given a session with nothing queued
    # When it is collected
    batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    # Then the batch is empty and falsy
    assert not batch
    assert batch.messages == [] and batch.unreadable == []


async def test_sessions_are_isolated(backends: Backends) -> None:
    # Given messages for two sessions
    await backends.inbox.deliver(_envelope("a", session_id="s1"))
    await backends.inbox.deliver(_envelope("b", session_id="s2"))
    # When one session is collected
    batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    # Then only its message comes out
    assert _turns(batch) == ["a"]
    assert not await backends.inbox.is_empty("s2")


async def test_purge_removes_every_tier(backends: Backends) -> None:
    # Given messages in every tier
    await backends.inbox.deliver(_envelope("later", Priority.LATER))
    await backends.inbox.deliver(_envelope("now", Priority.NOW))
    await backends.inbox.deliver(_envelope("next", Priority.NEXT))
    # When the session is purged
    batch = await backends.inbox.purge("s1")
    # Then everything comes back sorted and the inbox is empty
    assert _turns(batch) == ["now", "next", "later"]
    assert await backends.inbox.is_empty("s1")
    assert not await backends.inbox.purge("s1")


async def test_is_empty_tracks_deliver_collect_and_ack(backends: Backends) -> None:
    # Given a session never written to
    assert await backends.inbox.is_empty("s1")
    # When a message is delivered, collected, then acknowledged
    await backends.inbox.deliver(_envelope("t1", Priority.LATER))
    after_deliver = await backends.inbox.is_empty("s1")
    batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    after_collect = await backends.inbox.is_empty("s1")
    await backends.inbox.ack("s1", 1, [batch.messages[0].message_id])
    # Then the inbox was non-empty until the message was acknowledged
    assert not after_deliver and not after_collect
    assert await backends.inbox.is_empty("s1")


async def test_pending_sessions_reports_old_queued_entries(
    backends: Backends, wait_until: Any
) -> None:
    # Given a message queued for s-old
    await backends.inbox.deliver(_envelope("t1", session_id="s-old"))

    # When it has been queued for longer than 0.2 s (store clock)
    async def listed() -> bool:
        return "s-old" in await backends.inbox.pending_sessions(0.2)

    await wait_until(listed)
    # Then a fresh session is not listed, nor is s-old under a one-hour bound, nor once its
    # messages were collected and answered
    await backends.inbox.deliver(_envelope("t2", session_id="s-new"))
    assert "s-new" not in await backends.inbox.pending_sessions(3600)
    assert "s-old" not in await backends.inbox.pending_sessions(3600)
    batch = await backends.inbox.collect("s-old", Priority.LATER, 1)
    await backends.inbox.ack("s-old", 1, [m.message_id for m in batch.messages])
    assert "s-old" not in await backends.inbox.pending_sessions(0.0)


async def test_corrupt_entry_does_not_take_its_batch_with_it(
    backends: Backends, plant_raw: PlantRaw, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a corrupt entry (a map with addresses but an invalid input) between two good ones
    first = await backends.inbox.deliver(_envelope("good-1"))
    corrupt = pack({"turn_id": "t-bad", "key": "k-bad", "input": 42, "secret": "do-not-log"})
    bad_id = await plant_raw("s1", Priority.NEXT, corrupt)
    second = await backends.inbox.deliver(_envelope("good-2"))
    # When the session is collected
    with caplog.at_level(logging.WARNING):
        batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    # Then the good ones come back in order, the corrupt one with its salvaged addresses,
    # the inbox is empty, and the warning names the session and message but not the payload
    assert [m.message_id for m in batch.messages] == [first, second]
    assert len(batch.unreadable) == 1
    unreadable = batch.unreadable[0]
    assert (unreadable.message_id, unreadable.turn_id, unreadable.idempotency_key) == (
        bad_id,
        "t-bad",
        "k-bad",
    )
    assert unreadable.reason
    assert not await backends.inbox.collect("s1", Priority.LATER, 1)  # nothing left queued
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and bad_id in r.getMessage()
    ]
    assert len(warnings) == 1
    assert "s1" in warnings[0].getMessage()
    assert "do-not-log" not in caplog.text


async def test_garbage_entry_has_no_addresses(backends: Backends, plant_raw: PlantRaw) -> None:
    # Given bytes that are not msgpack at all, and a msgpack value that is not a map
    garbage = await plant_raw("s1", Priority.NOW, b"\xc1\xc1 not msgpack")
    scalar = await plant_raw("s1", Priority.LATER, pack(["turn_id", "key"]))
    # When the session is purged
    batch = await backends.inbox.purge("s1")
    # Then both come back unreadable, without addresses, and nothing is left
    assert batch.messages == []
    assert {(u.message_id, u.turn_id, u.idempotency_key) for u in batch.unreadable} == {
        (garbage, None, None),
        (scalar, None, None),
    }
    assert await backends.inbox.is_empty("s1")
