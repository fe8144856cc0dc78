"""Redis-specific behaviour: the stale, pending and holder indexes heal themselves."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stickless import Priority
from stickless.backends.base import Lease, Takeover
from stickless.backends.redis import RedisBackends, _idempotency
from stickless.backends.redis._keys import parse_reservation_member, reservation_member
from stickless.backends.redis._scripts import Call
from stickless.wire import Outcome
from tests.liveness import kill, live

from .commits import mark_done
from .redis_stores import DAY, LONG, envelope


@given(st.text(min_size=1), st.text(), st.text())
def test_stale_index_members_round_trip(session_id: str, key: str, turn_id: str) -> None:
    # Given any session id, key and turn id (digits and ':' included)
    # When they are encoded as an index member and parsed back
    # Then the same three come back
    member = reservation_member(session_id, key, turn_id)
    assert parse_reservation_member(member) == (session_id, key, turn_id)


# --------------------------------------------------------------------------- indexes


async def test_stale_index_drops_dead_entries_and_rescores_live_ones(
    bundle: RedisBackends,
) -> None:
    idem, client, index = bundle.idempotency, bundle.client, bundle.keys.stale_index
    # Given a finished reservation, an expired (deleted) one and a healthy one, all with index
    # entries pretending to be overdue, plus a malformed member
    for key in ("done", "gone", "live"):
        assert await idem.put_if_absent("s1", key, f"t-{key}", "h", "node-a", LONG, DAY) is None
    assert await mark_done(bundle, "s1", "done", "node-a", Outcome(turn_id="t-done", ok=True), DAY)
    await client.delete(bundle.keys.reservation("s1", "gone"))
    members = {reservation_member("s1", key, f"t-{key}"): 0.0 for key in ("done", "gone", "live")}
    await client.zadd(index, {**members, "garbage": 0.0})
    # When the sweep runs
    stale = await idem.find_stale_in_flight(10)
    # Then nothing is reported, the dead entries are gone and the live one is rescored to its
    # real deadline
    assert stale == []
    live = reservation_member("s1", "live", "t-live")
    assert await client.zrange(index, 0, -1) == [live.encode()]
    score = await client.zscore(index, live)
    assert score is not None and score > 1.0


async def test_a_dead_holders_reservation_is_found_once_made_due(bundle: RedisBackends) -> None:
    idem, client, index = bundle.idempotency, bundle.client, bundle.keys.stale_index
    # Given node-a's reservation, checked by the sweep while node-a lived (rescored far ahead)
    assert await idem.put_if_absent("s1", "k1", "t1", "h", "node-a", LONG, DAY) is None
    assert await idem.find_stale_in_flight(10) == []
    member = reservation_member("s1", "k1", "t1")
    ahead = await client.zscore(index, member)
    # When node-a's incarnation ends
    await kill(bundle, "node-a")
    # Then the sweep does not see it until the dead holder's reservations are made due, then does
    assert ahead is not None and ahead > 1.0
    assert await idem.find_stale_in_flight(10) == []
    assert await idem.expire_holder("node-a") == 1
    assert [r.key for r in await idem.find_stale_in_flight(10)] == ["k1"]


async def test_stale_index_follows_a_take_over_during_a_scan(
    bundle: RedisBackends, monkeypatch: pytest.MonkeyPatch
) -> None:
    idem = bundle.idempotency
    # Given a forwarded message's reservation: reserved by its submitter, then made holderless
    # (stale only after a long forward bound), its index entry still due (score 0)
    assert await idem.put_if_absent("s1", "k1", "t1", "h", "node-a", LONG, DAY) is None
    assert await idem.release_holder("s1", "k1", "node-a", LONG)
    # When node-b takes it over (its deadline: now) after a sweep read the holderless
    # reservation and before that sweep rescores its index entry
    rescore, run_batch = idem._scripts.index_rescore, _idempotency.run_batch
    taken: list[Takeover] = []

    async def take_over_first(client: Any, calls: Sequence[Call]) -> list[Any]:
        if not taken and any(call.script is rescore for call in calls):
            taken.append(await idem.acquire_holder("s1", "k1", "t1", "node-b", 0.0))
        return await run_batch(client, calls)

    monkeypatch.setattr(_idempotency, "run_batch", take_over_first)
    assert await idem.find_stale_in_flight(10) == []
    monkeypatch.undo()
    assert taken == [Takeover(attempt=1)]
    # Then once node-b dies the next sweep finds it stale at once, not after the forward bound
    await kill(bundle, "node-b")
    assert [r.holder for r in await idem.find_stale_in_flight(10)] == ["node-b"]


async def test_finished_reservations_leave_the_stale_index(bundle: RedisBackends) -> None:
    idem, client, index = bundle.idempotency, bundle.client, bundle.keys.stale_index
    # Given reservations finished in every way
    for key in ("done", "reset", "discarded"):
        assert await idem.put_if_absent("s1", key, f"t-{key}", "h", "node-a", LONG, DAY) is None
    await mark_done(bundle, "s1", "done", "node-a", Outcome(turn_id="t-done", ok=True), DAY)
    failed = Outcome(turn_id="t-reset", ok=False, code="HOLDER_LOST")
    await idem.compare_and_reset("s1", "reset", "node-a", failed)
    await idem.discard_reservation("s1", "discarded", "t-discarded")
    # When / Then: the index is empty without any sweep
    assert await client.zcard(index) == 0


async def test_pending_index_heals(bundle: RedisBackends) -> None:
    inbox, client, index = bundle.inbox, bundle.client, bundle.keys.pending_index
    # Given a session whose messages were collected and answered, a ghost entry for an empty
    # inbox, and a queued session whose entry was lost (a crash between the script and the
    # index write)
    await inbox.deliver(envelope("t1", "s-collected"))
    batch = await inbox.collect("s-collected", Priority.LATER, 1)
    await inbox.ack("s-collected", 1, [m.message_id for m in batch.messages])
    await client.zadd(index, {"s-ghost": 0.0})
    await inbox.deliver(envelope("t2", "s-lost"))
    await client.zrem(index, "s-lost")
    # When another message arrives for the lost one and the scan runs
    await inbox.deliver(envelope("t3", "s-lost"))
    await asyncio.sleep(0.2)
    pending = await inbox.pending_sessions(0.1)
    # Then the lost one is indexed and listed again, and the ghost and the answered one are gone
    assert pending == ["s-lost"]
    assert await client.zscore(index, "s-ghost") is None
    assert await client.zscore(index, "s-collected") is None


async def test_deliveries_and_takes_keep_the_pending_index_in_their_scripts(
    bundle: RedisBackends,
) -> None:
    inbox, client, index = bundle.inbox, bundle.client, bundle.keys.pending_index
    # Given two deliveries to an empty inbox
    await inbox.deliver(envelope("t1"))
    first = await client.zscore(index, "s1")
    await inbox.deliver(envelope("t2"))
    # Then the session is indexed at its oldest arrival (the second one leaves the score)
    assert first is not None and await client.zscore(index, "s1") == first
    # When a take leaves entries pending, the entry stays; when one leaves nothing, it goes
    await inbox.collect("s1", Priority.LATER, 1)
    assert await client.zscore(index, "s1") == first
    await inbox.purge("s1")
    assert await client.zscore(index, "s1") is None


async def test_pending_index_rescores_a_too_early_score(bundle: RedisBackends) -> None:
    inbox, client, index = bundle.inbox, bundle.client, bundle.keys.pending_index
    # Given a fresh message whose index score claims it is ancient
    await inbox.deliver(envelope("t1"))
    await client.zadd(index, {"s1": 0.0})
    # When sessions older than an hour are asked for
    pending = await inbox.pending_sessions(3600)
    # Then it is not listed and its score is its real arrival time again
    assert pending == []
    score = await client.zscore(index, "s1")
    assert score is not None and score > 1.0


# --------------------------------------------------------------------------- holder indexes


async def _members(bundle: RedisBackends, index: str) -> set[str]:
    return {member.decode() for member in await bundle.client.smembers(index)}




async def test_holder_lease_index_heals(bundle: RedisBackends) -> None:
    leases, client = bundle.leases, bundle.client
    index = bundle.keys.holder_leases("node-a")
    # Given node-a released one session; then its incarnation ended leaving two leases, one
    # of which node-b took; its new incarnation re-took a third, its index lost the member of a
    # fourth (a crash between script and index write) and holds a ghost and a malformed one
    released = await leases.acquire("s-released", "node-a")
    assert isinstance(released, Lease)
    assert await leases.release(released)
    assert "s-released" not in await _members(bundle, index)
    for session_id in ("s-lost", "s-left", "s-retaken"):
        assert isinstance(await leases.acquire(session_id, "node-a"), Lease)
    await kill(bundle, "node-a")
    taken = await leases.acquire("s-lost", "node-b")
    assert isinstance(taken, Lease)
    await live(bundle, "node-a")
    assert isinstance(await leases.acquire("s-retaken", "node-a"), Lease)
    await leases.acquire("s-unindexed", "node-a")
    await client.srem(index, "s-unindexed")
    await leases.acquire("s-unindexed", "node-a")  # a re-acquire indexes it again
    await client.sadd(index, "s-ghost", "bad{tag}")
    # When node-a's dead leases are revoked
    revoked = await leases.revoke_holder("node-a")
    # Then only the lease its dead incarnation left untaken is revoked, node-b's is untouched,
    # the live incarnation's stay (with their members), and the rest of the index is emptied
    assert revoked == ["s-left"]
    assert await leases.current("s-lost") == taken
    assert await _members(bundle, index) == {"s-retaken", "s-unindexed"}
    assert await leases.revoke_holder("node-a") == []


async def test_holder_reservation_index_heals(bundle: RedisBackends) -> None:
    idem, client = bundle.idempotency, bundle.client
    index, stale_index = bundle.keys.holder_reservations("node-a"), bundle.keys.stale_index
    keys = ("done", "reset", "discarded", "released", "gone", "live")
    for key in keys:
        assert await idem.put_if_absent("s1", key, f"t-{key}", "h", "node-a", LONG, DAY) is None
    assert await _members(bundle, index) == {reservation_member("s1", k, f"t-{k}") for k in keys}
    # Given reservations finished or given up in every way (their members leave at once), one
    # whose hash vanished, a member of an older turn, a malformed member, and the live one's
    # stale-index entry lost (a crash between script and index write)
    await mark_done(bundle, "s1", "done", "node-a", Outcome(turn_id="t-done", ok=True), DAY)
    failed = Outcome(turn_id="t-reset", ok=False, code="HOLDER_LOST")
    await idem.compare_and_reset("s1", "reset", "node-a", failed)
    await idem.discard_reservation("s1", "discarded", "t-discarded")
    await idem.release_holder("s1", "released", "node-a", LONG)
    live = reservation_member("s1", "live", "t-live")
    gone = reservation_member("s1", "gone", "t-gone")
    assert await _members(bundle, index) == {live, gone}
    await client.delete(bundle.keys.reservation("s1", "gone"))
    older = reservation_member("s1", "live", "t-older")
    await client.sadd(index, older, "garbage")
    await client.zrem(stale_index, live)
    # When node-a's incarnation ends and its reservations are expired
    await kill(bundle, "node-a")
    count = await idem.expire_holder("node-a")
    # Then only the live one counts, is indexed as stale again and swept, and it is the only
    # member left
    assert count == 1
    assert await _members(bundle, index) == {live}
    assert [r.key for r in await idem.find_stale_in_flight(10)] == ["live"]
    # And once the sweep resets it, its member leaves too
    assert await idem.compare_and_reset(
        "s1", "live", "node-a", failed.model_copy(update={"turn_id": "t-live"})
    )
    assert await client.exists(index) == 0
    assert await idem.expire_holder("node-a") == 0
