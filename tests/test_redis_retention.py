"""Redis retention: every key the backend writes is removed, expires, or is documented as kept.

The key inventory (README, "Redis memory and retention"):

- per session, no TTL on purpose: `record` and `transcript` (the session's durable history,
  removed by delete);
- per session with a TTL: `lease` (its expiry), `tokens` (the last lease's expiry + token_ttl),
  `inbox:<tier>` (inbox_ttl after the last delivery; removed whole when collected), `idem:<key>`
  (the primary TTL), `turn:<turn id>` (the reservation's TTL as reserved), `events`
  (event_log_ttl after the last append or delete), `chat` (event_log_ttl after it was set);
- cluster-wide, no TTL on purpose: `idx:stale`, `idx:pending` (one each per namespace, members
  verified and dropped by the scans);
- per holder with a TTL: `holder:<node>:leases` and `holder:<node>:idem` (twice the lease /
  staleness TTL after the holder's last acquire, renewal, reservation or touch).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stickless import SubmitKind
from stickless._errors import EventCursorTrimmedError
from stickless._events import TextDelta
from stickless._types import UserInput
from stickless.backends.base import HOLDER_INDEX_TTL, Lease
from stickless.backends.memory import MemoryBackends
from stickless.backends.redis import RedisBackends
from stickless.testing import LocalCluster
from stickless.wire import Envelope, encode_event
from tests.liveness import acquire_lease, kill, live

from .agents import Journal, ScriptedOpener, req, wait_until
from .conftest import FAST

#: Per-session key suffixes kept without a TTL on purpose (removed by delete).
DURABLE_SESSION_KEYS = {"record", "transcript"}
#: What a held session also keeps without a TTL: its lease, valid while the holder's liveness
#: key (which expires) lives, and dropped by release, delete or the dead-holder sweep.
HELD_SESSION_KEYS = {"lease"}


def _cluster_wide(namespace: str) -> set[str]:
    """Keys kept without a TTL on purpose: one of each per namespace."""
    return {f"{namespace}:idx:stale", f"{namespace}:idx:pending", f"{namespace}:idx:live"}


async def _keys_with_ttls(bundle: RedisBackends) -> dict[str, int]:
    """Every key of the bundle's namespace with its PTTL (-1: none)."""
    keys = sorted(
        [
            key.decode()
            async for key in bundle.client.scan_iter(match=f"*{bundle.namespace}*", count=1000)
        ]
    )
    ttls = [await bundle.client.pttl(key) for key in keys]
    return dict(zip(keys, ttls, strict=True))


def _session_part(key: str, namespace: str, session_id: str) -> str | None:
    """The suffix of a key of `session_id` ('record', 'idem:k', ...), or None."""
    tag = f"{{{namespace}:s:{session_id}}}:"
    return key[len(tag) :] if key.startswith(tag) else None


async def _run_a_session_life(cluster: LocalCluster, session_id: str) -> None:
    """Turns through every node (so some are forwarded through the inbox), with and without keys,
    and a resumed event read."""
    a, b, c = cluster.nodes
    first = await a.submit(req(session_id, "one", idempotency_key="k-one"))
    await first.result
    dispositions = await asyncio.gather(
        *(node.submit(req(session_id, f"m{i}")) for i, node in enumerate([b, c, b, c]))
    )
    assert SubmitKind.FORWARDED in {d.kind for d in dispositions}
    await asyncio.gather(*(d.result for d in dispositions))
    keyed = await b.submit(req(session_id, "keyed", idempotency_key="k-two"))
    await keyed.result
    log = await cluster.backends.events.read(session_id, None, 1000)
    assert log


@pytest.fixture
async def cluster(redis_url: str, journal: Journal) -> AsyncIterator[LocalCluster]:
    running = LocalCluster.over_redis(
        redis_url, 3, namespace=f"r{uuid.uuid4().hex[:8]}", opener=ScriptedOpener(journal), **FAST
    )
    async with running:
        yield running


async def test_deleted_session_leaves_no_key_without_a_ttl(cluster: LocalCluster) -> None:
    bundle = cluster.backends
    assert isinstance(bundle, RedisBackends)
    ns = bundle.namespace
    # Given a session that lived a full life on every node, and another one left alive
    await _run_a_session_life(cluster, "s-gone")
    await (await cluster.nodes[0].submit(req("s-kept", "stay"))).result
    # When it is deleted (through a node that does not hold it)
    await cluster.nodes[2].delete_session("s-gone")
    keys = await _keys_with_ttls(bundle)
    # Then none of its durable keys remain, and every key of it that does remain has a TTL
    remaining = {
        part: ttl for key, ttl in keys.items() if (part := _session_part(key, ns, "s-gone"))
    }
    assert not DURABLE_SESSION_KEYS & set(remaining), remaining
    assert not {"lease", "inbox:0", "inbox:1", "inbox:2"} & set(remaining), remaining
    assert all(ttl > 0 for ttl in remaining.values()), remaining
    # ...every key outside the sessions' slots has a TTL unless it is a documented index
    for key, ttl in keys.items():
        if not key.startswith("{") and key not in _cluster_wide(ns):
            assert ttl > 0, key
    # ...and no index still names the deleted session
    client = bundle.client
    assert await client.zscore(bundle.keys.pending_index, "s-gone") is None
    stale = [m.decode() for m in await client.zrange(bundle.keys.stale_index, 0, -1)]
    assert not [m for m in stale if "s-gone" in m], stale
    for node in cluster.nodes:
        members = await client.smembers(bundle.keys.holder_leases(node.node_id))
        assert b"s-gone" not in members
        held = await client.smembers(bundle.keys.holder_reservations(node.node_id))
        assert not [m for m in held if b"s-gone" in m]


async def test_live_idle_session_keys_have_a_ttl_or_a_documented_reason(
    cluster: LocalCluster,
) -> None:
    bundle = cluster.backends
    assert isinstance(bundle, RedisBackends)
    ns = bundle.namespace
    # Given a session that lived through turns on every node and now sits idle on its holder
    await _run_a_session_life(cluster, "s-idle")
    holder = await bundle.leases.current("s-idle")
    assert holder is not None
    # When the keyspace is listed
    keys = await _keys_with_ttls(bundle)
    # Then the session's keys without a TTL are exactly its durable history, every other key of
    # the namespace has a TTL unless it is a documented cluster-wide index
    parts = {part: ttl for key, ttl in keys.items() if (part := _session_part(key, ns, "s-idle"))}
    assert {"lease", "tokens", "record", "transcript", "events"} <= set(parts), parts
    assert {part for part, ttl in parts.items() if ttl < 0} == (
        DURABLE_SESSION_KEYS | HELD_SESSION_KEYS
    ), parts
    for key, ttl in keys.items():
        if not key.startswith("{") and key not in _cluster_wide(ns):
            assert ttl > 0, key
    assert keys[bundle.keys.holder_leases(holder.holder)] > 0


# --------------------------------------------------------------------------- one key at a time


@pytest.fixture
async def bundle(redis_url: str) -> AsyncIterator[RedisBackends]:
    backends = RedisBackends.from_url(
        redis_url,
        namespace="ret",
        event_log_max_len=100,
        event_log_ttl=30.0,
        token_ttl=600.0,
        inbox_ttl=120.0,
    )
    for holder in ("node-a", "node-b"):
        await live(backends, holder)
    yield backends
    await backends.aclose()


def _frames(count: int) -> list[Any]:
    return [TextDelta(session_id="s1", turn_id="t1", seq=n, text="x") for n in range(count)]


async def test_event_log_expires_after_its_last_append_or_delete(bundle: RedisBackends) -> None:
    stream = bundle.keys.event_log("s1")
    # When frames are appended, the stream expires event_log_ttl later
    await bundle.events.append("s1", _frames(3))
    assert 29_000 < await bundle.client.pttl(stream) <= 30_000
    # ...a later append refreshes it, and so does a delete, whose tombstone expires too
    await bundle.client.pexpire(stream, 5_000)
    await bundle.events.append("s1", _frames(1))
    assert await bundle.client.pttl(stream) > 29_000
    await bundle.client.pexpire(stream, 5_000)
    await bundle.events.delete("s1")
    assert await bundle.client.xlen(stream) == 0
    assert await bundle.client.pttl(stream) > 29_000


async def test_chat_stream_pointer_expires_with_the_event_log(bundle: RedisBackends) -> None:
    pointer = bundle.keys.chat_stream("s1")
    await bundle.chat_streams.started("s1", "t1")
    assert 29_000 < await bundle.client.pttl(pointer) <= 30_000
    await bundle.client.pexpire(pointer, 5_000)
    await bundle.chat_streams.started("s1", "t2")  # the next turn sets it anew
    assert await bundle.client.pttl(pointer) > 29_000


async def test_event_log_keeps_exactly_its_bound(bundle: RedisBackends) -> None:
    for _ in range(5):
        await bundle.events.append("s1", _frames(60))
    assert await bundle.client.xlen(bundle.keys.event_log("s1")) == 100


async def test_a_stream_over_the_bound_reads_as_trimmed_at_the_bound(
    bundle: RedisBackends,
) -> None:
    # Given a stream holding more than the bound (written with approximate trimming by an older
    # version, or under a larger bound)
    stream = bundle.keys.event_log("s1")
    ids = [
        (await bundle.client.xadd(stream, {"f": encode_event(frame)})).decode()
        for frame in _frames(150)
    ]
    # Then readers see the newest 100; the 50 beyond count as dropped
    read = [e.event_id for e in await bundle.events.read("s1", None, 1000)]
    assert read == ids[-100:]
    assert [e.event_id for e in await bundle.events.read("s1", ids[49], 1000)] == ids[-100:]
    with pytest.raises(EventCursorTrimmedError) as raised:
        await bundle.events.read("s1", ids[10], 1000)
    assert raised.value.oldest_id == ids[50]
    # ...and the next append trims the stream to the bound and gives it a TTL
    await bundle.events.append("s1", _frames(1))
    assert await bundle.client.xlen(stream) == 100
    assert await bundle.client.pttl(stream) > 0


async def test_token_counter_expires_and_tokens_never_go_back(bundle: RedisBackends) -> None:
    counter = bundle.keys.token_counter("s1")
    # Given a session leased and released a few times, its record fenced by the last token
    last = None
    for _ in range(3):
        lease = await acquire_lease(bundle, "s1", "node-a", 10.0)
        assert isinstance(lease, Lease)
        await bundle.records.provision("s1", "agent-a", lease.token)
        assert await bundle.leases.release(lease)
        last = lease
    assert last is not None
    # Then the counter expires token_ttl after the last grant (the expiry is rounded up to a
    # whole millisecond, so it may read one more)
    assert 590_000 < await bundle.client.pttl(counter) <= 600_001
    # When the counter is gone (expired, or lost with a restarted server)
    await bundle.client.delete(counter)
    fresh = await acquire_lease(bundle, "s1", "node-b", 10.0)
    # Then the next token is still above every token issued before, so the old holder stays
    # fenced out and the record (fenced by the last token) can still be provisioned
    assert isinstance(fresh, Lease)
    assert fresh.token > last.token
    assert await bundle.records.provision("s1", "agent-a", fresh.token) == "agent-a"
    # ...and the next grant keeps the counter alive
    assert await bundle.leases.release(fresh)
    await bundle.client.pexpire(counter, 1_000)
    assert isinstance(await acquire_lease(bundle, "s1", "node-b", 10.0), Lease)
    assert await bundle.client.pttl(counter) > 590_000


async def test_inbox_tier_expires_after_its_last_delivery(bundle: RedisBackends) -> None:
    envelope = Envelope(
        session_id="s1", turn_id="t1", agent_ref="a", input=UserInput.text("hi"), key="k"
    )
    await bundle.inbox.deliver(envelope)
    tier = bundle.keys.inbox("s1")[int(envelope.priority)]
    assert 119_000 < await bundle.client.pttl(tier) <= 120_000
    await bundle.client.pexpire(tier, 1_000)
    await bundle.inbox.deliver(envelope.model_copy(update={"turn_id": "t2"}))
    assert await bundle.client.pttl(tier) > 119_000


async def test_holder_indexes_expire_when_their_holder_stops(bundle: RedisBackends) -> None:
    leases = bundle.keys.holder_leases("node-a")
    held = bundle.keys.holder_reservations("node-a")
    hour = int(HOLDER_INDEX_TTL * 1000)
    # A lease and a reservation give the holder's indexes HOLDER_INDEX_TTL
    lease = await acquire_lease(bundle, "s1", "node-a")
    assert isinstance(lease, Lease)
    assert await bundle.idempotency.put_if_absent("s1", "k", "t1", "h", "node-a", 5.0, 60.0) is None
    for index in (leases, held):
        assert hour - 5_000 < await bundle.client.pttl(index) <= hour
    # ...and each liveness renewal pushes both later again (never earlier)
    await bundle.client.pexpire(leases, 1_000)
    await bundle.client.pexpire(held, 1_000)
    incarnation = await live(bundle, "node-a")
    assert await bundle.liveness.renew("node-a", incarnation, 10.0, HOLDER_INDEX_TTL)
    for index in (leases, held):
        assert hour - 5_000 < await bundle.client.pttl(index) <= hour
    assert await bundle.liveness.renew("node-a", incarnation, 10.0, 1.0)
    assert await bundle.client.pttl(held) > hour - 5_000
    # A take-over gives the taker's index the same
    assert await bundle.idempotency.release_holder("s1", "k", "node-a", 30.0)
    await bundle.idempotency.acquire_holder("s1", "k", "t1", "node-b", 5.0)
    assert await bundle.client.pttl(bundle.keys.holder_reservations("node-b")) > hour - 5_000


async def test_release_that_keeps_a_newer_lease_keeps_the_index_member(
    bundle: RedisBackends,
) -> None:
    # Given a holder that re-acquired its session under a new incarnation, releasing the old one
    old = await acquire_lease(bundle, "s1", "node-a")
    assert isinstance(old, Lease)
    await kill(bundle, "node-a")
    new = await acquire_lease(bundle, "s1", "node-a")
    assert isinstance(new, Lease) and new.token > old.token
    assert not await bundle.leases.release(old)
    # Then the holder index still names the session, and the next renewal gives it a TTL
    index = bundle.keys.holder_leases("node-a")
    assert await bundle.client.sismember(index, "s1")
    assert await bundle.liveness.renew("node-a", await live(bundle, "node-a"), 10.0, 30.0)
    assert await bundle.client.pttl(index) > 0


@pytest.mark.parametrize(
    "knob", [{"event_log_ttl": 0}, {"token_ttl": -1.0}, {"inbox_ttl": float("nan")}]
)
def test_retention_knobs_are_validated(redis_url: str, knob: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RedisBackends.from_url(redis_url, namespace="bad", **knob)  # type: ignore[arg-type]


def test_memory_event_log_ttl_is_validated() -> None:
    with pytest.raises(ValueError):
        MemoryBackends(event_log_ttl=0)


async def test_expired_holder_index_costs_only_the_revoke_shortcut(
    bundle: RedisBackends,
) -> None:
    # Given a lease whose holder index expired (the holder stopped renewing long ago)
    lease = await acquire_lease(bundle, "s1", "node-c", 0.3)
    assert isinstance(lease, Lease)
    await bundle.client.delete(bundle.keys.holder_leases("node-c"))
    # Then revoking the holder finds nothing, and the lease still ends with its liveness
    assert await bundle.leases.revoke_holder("node-c") == []

    async def gone() -> bool:
        return await bundle.leases.current("s1") is None

    await wait_until(gone, within=5.0)
