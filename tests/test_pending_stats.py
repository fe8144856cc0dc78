"""Pending idle times per backend: exact on a memory store with a hand-driven clock, and on
Redis for entries packed before the collect time was stored (they count from their arrival)."""

from __future__ import annotations

import msgpack

from stickless._types import Priority
from stickless.backends.base import PendingStats
from stickless.backends.memory import MemoryBackends
from stickless.backends.redis import RedisBackends

from .redis_stores import envelope


def _unpack_lua(packed: bytes) -> list[bytes]:
    """A pending entry as Lua's cmsgpack packed it (every string raw bytes)."""
    entry: list[bytes] = msgpack.unpackb(packed, raw=True)
    return entry


class _Clock:
    """A store clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_memory_idle_time_counts_from_the_last_move_under_a_lease() -> None:
    clock = _Clock()
    inbox = MemoryBackends(clock=clock).inbox
    # Given a message delivered at 1000 and collected at 1010 under lease 1
    await inbox.deliver(envelope("t1"))
    clock.now = 1010.0
    await inbox.collect("s1", Priority.LATER, 1)
    # Then at 1025 it has been pending for 15 s (not 25: queued time is not pending time)
    clock.now = 1025.0
    assert (await inbox.pending_stats(["s1"]))["s1"] == PendingStats(0, 1, 15.0)
    # When lease 2 takes it over at 1030, the idle time starts again
    clock.now = 1030.0
    await inbox.collect("s1", Priority.LATER, 2)
    clock.now = 1034.0
    assert (await inbox.pending_stats(["s1"]))["s1"] == PendingStats(0, 1, 4.0)
    # And the oldest of several is the one reported
    await inbox.deliver(envelope("t2"))
    await inbox.collect("s1", Priority.LATER, 2)
    clock.now = 1040.0
    assert (await inbox.pending_stats(["s1"]))["s1"] == PendingStats(0, 2, 10.0)


async def test_redis_entry_packed_without_a_collect_time_counts_from_its_arrival(
    bundle: RedisBackends,
) -> None:
    client, inbox = bundle.client, bundle.inbox
    entries = bundle.keys.pending("s1")[1]
    # Given a pending entry as an older version packed it: {envelope, arrival}, an hour old
    await inbox.deliver(envelope("t1"))
    batch = await inbox.collect("s1", Priority.LATER, 1)
    message_id = batch.messages[0].message_id
    seconds, micros = await client.time()
    hour_ago = f"{seconds + micros / 1e6 - 3600:.6f}"
    data, _, _ = _unpack_lua(await client.hget(entries, message_id))
    await client.hset(entries, message_id, msgpack.packb([data, hour_ago], use_bin_type=False))
    # Then its idle time counts from that arrival
    old = (await inbox.pending_stats(["s1"]))["s1"]
    assert old.pending == 1 and old.oldest_idle is not None and old.oldest_idle >= 3600
    # When lease 2 takes it over, it is stored with its collect time, and still reads right
    taken = await inbox.collect("s1", Priority.LATER, 2)
    assert [m.envelope.turn_id for m in taken.messages] == ["t1"] and taken.redelivered == 1
    assert len(_unpack_lua(await client.hget(entries, message_id))) == 3
    fresh = (await inbox.pending_stats(["s1"]))["s1"]
    assert fresh.oldest_idle is not None and fresh.oldest_idle < old.oldest_idle


async def test_redis_pending_entry_whose_payload_is_gone_counts_but_has_no_age(
    bundle: RedisBackends,
) -> None:
    client, inbox = bundle.client, bundle.inbox
    ids, entries = bundle.keys.pending("s1")
    # Given a pending id whose payload was lost
    await inbox.deliver(envelope("t1"))
    batch = await inbox.collect("s1", Priority.LATER, 1)
    await client.hdel(entries, batch.messages[0].message_id)
    # Then it is still counted as pending, without an idle time to report
    assert await client.zcard(ids) == 1
    assert (await inbox.pending_stats(["s1"]))["s1"] == PendingStats(0, 1, None)
