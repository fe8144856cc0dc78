"""Inbox contract, the backlog: per-session queued and pending counts with the idle time of the
oldest pending entry, and how many entries of a collect came out of the pending set."""

from __future__ import annotations

from stickless._types import Priority
from stickless.backends.base import Backends, PendingStats

from .conftest import PlantRaw
from .test_inbox import _envelope, _turns


async def test_every_session_asked_for_is_answered_and_an_empty_one_has_no_backlog(
    backends: Backends,
) -> None:
    inbox = backends.inbox
    # Given one session with a queued message and one never used
    await inbox.deliver(_envelope("q", session_id="busy"))
    # When both are asked for at once
    stats = await inbox.pending_stats(["busy", "never"])
    # Then each is answered: the used one with its queued message, the other with nothing
    assert stats["busy"] == PendingStats(queued=1, pending=0, oldest_idle=None)
    assert stats["never"] == PendingStats(queued=0, pending=0, oldest_idle=None)
    assert await inbox.pending_stats([]) == {}


async def test_collected_entries_count_as_pending_until_acknowledged(backends: Backends) -> None:
    inbox = backends.inbox
    # Given two messages collected under lease 1 and one queued since
    await inbox.deliver(_envelope("a"))
    await inbox.deliver(_envelope("b", Priority.NOW))
    batch = await inbox.collect("s1", Priority.LATER, 1)
    await inbox.deliver(_envelope("c"))
    # Then both collected ones are pending (with an idle time) and the new one queued
    held = (await inbox.pending_stats(["s1"]))["s1"]
    assert (held.queued, held.pending) == (1, 2)
    assert held.oldest_idle is not None and held.oldest_idle >= 0.0
    # When one is acknowledged, then the other
    await inbox.ack("s1", 1, [batch.messages[0].message_id])
    one_left = (await inbox.pending_stats(["s1"]))["s1"]
    await inbox.ack("s1", 1, [batch.messages[1].message_id])
    none_left = (await inbox.pending_stats(["s1"]))["s1"]
    # Then the pending count follows, and with nothing pending there is no idle time
    assert (one_left.pending, none_left.pending) == (1, 0)
    assert one_left.oldest_idle is not None
    assert none_left == PendingStats(queued=1, pending=0, oldest_idle=None)


async def test_the_oldest_pending_entry_sets_the_idle_time_and_a_take_over_restarts_it(
    backends: Backends,
) -> None:
    inbox = backends.inbox
    # Given s1 collected before s2, both under lease 1
    await inbox.deliver(_envelope("first", session_id="s1"))
    await inbox.deliver(_envelope("second", session_id="s2"))
    await inbox.collect("s1", Priority.LATER, 1)
    await inbox.collect("s2", Priority.LATER, 1)
    before = await inbox.pending_stats(["s1", "s2"])
    # When lease 2 takes s1's entry over
    await inbox.collect("s1", Priority.LATER, 2)
    after = await inbox.pending_stats(["s1", "s2"])
    # Then s1 was idle at least as long as s2 (collected first), and after the take-over less
    # long than s2 (its clock restarted with the move)
    s1_before, s2_before = before["s1"].oldest_idle, before["s2"].oldest_idle
    s1_after, s2_after = after["s1"].oldest_idle, after["s2"].oldest_idle
    assert s1_before is not None and s2_before is not None and s1_before >= s2_before
    assert s1_after is not None and s2_after is not None and s1_after < s2_after
    assert after["s1"].pending == 1


async def test_a_collect_counts_what_it_took_over_from_older_leases_as_redelivered(
    backends: Backends,
) -> None:
    inbox = backends.inbox
    # Given one entry left pending by lease 1, one by lease 2, and one queued
    await inbox.deliver(_envelope("by-1"))
    await inbox.collect("s1", Priority.LATER, 1)
    await inbox.deliver(_envelope("by-2"))
    await inbox.collect("s1", Priority.NOW, 2)  # takes nothing: only NOW, and no take-over
    await inbox.deliver(_envelope("urgent", Priority.NOW))
    assert _turns(await inbox.collect("s1", Priority.NOW, 2)) == ["urgent"]
    await inbox.deliver(_envelope("queued"))
    # When lease 3 collects everything
    batch = await inbox.collect("s1", Priority.LATER, 3)
    # Then the two entries of older leases count as redelivered, the queued ones do not
    assert sorted(_turns(batch)) == ["by-1", "by-2", "queued", "urgent"]
    assert (batch.redelivered, batch.reclaimed) == (2, 0)


async def test_a_collect_in_doubt_counts_its_own_entries_as_reclaimed(backends: Backends) -> None:
    inbox = backends.inbox
    # Given an entry left by lease 1 and one collected by lease 2 whose reply was lost
    await inbox.deliver(_envelope("old"))
    await inbox.collect("s1", Priority.LATER, 1)
    await inbox.deliver(_envelope("mine"))
    await inbox.collect("s1", Priority.NOW, 2)
    await inbox.deliver(_envelope("mine-now", Priority.NOW))
    await inbox.collect("s1", Priority.NOW, 2)
    # When lease 2 collects again reclaiming its own
    batch = await inbox.collect("s1", Priority.LATER, 2, reclaim_own=True)
    # Then its own entry counts as reclaimed, lease 1's as redelivered, the queued one as neither
    assert sorted(_turns(batch)) == ["mine", "mine-now", "old"]
    assert (batch.redelivered, batch.reclaimed) == (1, 1)
    # And a plain collect after it counts nothing
    await inbox.deliver(_envelope("later"))
    plain = await inbox.collect("s1", Priority.LATER, 2)
    assert (_turns(plain), plain.redelivered, plain.reclaimed) == (["later"], 0, 0)


async def test_an_unreadable_pending_entry_counts_as_redelivered_too(
    backends: Backends, plant_raw: PlantRaw
) -> None:
    inbox = backends.inbox
    # Given a corrupt entry collected under lease 1 and never acknowledged
    await plant_raw("s1", Priority.NEXT, b"\xc1 not an envelope")
    first = await inbox.collect("s1", Priority.LATER, 1)
    assert len(first.unreadable) == 1
    # When lease 2 takes it over
    batch = await inbox.collect("s1", Priority.LATER, 2)
    # Then it comes back unreadable, counted with the redelivered
    assert (len(batch.unreadable), batch.redelivered) == (1, 1)


async def test_a_purge_counts_nothing_as_delivered_again(backends: Backends) -> None:
    inbox = backends.inbox
    await inbox.deliver(_envelope("pending"))
    await inbox.collect("s1", Priority.LATER, 1)
    purged = await inbox.purge("s1")
    assert _turns(purged) == ["pending"]
    assert (purged.redelivered, purged.reclaimed) == (0, 0)
    assert (await inbox.pending_stats(["s1"]))["s1"] == PendingStats()
