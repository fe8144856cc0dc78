"""Inbox contract: the entry is the boundary of a decode failure, whatever field is bad.

Entries are planted the way a store holds them (for Redis: an XADD with the fields
`inbox_deliver.lua` writes, `e` for the envelope and `t` for the arrival time; for memory: a row
in the shared state), so a bad arrival, a missing field or a wrong type can be put between good
deliveries. Collect and purge must hand back every good message and turn only the bad entry
into an `UnreadableEntry`.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from stickless._types import Priority, UserInput
from stickless.backends.base import Backends, CollectedBatch
from stickless.backends.memory import MemoryBackends
from stickless.backends.memory._shared import InboxRow
from stickless.wire import Envelope, pack

#: A missing field (the entry simply lacks it).
MISSING = object()

PlantEntry = Callable[[str, Priority, Any, Any], Awaitable[str]]

_planted = itertools.count(1)


@pytest.fixture
def plant_entry(backends: Backends) -> PlantEntry:
    """Store one raw inbox entry `(data, arrival)` as the backend keeps it; MISSING leaves the
    field out. Returns the message id collect reports for it."""
    if isinstance(backends, MemoryBackends):
        state = backends._link.state

        async def plant_memory(session_id: str, priority: Priority, data: Any, arrival: Any) -> str:
            message_id = f"m-planted-{next(_planted)}"
            row = InboxRow(
                message_id,
                None if arrival is MISSING else arrival,
                None if data is MISSING else data,
            )
            with state.lock:
                state.inbox.setdefault(session_id, {}).setdefault(priority, deque()).append(row)
            return message_id

        return plant_memory

    from stickless.backends.redis import RedisBackends
    from stickless.backends.redis._keys import TIERS

    assert isinstance(backends, RedisBackends)
    bundle = backends

    async def plant_redis(session_id: str, priority: Priority, data: Any, arrival: Any) -> str:
        fields: dict[str, Any] = {}
        if data is not MISSING:
            fields["e"] = data
        if arrival is not MISSING:
            fields["t"] = arrival
        if not fields:
            fields["other"] = b"x"
        stream = bundle.keys.inbox(session_id)[TIERS.index(priority)]
        added = await bundle.client.xadd(stream, fields)
        stream_id = added.decode() if isinstance(added, bytes) else str(added)
        return f"{int(priority)}:{stream_id}"

    return plant_redis


def _envelope(turn_id: str, **extra: Any) -> Envelope:
    return Envelope(
        session_id="s1",
        turn_id=turn_id,
        agent_ref="agent-a",
        input=UserInput.text(f"input of {turn_id}"),
        key=f"key-{turn_id}",
        **extra,
    )


def _turns(batch: CollectedBatch) -> list[str]:
    return [m.envelope.turn_id for m in batch.messages]


async def test_bad_arrival_between_good_deliveries_spares_both(
    backends: Backends, plant_entry: PlantEntry
) -> None:
    # Given a good delivery, an entry with a well-formed envelope but an arrival that is not a
    # number, and another good delivery
    first = await backends.inbox.deliver(_envelope("good-1"))
    bad = await plant_entry("s1", Priority.NEXT, _envelope("t-bad").encode(), b"not-a-number")
    second = await backends.inbox.deliver(_envelope("good-2"))
    # When the session is collected
    batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    # Then both good messages come back in order, the bad entry is unreadable with the addresses
    # read from its envelope, and nothing is left behind
    assert [m.message_id for m in batch.messages] == [first, second]
    assert _turns(batch) == ["good-1", "good-2"]
    assert [(u.message_id, u.turn_id, u.idempotency_key) for u in batch.unreadable] == [
        (bad, "t-bad", "key-t-bad")
    ]
    assert "arrival" in batch.unreadable[0].reason
    assert not await backends.inbox.collect("s1", Priority.LATER, 1)  # nothing left queued


# (case, data, arrival, salvaged turn id); the data of a None turn id has no addresses.
BAD_ENTRIES: list[tuple[str, Any, Any, str | None]] = [
    ("empty arrival", _envelope("t-x").encode(), b"", "t-x"),
    ("nan arrival", _envelope("t-x").encode(), b"nan", "t-x"),
    ("infinite arrival", _envelope("t-x").encode(), b"inf", "t-x"),
    ("missing arrival", _envelope("t-x").encode(), MISSING, "t-x"),
    ("missing envelope", MISSING, b"12.5", None),
    ("empty envelope", b"", b"12.5", None),
    ("non-finite enqueue time", _envelope("t-x", enqueued_at=math.nan).encode(), b"1.0", "t-x"),
    ("envelope not a map", pack([1, 2, 3]), b"1.0", None),
    ("invalid envelope", pack({"turn_id": "t-x", "key": "key-t-x", "input": 42}), b"1.0", "t-x"),
]


@pytest.mark.parametrize(
    ("case", "data", "arrival", "turn_id"), BAD_ENTRIES, ids=[case for case, *_ in BAD_ENTRIES]
)
async def test_any_bad_field_turns_only_its_entry_unreadable(
    backends: Backends,
    plant_entry: PlantEntry,
    case: str,
    data: Any,
    arrival: Any,
    turn_id: str | None,
) -> None:
    # Given a bad entry in NEXT with good messages in NOW and LATER around it
    now = await backends.inbox.deliver(_envelope("good-now", priority=Priority.NOW))
    bad = await plant_entry("s1", Priority.NEXT, data, arrival)
    later = await backends.inbox.deliver(_envelope("good-later", priority=Priority.LATER))
    # When everything is purged (the same decoding as collect)
    batch = await backends.inbox.purge("s1")
    # Then only the bad entry is unreadable, with whatever addresses could be recovered
    assert [m.message_id for m in batch.messages] == [now, later], case
    assert [u.message_id for u in batch.unreadable] == [bad]
    unreadable = batch.unreadable[0]
    assert unreadable.turn_id == turn_id
    assert unreadable.idempotency_key == (None if turn_id is None else f"key-{turn_id}")
    assert unreadable.reason
    assert await backends.inbox.is_empty("s1")


@pytest.mark.parametrize("backends", ["memory"], indirect=True)
@pytest.mark.parametrize(
    ("data", "arrival"),
    [
        (None, 1.0),
        (42, 1.0),
        ("text, not bytes", 1.0),
        (_envelope("t-x").encode(), None),
        (_envelope("t-x").encode(), "later"),
        (_envelope("t-x").encode(), [1.0]),
        (_envelope("t-x").encode(), True),
    ],
)
async def test_wrong_typed_memory_fields_are_contained(
    backends: Backends, plant_entry: PlantEntry, data: Any, arrival: Any
) -> None:
    # Given a memory row whose fields have the wrong type, after a good message
    good = await backends.inbox.deliver(_envelope("good"))
    bad = await plant_entry("s1", Priority.NEXT, data, arrival)
    # When the session is collected
    batch = await backends.inbox.collect("s1", Priority.LATER, 1)
    # Then the good message comes back and the bad row is unreadable
    assert [m.message_id for m in batch.messages] == [good]
    assert [u.message_id for u in batch.unreadable] == [bad]
