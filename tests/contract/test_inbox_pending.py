"""Inbox contract, two-phase collect: a collected entry stays pending under its lease until it
is acknowledged, and a later lease (or the same one, after a lost collect) takes it over."""

from __future__ import annotations

from stickless._types import Priority
from stickless.backends.base import Backends, Lease

from .test_inbox import _envelope, _turns


async def test_a_later_lease_takes_over_what_an_earlier_one_left_unacknowledged(
    backends: Backends,
) -> None:
    inbox = backends.inbox
    # Given two messages collected under lease 1, only the first acknowledged
    await inbox.deliver(_envelope("done"))
    await inbox.deliver(_envelope("left"))
    first = await inbox.collect("s1", Priority.LATER, 1)
    ids = {m.envelope.turn_id: m.message_id for m in first.messages}
    await inbox.ack("s1", 1, [ids["done"]])
    # And a message queued since
    await inbox.deliver(_envelope("new"))
    # When lease 2 collects
    second = await inbox.collect("s1", Priority.LATER, 2)
    # Then it gets the unacknowledged one (same id) and the new one, never the acknowledged one
    assert sorted(_turns(second)) == ["left", "new"]
    assert ids["left"] in {m.message_id for m in second.messages}
    # And lease 1 can no longer acknowledge it: it is lease 2's now
    await inbox.ack("s1", 1, [ids["left"]])
    third = await inbox.collect("s1", Priority.LATER, 3)
    assert sorted(_turns(third)) == ["left", "new"]


async def test_a_lease_sees_its_own_pending_entries_again_only_when_it_asks(
    backends: Backends,
) -> None:
    inbox = backends.inbox
    # Given a message collected under lease 1 (say the reply never arrived)
    await inbox.deliver(_envelope("lost"))
    await inbox.collect("s1", Priority.LATER, 1)
    # When lease 1 collects again, first plainly, then reclaiming its own
    plain = await inbox.collect("s1", Priority.LATER, 1)
    again = await inbox.collect("s1", Priority.LATER, 1, reclaim_own=True)
    # Then only the reclaiming collect returns it
    assert _turns(plain) == []
    assert _turns(again) == ["lost"]


async def test_a_now_collect_takes_over_nothing_pending(backends: Backends) -> None:
    inbox = backends.inbox
    # Given a message left pending by lease 1 and a NOW message queued since
    await inbox.deliver(_envelope("left", Priority.LATER))
    await inbox.collect("s1", Priority.LATER, 1)
    await inbox.deliver(_envelope("urgent", Priority.NOW))
    # When lease 2 collects only NOW (mid-turn), then everything
    now = await inbox.collect("s1", Priority.NOW, 2)
    full = await inbox.collect("s1", Priority.LATER, 2)
    # Then the pending message comes with the full collect only
    assert _turns(now) == ["urgent"]
    assert _turns(full) == ["left"]


async def test_ack_is_safe_to_repeat_and_ignores_unknown_ids(backends: Backends) -> None:
    inbox = backends.inbox
    await inbox.deliver(_envelope("t1"))
    batch = await inbox.collect("s1", Priority.LATER, 1)
    message_id = batch.messages[0].message_id
    # When the same ack is sent twice, with an id that was never pending
    await inbox.ack("s1", 1, [message_id, "0:0-1"])
    await inbox.ack("s1", 1, [message_id])
    # Then the session is empty and nothing comes back
    assert await inbox.is_empty("s1")
    assert not await inbox.collect("s1", Priority.LATER, 2)


async def test_purge_removes_pending_entries_too(backends: Backends) -> None:
    inbox = backends.inbox
    # Given one message pending under lease 1 and one queued
    await inbox.deliver(_envelope("pending"))
    await inbox.collect("s1", Priority.LATER, 1)
    await inbox.deliver(_envelope("queued"))
    # When the session is purged
    purged = await inbox.purge("s1")
    # Then both come back, and nothing is left for any lease
    assert sorted(_turns(purged)) == ["pending", "queued"]
    assert await inbox.is_empty("s1")
    assert not await inbox.collect("s1", Priority.LATER, 2)


async def test_pending_entries_of_a_holder_whose_lease_is_gone_are_listed_for_the_orphan_scan(
    backends: Backends,
) -> None:
    inbox, leases = backends.inbox, backends.leases
    # Given a message collected under a live lease (nothing left queued in the streams)
    lease = await leases.acquire("s1", "node-a")
    assert isinstance(lease, Lease)
    await inbox.deliver(_envelope("collected"))
    await inbox.collect("s1", Priority.LATER, lease.token)
    # Then the scan leaves it to its holder while the lease lives
    held = await inbox.pending_sessions(0.0)
    # When the holder's lease goes away (its node died; here: released)
    await leases.release(lease)
    # Then the scan lists the session, so that somebody claims it and runs the message
    assert "s1" not in held
    assert "s1" in await inbox.pending_sessions(0.0)
