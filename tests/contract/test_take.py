"""HotPath contract, the holder's take: the collect, and in the same step the take-over of the
reservation of a lone message fresh from the queue (holderless, due, for that turn); anything
else is left to the take-over at the turn's start."""

from __future__ import annotations

from stickless._types import Priority
from stickless.backends.base import Backends
from tests.liveness import live

from .test_idempotency import LONG, _reserve
from .test_inbox import _envelope, _turns

TOKEN = 3


async def _queued(backends: Backends, turn_id: str) -> None:
    """A submitter's message for `turn_id`: its reservation holderless, the envelope queued."""
    await _reserve(backends, f"key-{turn_id}", turn_id=turn_id)
    assert await backends.idempotency.release_holder("s1", f"key-{turn_id}", "node-a", LONG)
    await backends.inbox.deliver(_envelope(turn_id))


async def test_a_take_of_a_lone_message_takes_its_reservation_over(backends: Backends) -> None:
    # Given one queued message whose reservation is holderless
    await live(backends, "node-b")
    await _queued(backends, "t1")
    # When the holder takes it
    batch = await backends.hotpath.take("s1", Priority.LATER, TOKEN, "node-b", LONG)
    # Then it is collected, and its reservation is the holder's first attempt (a take-over asked
    # again finds that very attempt)
    assert _turns(batch) == ["t1"] and batch.taken_attempt == 1
    found = await backends.idempotency.find("s1", "key-t1")
    assert found is not None and (found.holder, found.attempt) == ("node-b", 1)
    assert not found.stale
    again = await backends.idempotency.acquire_holder("s1", "key-t1", "t1", "node-b", LONG)
    assert again.attempt == 1


async def test_a_take_of_several_messages_takes_none_over(backends: Backends) -> None:
    # Given two queued messages
    await live(backends, "node-b")
    await _queued(backends, "t1")
    await _queued(backends, "t2")
    # When the holder takes them
    batch = await backends.hotpath.take("s1", Priority.LATER, TOKEN, "node-b", LONG)
    # Then both are collected, and both reservations are left for their turns' start
    assert _turns(batch) == ["t1", "t2"] and batch.taken_attempt == 0
    for key in ("key-t1", "key-t2"):
        found = await backends.idempotency.find("s1", key)
        assert found is not None and found.holder is None and found.attempt == 0


async def test_a_take_leaves_a_held_reservation_alone(backends: Backends) -> None:
    # Given a queued message whose reservation its submitter still holds
    await live(backends, "node-b")
    await _reserve(backends, "key-t1", turn_id="t1")
    await backends.inbox.deliver(_envelope("t1"))
    # When the holder takes it
    batch = await backends.hotpath.take("s1", Priority.LATER, TOKEN, "node-b", LONG)
    # Then it is collected but not taken over (the take-over at its start decides)
    assert _turns(batch) == ["t1"] and batch.taken_attempt == 0
    found = await backends.idempotency.find("s1", "key-t1")
    assert found is not None and found.holder == "node-a"


async def test_a_take_of_a_pending_message_takes_none_over(backends: Backends) -> None:
    # Given a message collected under an older lease and never answered
    await live(backends, "node-b")
    await _queued(backends, "t1")
    await backends.inbox.collect("s1", Priority.LATER, TOKEN - 1)
    # When the next holder takes the inbox
    batch = await backends.hotpath.take("s1", Priority.LATER, TOKEN, "node-b", LONG)
    # Then the message comes back, redelivered, and its take-over is left to its start
    assert _turns(batch) == ["t1"] and batch.redelivered == 1
    assert batch.taken_attempt == 0
