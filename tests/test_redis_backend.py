"""Redis-specific behaviour: key layout, script reloads, reconnects, index healing, bounds."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot
from redis.exceptions import RedisError

from stickless import (
    Priority,
    TextDelta,
    TranscriptEntry,
    UserInput,
)
from stickless.backends.base import Lease, ReservationRef, ReservationState
from stickless.backends.redis import RedisBackends
from stickless.backends.redis._keys import parse_reservation_member, reservation_member
from stickless.wire import Envelope, Outcome, Signal, SignalKind

from .redis_fixture import RedisServer, redis_executable

NS = "t"
LONG = 60.0
DAY = 86400.0


@pytest.fixture
async def bundle(redis_url: str) -> AsyncIterator[RedisBackends]:
    """A bundle over the flushed session server."""
    backends = RedisBackends.from_url(redis_url, namespace=NS, event_log_max_len=100)
    yield backends
    await backends.aclose()


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone (it may be stopped and restarted), AOF persisted."""
    server = RedisServer(tmp_path, appendonly=True, executable=redis_executable())
    server.start()
    yield server
    server.stop()


def _envelope(turn_id: str, session_id: str = "s1", **extra: Any) -> Envelope:
    return Envelope(
        session_id=session_id,
        turn_id=turn_id,
        agent_ref="agent-a",
        input=UserInput.text(f"input of {turn_id}"),
        key=f"key-{turn_id}",
        **extra,
    )


def _signal(kind: SignalKind, session_id: str = "s1", **payload: object) -> Signal:
    return Signal(kind=kind, session_id=session_id, origin="node-a", payload=payload)


class _Recorder:
    """A signal handler that queues what it receives, for the test to await."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[Signal] = asyncio.Queue()

    async def __call__(self, signal: Signal) -> None:
        await self.received.put(signal)

    async def next(self) -> Signal:
        return await asyncio.wait_for(self.received.get(), 5.0)


async def _publish_until_heard(
    backends: RedisBackends, recorder: _Recorder, kind: SignalKind
) -> Signal:
    """Publish markers until one arrives (signals sent while disconnected are lost)."""
    for n in range(200):
        await backends.signals.publish(_signal(kind, marker=n))
        try:
            return await asyncio.wait_for(recorder.received.get(), 0.05)
        except TimeoutError:
            continue
    pytest.fail("no signal arrived after the reconnect")


async def _exercise_session(backends: RedisBackends, session_id: str) -> Lease:
    """Touch every storage role for one session."""
    lease = await backends.leases.acquire(session_id, "node-a", LONG)
    assert isinstance(lease, Lease)
    await backends.records.provision(session_id, "agent-a", lease.token)
    await backends.records.commit(
        session_id, lease.token, "t1", [TranscriptEntry(role="user", content="hi")]
    )
    await backends.inbox.deliver(_envelope("t1", session_id))
    await backends.inbox.deliver(_envelope("t2", session_id, priority=Priority.NOW))
    assert (
        await backends.idempotency.put_if_absent(session_id, "k1", "t1", "h", "node-a", LONG, DAY)
        is None
    )
    await backends.events.append(
        session_id, [TextDelta(session_id=session_id, turn_id="t1", seq=0, text="x")]
    )
    return lease


async def _all_keys(backends: RedisBackends) -> list[str]:
    return sorted([key.decode() async for key in backends.client.scan_iter()])


# --------------------------------------------------------------------------- layout


async def test_keys_of_one_session_share_one_hash_tag(bundle: RedisBackends) -> None:
    # Given every role used for two sessions
    for session_id in ("s1", "user/42:chat"):
        await _exercise_session(bundle, session_id)
    # When the keyspace is listed
    keys = await _all_keys(bundle)
    # Then each session's keys carry its own hash tag (so they map to one slot), and only the
    # cluster-wide indexes (two, plus the holder's lease and reservation indexes) live outside
    # every session's slot
    for session_id in ("s1", "user/42:chat"):
        tag = f"{{{NS}:s:{session_id}}}"
        own = [key for key in keys if key.startswith(tag + ":")]
        suffixes = {key[len(tag) + 1 :] for key in own}
        assert suffixes == {
            "lease",
            "tokens",
            "record",
            "transcript",
            "inbox:0",
            "inbox:1",
            "idem:k1",
            "events",
        }
        assert {key_slot(key.encode()) for key in own} == {key_slot(tag.encode())}
    untagged = [key for key in keys if not key.startswith("{")]
    assert untagged == [
        f"{NS}:holder:node-a:idem",
        f"{NS}:holder:node-a:leases",
        f"{NS}:idx:pending",
        f"{NS}:idx:stale",
    ]


async def test_namespaces_do_not_share_keys(redis_url: str) -> None:
    # Given two bundles with different namespaces on one server
    first = RedisBackends.from_url(redis_url, namespace="app-a")
    second = RedisBackends.from_url(redis_url, namespace="app-b")
    try:
        # When both lease the same session id
        a = await first.leases.acquire("s1", "node-a", LONG)
        b = await second.leases.acquire("s1", "node-b", LONG)
        # Then both win: the sessions are distinct
        assert isinstance(a, Lease) and isinstance(b, Lease)
    finally:
        await first.aclose()
        await second.aclose()


async def test_password_in_the_url_is_used(tmp_path: Path) -> None:
    # Given a server that requires a password
    server = RedisServer(tmp_path, password="s3cret", executable=redis_executable())
    server.start()
    with_password = RedisBackends.from_url(server.url, namespace=NS, socket_timeout=1.0)
    without = RedisBackends.from_url(
        server.url.replace(":s3cret@", ""), namespace=NS, socket_timeout=1.0
    )
    try:
        # When both bundles are used / Then only the one with the password gets in
        assert isinstance(await with_password.leases.acquire("s1", "node-a", LONG), Lease)
        with pytest.raises(RedisError):
            await without.leases.current("s1")
    finally:
        await with_password.aclose()
        await without.aclose()
        server.stop()


def test_names_with_braces_are_refused(redis_url: str) -> None:
    # Given / When / Then: a brace would break the hash tag, so it is refused
    with pytest.raises(ValueError):
        RedisBackends.from_url(redis_url, namespace="a{b}")


async def test_clone_has_its_own_pool(bundle: RedisBackends) -> None:
    # Given a bundle and its clone
    clone = bundle.clone()
    try:
        # When the clone is inspected and used
        lease = await clone.leases.acquire("s1", "node-a", LONG)
        # Then it has its own pool over the same data
        assert clone.client.connection_pool is not bundle.client.connection_pool
        assert await bundle.leases.current("s1") == lease
        assert clone.distributed and clone.namespace == NS
    finally:
        await clone.aclose()


async def test_clone_serves_another_threads_loop(bundle: RedisBackends) -> None:
    # Given a lease and a clone made on this thread (as the router makes its renewal bundle)
    lease = await bundle.leases.acquire("s1", "node-a", 5.0)
    assert isinstance(lease, Lease)
    clone = bundle.clone()
    renewed: list[Lease | None] = []

    async def renew_twice() -> None:
        for _ in range(2):
            renewed.extend(await clone.leases.renew_many([lease], LONG))
        await clone.aclose()

    # When another thread renews through it on its own event loop
    thread = threading.Thread(target=asyncio.run, args=(renew_twice(),))
    thread.start()
    await asyncio.to_thread(thread.join, 10)
    # Then both renewals succeeded
    assert [r is not None and r.token == lease.token for r in renewed] == [True, True]


@given(st.text(min_size=1), st.text(), st.text())
def test_stale_index_members_round_trip(session_id: str, key: str, turn_id: str) -> None:
    # Given any session id, key and turn id (digits and ':' included)
    # When they are encoded as an index member and parsed back
    # Then the same three come back
    member = reservation_member(session_id, key, turn_id)
    assert parse_reservation_member(member) == (session_id, key, turn_id)


def test_missing_redis_py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given redis-py cannot be found
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a)
    )
    monkeypatch.delitem(sys.modules, "stickless.backends.redis")
    # When the backend is imported
    with pytest.raises(ImportError) as caught:
        importlib.import_module("stickless.backends.redis")
    # Then the error names the extra to install
    assert "stickless[redis]" in str(caught.value)


# --------------------------------------------------------------------------- scripts


async def test_scripts_survive_script_flush(bundle: RedisBackends) -> None:
    # Given a lease and a reservation, then the server forgets every script
    lease = await bundle.leases.acquire("s1", "node-a", LONG)
    assert isinstance(lease, Lease)
    await bundle.idempotency.put_if_absent("s1", "k1", "t1", "h", "node-a", LONG, DAY)
    await bundle.client.script_flush()
    # When single and pipelined script calls run
    renewed = await bundle.leases.renew_many([lease], LONG)
    await bundle.client.script_flush()
    await bundle.idempotency.touch_many([ReservationRef("s1", "k1", "node-a")], LONG)
    await bundle.client.script_flush()
    current = await bundle.leases.current("s1")
    # Then they reload their scripts and work
    assert renewed[0] is not None and current == renewed[0]
    found = await bundle.idempotency.find("s1", "k1")
    assert found is not None and found.state is ReservationState.IN_FLIGHT


async def test_restarted_server_is_used_again(private_server: RedisServer) -> None:
    # Given a bundle with state on a persisted server
    backends = RedisBackends.from_url(private_server.url, namespace=NS, socket_timeout=1.0)
    try:
        lease = await backends.leases.acquire("s1", "node-a", LONG)
        assert isinstance(lease, Lease)
        # When the server restarts on the same port (empty script cache, same data)
        old_pid = private_server.pid
        private_server.restart()
        assert private_server.pid != old_pid
        # Then the same bundle reconnects, reloads its scripts and sees the data
        assert await backends.leases.renew_many([lease], LONG) != [None]
        assert (
            await backends.leases.acquire("s1", "node-a", LONG)
        ) == await backends.leases.current("s1")
    finally:
        await backends.aclose()


async def test_stopped_server_fails_calls_then_recovers(private_server: RedisServer) -> None:
    # Given a bundle with a short socket timeout, and the server stopped
    backends = RedisBackends.from_url(private_server.url, namespace=NS, socket_timeout=1.0)
    try:
        lease = await backends.leases.acquire("s1", "node-a", LONG)
        assert isinstance(lease, Lease)
        private_server.stop()
        # When calls of every kind are made
        frame = TextDelta(session_id="s1", turn_id="t", seq=0, text="x")
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: backends.leases.current("s1"),
            lambda: backends.leases.renew_many([lease], LONG),
            lambda: backends.inbox.deliver(_envelope("t1")),
            lambda: backends.idempotency.find_stale_in_flight(10),
            lambda: backends.events.append("s1", [frame]),
            lambda: backends.signals.publish(_signal(SignalKind.STATUS)),
            lambda: backends.signals.subscribe(_Recorder()),
        ]
        # Then each raises (bounded by the socket timeout, never hanging)
        for call in calls:
            with pytest.raises((RedisError, OSError)):
                await asyncio.wait_for(call(), 10)
        # And once the server is back on the same port, calls succeed again
        private_server.start()
        assert await backends.leases.current("s1") == lease
        recorder = _Recorder()
        await backends.signals.subscribe(recorder)
        await backends.signals.publish(_signal(SignalKind.STATUS, n=1))
        assert (await recorder.next()).payload == {"n": 1}
    finally:
        await backends.aclose()


async def test_frozen_server_times_out_and_pubsub_notices(
    private_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a subscribed bundle with short timeouts and a fast keepalive
    monkeypatch.setattr("stickless.backends.redis._signals._KEEPALIVE", 0.2)
    monkeypatch.setattr("stickless.backends.redis._signals._POLL", 0.1)
    backends = RedisBackends.from_url(private_server.url, namespace=NS, socket_timeout=0.5)
    control = _Recorder()
    pid = private_server.pid
    assert pid is not None
    try:
        await backends.signals.subscribe(control)
        # When the server process freezes (connections stay open, nothing answers)
        os.kill(pid, signal.SIGSTOP)
        try:
            # Then a call times out instead of hanging, and the reader gives up on the silence
            with pytest.raises(RedisError):
                await asyncio.wait_for(backends.leases.current("s1"), 10)
            for _ in range(100):
                if "stopped answering PING" in caplog.text:
                    break
                await asyncio.sleep(0.05)
            assert "stopped answering PING" in caplog.text
        finally:
            os.kill(pid, signal.SIGCONT)
        # And once it thaws, calls and signals work again
        assert await backends.leases.current("s1") is None
        await _publish_until_heard(backends, control, SignalKind.STATUS)
    finally:
        await backends.aclose()


# --------------------------------------------------------------------------- pub/sub


async def test_pubsub_reconnects_and_resubscribes_after_client_kill(
    bundle: RedisBackends, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a control subscriber and an event subscriber, both working
    control, events = _Recorder(), _Recorder()
    await bundle.signals.subscribe(control)
    await bundle.signals.subscribe_events("s1", events)
    await bundle.signals.publish(_signal(SignalKind.STATUS, n=0))
    assert (await control.next()).payload == {"n": 0}
    # When the server kills every pub/sub connection
    killed = await bundle.client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")  # type: ignore[no-untyped-call]
    assert killed >= 1
    # Then both channels deliver again after the reader reconnected, in order
    await _publish_until_heard(bundle, control, SignalKind.STATUS)
    await _publish_until_heard(bundle, events, SignalKind.EVENT)
    batch = [_signal(SignalKind.STATUS, n=n) for n in range(20)]
    await bundle.signals.publish_many(batch)
    assert [await control.next() for _ in batch] == batch
    assert "reconnecting" in caplog.text


async def test_garbage_and_oversized_pubsub_messages_are_dropped(
    bundle: RedisBackends, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a control subscriber, and a frame bound of 1 KiB
    monkeypatch.setattr("stickless.wire.MAX_FRAME_BYTES", 1024)
    control = _Recorder()
    await bundle.signals.subscribe(control)
    channel = bundle.keys.control_channel
    # When garbage, an oversized signal and a valid one are published
    await bundle.client.publish(channel, b"\xc1 not msgpack")
    await bundle.client.publish(channel, _signal(SignalKind.STATUS, blob="x" * 4096).encode())
    good = _signal(SignalKind.INTERRUPT, reason="USER")
    await bundle.signals.publish(good)
    # Then only the valid one is delivered
    assert await control.next() == good


async def test_event_channel_is_subscribed_only_while_needed(bundle: RedisBackends) -> None:
    # Given an event subscriber for s1
    await bundle.signals.subscribe_events("s1", _Recorder())
    channel = bundle.keys.event_channel("s1")

    async def subscribers() -> int:
        counts = await bundle.client.pubsub_numsub(channel)
        return int(counts[0][1])

    assert await subscribers() == 1
    # When it unsubscribes
    await bundle.signals.unsubscribe_events("s1")
    # Then the server no longer routes that channel to this node
    for _ in range(100):
        if await subscribers() == 0:
            break
        await asyncio.sleep(0.02)
    assert await subscribers() == 0


# --------------------------------------------------------------------------- indexes


async def test_stale_index_drops_dead_entries_and_rescores_live_ones(
    bundle: RedisBackends,
) -> None:
    idem, client, index = bundle.idempotency, bundle.client, bundle.keys.stale_index
    # Given a finished reservation, an expired (deleted) one and a healthy one, all with index
    # entries pretending to be overdue, plus a malformed member
    for key in ("done", "gone", "live"):
        assert await idem.put_if_absent("s1", key, f"t-{key}", "h", "node-a", LONG, DAY) is None
    assert await idem.mark_done("s1", "done", "node-a", Outcome(turn_id="t-done", ok=True), DAY)
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


async def test_stale_index_follows_a_deadline_moved_earlier(bundle: RedisBackends) -> None:
    idem = bundle.idempotency
    # Given a reservation with a long bound, touched with a short one
    assert await idem.put_if_absent("s1", "k1", "t1", "h", "node-a", LONG, DAY) is None
    await idem.touch_many([ReservationRef("s1", "k1", "node-a")], 0.1)
    # When the short bound passes
    await asyncio.sleep(0.3)
    # Then the sweep finds it
    assert [r.key for r in await idem.find_stale_in_flight(10)] == ["k1"]


async def test_finished_reservations_leave_the_stale_index(bundle: RedisBackends) -> None:
    idem, client, index = bundle.idempotency, bundle.client, bundle.keys.stale_index
    # Given reservations finished in every way
    for key in ("done", "reset", "discarded"):
        assert await idem.put_if_absent("s1", key, f"t-{key}", "h", "node-a", LONG, DAY) is None
    await idem.mark_done("s1", "done", "node-a", Outcome(turn_id="t-done", ok=True), DAY)
    failed = Outcome(turn_id="t-reset", ok=False, code="HOLDER_LOST")
    await idem.compare_and_reset("s1", "reset", "node-a", failed)
    await idem.discard_reservation("s1", "discarded", "t-discarded")
    # When / Then: the index is empty without any sweep
    assert await client.zcard(index) == 0


async def test_pending_index_heals(bundle: RedisBackends) -> None:
    inbox, client, index = bundle.inbox, bundle.client, bundle.keys.pending_index
    # Given a collected session (its entry is removed), a ghost entry for an empty inbox, and
    # a queued session whose entry was lost (a crash between the script and the index write)
    await inbox.deliver(_envelope("t1", "s-collected"))
    await inbox.collect("s-collected", Priority.LATER)
    assert await client.zscore(index, "s-collected") is None
    await client.zadd(index, {"s-ghost": 0.0})
    await inbox.deliver(_envelope("t2", "s-lost"))
    await client.zrem(index, "s-lost")
    # When another message arrives for the lost one and the scan runs
    await inbox.deliver(_envelope("t3", "s-lost"))
    await asyncio.sleep(0.2)
    pending = await inbox.pending_sessions(0.1)
    # Then the lost one is indexed and listed again, and the ghost is gone
    assert pending == ["s-lost"]
    assert await client.zscore(index, "s-ghost") is None


async def test_pending_index_rescores_a_too_early_score(bundle: RedisBackends) -> None:
    inbox, client, index = bundle.inbox, bundle.client, bundle.keys.pending_index
    # Given a fresh message whose index score claims it is ancient
    await inbox.deliver(_envelope("t1"))
    await client.zadd(index, {"s1": 0.0})
    # When sessions older than an hour are asked for
    pending = await inbox.pending_sessions(3600)
    # Then it is not listed and its score is its real arrival time again
    assert pending == []
    score = await client.zscore(index, "s1")
    assert score is not None and score > 1.0


# --------------------------------------------------------------------------- bounds


async def test_event_log_trimming_is_approximate_but_bounded(bundle: RedisBackends) -> None:
    # Given ten times the bound appended (the bundle keeps 100)
    ids: list[str] = []
    for batch in range(10):
        frames = [
            TextDelta(session_id="s1", turn_id="t1", seq=batch * 100 + n, text="x")
            for n in range(100)
        ]
        ids += await bundle.events.append("s1", frames)
    # When the stream and the log are read
    stored = await bundle.client.xlen(bundle.keys.event_log("s1"))
    read = await bundle.events.read("s1", None, 10_000)
    # Then the stream holds roughly the bound (whole nodes are trimmed), and readers see exactly
    # the newest 100, also when resuming from an id that was trimmed or hidden
    assert 100 <= stored < 300
    assert [e.event_id for e in read] == ids[-100:]
    resumed = await bundle.events.read("s1", ids[0], 10_000)
    assert [e.event_id for e in resumed] == ids[-100:]
    assert [e.event_id for e in await bundle.events.read("s1", ids[-3], 10)] == ids[-2:]


async def test_unreadable_stream_entries_are_contained(
    bundle: RedisBackends, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a frame bound of 1 KiB, an oversized envelope, a raw entry without the envelope
    # field, and a good message
    monkeypatch.setattr("stickless.wire.MAX_FRAME_BYTES", 1024)
    big = await bundle.inbox.deliver(_envelope("big", submit_options={"pad": "x" * 4096}))
    raw_stream = bundle.keys.inbox("s1")[int(Priority.NEXT)]
    added = await bundle.client.xadd(raw_stream, {"other": b"\x00"})
    raw_id = added.decode() if isinstance(added, bytes) else added
    good = await bundle.inbox.deliver(_envelope("good"))
    # When the session is collected
    batch = await bundle.inbox.collect("s1", Priority.LATER)
    # Then the good one is readable and the other two are unreadable, each logged once
    assert [m.message_id for m in batch.messages] == [good]
    unreadable = {u.message_id: u for u in batch.unreadable}
    assert set(unreadable) == {big, f"{int(Priority.NEXT)}:{raw_id}"}
    assert "exceeds" in unreadable[big].reason
    assert all(u.turn_id is None for u in batch.unreadable)
    assert "x" * 100 not in caplog.text
    assert await bundle.inbox.is_empty("s1")


# --------------------------------------------------------------------------- holder indexes


async def _members(bundle: RedisBackends, index: str) -> set[str]:
    return {member.decode() for member in await bundle.client.smembers(index)}


async def _until_expired(bundle: RedisBackends, session_id: str) -> None:
    for _ in range(100):
        if await bundle.leases.current(session_id) is None:
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"the lease of {session_id} did not expire")


async def test_holder_lease_index_heals(bundle: RedisBackends) -> None:
    leases, client = bundle.leases, bundle.client
    index = bundle.keys.holder_leases("node-a")
    # Given node-a released one session, lost another to node-b after it expired, re-took a
    # third after it expired (so its old lease is stale), and its index also lost the member of
    # a fourth (a crash between script and index write) and holds a ghost and a malformed one
    released = await leases.acquire("s-released", "node-a", LONG)
    assert isinstance(released, Lease)
    assert await leases.release(released)
    assert "s-released" not in await _members(bundle, index)
    await leases.acquire("s-lost", "node-a", 0.1)
    old = await leases.acquire("s-retaken", "node-a", 0.1)
    assert isinstance(old, Lease)
    await _until_expired(bundle, "s-lost")
    await _until_expired(bundle, "s-retaken")
    taken = await leases.acquire("s-lost", "node-b", LONG)
    assert isinstance(taken, Lease)
    await leases.acquire("s-retaken", "node-a", LONG)
    assert not await leases.release(old)  # a stale lease: the member of the new one stays
    await leases.acquire("s-unindexed", "node-a", LONG)
    await client.srem(index, "s-unindexed")
    await leases.acquire("s-unindexed", "node-a", LONG)  # a refresh indexes it again
    await client.sadd(index, "s-ghost", "bad{tag}")
    # When node-a is revoked
    revoked = await leases.revoke_holder("node-a")
    # Then only its live leases are revoked, node-b's lease is untouched, and the index is
    # emptied (revoked and dead members alike)
    assert sorted(revoked) == ["s-retaken", "s-unindexed"]
    assert await leases.current("s-lost") == taken
    assert await client.exists(index) == 0
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
    await idem.mark_done("s1", "done", "node-a", Outcome(turn_id="t-done", ok=True), DAY)
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
    # When node-a's reservations are expired
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
