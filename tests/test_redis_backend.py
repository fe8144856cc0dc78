"""Redis-specific behaviour: key layout, script reloads, reconnects, bounds (index healing:
tests/test_redis_indexes.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.client import PubSub
from redis.crc import key_slot
from redis.exceptions import RedisError

from stickless import (
    Priority,
    TextDelta,
    TranscriptEntry,
)
from stickless._errors import EventCursorTrimmedError
from stickless.backends.base import Lease, ReservationState
from stickless.backends.redis import RedisBackends
from stickless.wire import Signal, SignalKind
from tests.liveness import acquire_lease, live

from .commits import commit_turn
from .redis_fixture import RedisServer, redis_executable
from .redis_stores import DAY, LONG, NS, envelope


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone (it may be stopped and restarted), AOF persisted."""
    server = RedisServer(tmp_path, appendonly=True, executable=redis_executable())
    server.start()
    yield server
    server.stop()


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
    lease = await acquire_lease(backends, session_id, "node-a", LONG)
    assert isinstance(lease, Lease)
    await backends.records.provision(session_id, "agent-a", lease.token)
    await commit_turn(
        backends, session_id, lease.token, "t1", [TranscriptEntry(role="user", content="hi")]
    )
    await backends.inbox.deliver(envelope("t1", session_id))
    await backends.inbox.deliver(envelope("t2", session_id, priority=Priority.NOW))
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
    # cluster-wide indexes (three, plus the holder's lease and reservation indexes) and the
    # holders' liveness keys live outside every session's slot
    for session_id in ("s1", "user/42:chat"):
        tag = f"{{{NS}:s:{session_id}}}"
        own = [key for key in keys if key.startswith(tag + ":")]
        suffixes = {key[len(tag) + 1 :] for key in own if ":delivery:" not in key}
        assert len([key for key in own if ":delivery:" in key]) == 2  # one per delivery
        assert suffixes == {
            "lease",
            "tokens",
            "record",
            "transcript",
            "inbox:0",
            "inbox:1",
            "idem:k1",
            "idem:commit:t1",
            "turn:t1",
            "events",
        }
        assert {key_slot(key.encode()) for key in own} == {key_slot(tag.encode())}
    untagged = [key for key in keys if not key.startswith("{")]
    assert untagged == [
        f"{NS}:holder:node-a:idem",
        f"{NS}:holder:node-a:leases",
        f"{NS}:idx:live",
        f"{NS}:idx:pending",
        f"{NS}:idx:stale",
        f"{NS}:live:node-a",
        f"{NS}:live:node-b",
    ]


async def test_namespaces_do_not_share_keys(redis_url: str) -> None:
    # Given two bundles with different namespaces on one server
    first = RedisBackends.from_url(redis_url, namespace="app-a")
    second = RedisBackends.from_url(redis_url, namespace="app-b")
    try:
        # When both lease the same session id
        a = await acquire_lease(first, "s1", "node-a", LONG)
        b = await acquire_lease(second, "s1", "node-b", LONG)
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
        assert isinstance(await acquire_lease(with_password, "s1", "node-a", LONG), Lease)
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


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"socket_timeout": 0}, "socket_timeout"),
        ({"socket_timeout": -1.0}, "socket_timeout"),
        ({"socket_timeout": float("inf")}, "socket_timeout"),
        ({"socket_timeout": float("nan")}, "socket_timeout"),
        ({"socket_timeout": None}, "socket_timeout"),
        ({"socket_connect_timeout": 0.0}, "socket_connect_timeout"),
        ({"socket_connect_timeout": float("inf")}, "socket_connect_timeout"),
        # (an unbounded read timeout is refused even when connecting is bounded)
        ({"socket_timeout": None, "socket_connect_timeout": 1.0}, "socket_timeout"),
    ],
)
def test_store_calls_must_be_bounded(options: dict[str, Any], field: str) -> None:
    # Given / When a bundle is built with a socket timeout that would let a stalled call hang
    # Then it is refused, naming the field and the rule (no server needed: nothing connects)
    with pytest.raises(ValueError, match=f"^{field} must be a positive, finite number"):
        RedisBackends.from_url("redis://127.0.0.1:1/0", namespace=NS, **options)


async def test_clone_has_its_own_pool(bundle: RedisBackends) -> None:
    # Given a bundle and its clone
    clone = bundle.clone()
    try:
        # When the clone is inspected and used
        lease = await acquire_lease(clone, "s1", "node-a", LONG)
        # Then it has its own pool over the same data
        assert clone.client.connection_pool is not bundle.client.connection_pool
        assert await bundle.leases.current("s1") == lease
        assert clone.distributed and clone.namespace == NS
    finally:
        await clone.aclose()


async def test_clone_serves_another_threads_loop(bundle: RedisBackends) -> None:
    # Given a lease and a clone made on this thread (as the router makes its renewal bundle)
    incarnation = await live(bundle, "node-a", 5.0)
    lease = await acquire_lease(bundle, "s1", "node-a", 5.0)
    assert isinstance(lease, Lease)
    clone = bundle.clone()
    renewed: list[bool] = []

    async def renew_twice() -> None:
        for _ in range(2):
            renewed.append(await clone.liveness.renew("node-a", incarnation, LONG, LONG))
        await clone.aclose()

    # When another thread renews through it on its own event loop
    thread = threading.Thread(target=asyncio.run, args=(renew_twice(),))
    thread.start()
    await asyncio.to_thread(thread.join, 10)
    # Then both renewals succeeded, and the lease is still the same one
    assert renewed == [True, True]
    current = await bundle.leases.current("s1")
    assert current is not None and current.token == lease.token


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
    lease = await acquire_lease(bundle, "s1", "node-a", LONG)
    assert isinstance(lease, Lease)
    await bundle.idempotency.put_if_absent("s1", "k1", "t1", "h", "node-a", LONG, DAY)
    await bundle.client.script_flush()
    # When single and pipelined script calls run
    renewed = await bundle.liveness.renew("node-a", await live(bundle, "node-a"), LONG, LONG)
    await bundle.client.script_flush()
    indexed = await bundle.idempotency.expire_holder("node-a")
    await bundle.client.script_flush()
    current = await bundle.leases.current("s1")
    # Then they reload their scripts and work
    assert renewed and indexed == 0
    assert current is not None and current.token == lease.token
    found = await bundle.idempotency.find("s1", "k1")
    assert found is not None and found.state is ReservationState.IN_FLIGHT


async def test_restarted_server_is_used_again(private_server: RedisServer) -> None:
    # Given a bundle with state on a persisted server
    backends = RedisBackends.from_url(private_server.url, namespace=NS, socket_timeout=1.0)
    try:
        lease = await acquire_lease(backends, "s1", "node-a", LONG)
        assert isinstance(lease, Lease)
        # When the server restarts on the same port (empty script cache, same data)
        old_pid = private_server.pid
        private_server.restart()
        assert private_server.pid != old_pid
        # Then the same bundle reconnects, reloads its scripts and sees the data
        assert await backends.liveness.renew("node-a", await live(backends, "node-a"), LONG, LONG)
        assert (
            await acquire_lease(backends, "s1", "node-a", LONG)
        ) == await backends.leases.current("s1")
    finally:
        await backends.aclose()


async def test_stopped_server_fails_calls_then_recovers(private_server: RedisServer) -> None:
    # Given a bundle with a short socket timeout, and the server stopped
    backends = RedisBackends.from_url(private_server.url, namespace=NS, socket_timeout=1.0)
    try:
        lease = await acquire_lease(backends, "s1", "node-a", LONG)
        assert isinstance(lease, Lease)
        private_server.stop()
        # When calls of every kind are made
        frame = TextDelta(session_id="s1", turn_id="t", seq=0, text="x")
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: backends.leases.current("s1"),
            lambda: backends.liveness.renew("node-a", "inc", LONG, LONG),
            lambda: backends.inbox.deliver(envelope("t1")),
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


async def test_close_stops_a_reader_whose_read_swallowed_the_cancel(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a subscribed bus whose reads swallow a cancel, as redis-py's read timeout does when
    # the cancel lands as the timeout fires (the read returns None instead of raising)
    monkeypatch.setattr("stickless.backends.redis._signals._POLL", 0.1)
    original = PubSub.get_message

    async def swallowing(self: PubSub, *args: Any, **kwargs: Any) -> Any:
        try:
            return await original(self, *args, **kwargs)
        except asyncio.CancelledError:
            return None

    monkeypatch.setattr(PubSub, "get_message", swallowing)
    backends = RedisBackends.from_url(redis_url, namespace=NS)
    await backends.signals.subscribe(_Recorder())
    # When the bundle closes, then it returns (the reader stops on the closed flag)
    await asyncio.wait_for(backends.aclose(), 10)


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


# --------------------------------------------------------------------------- bounds


async def test_event_log_trimming_is_exact_and_trimmed_cursors_are_reported(
    bundle: RedisBackends,
) -> None:
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
    # Then the stream holds exactly the bound and readers see the newest 100; resuming from the
    # last dropped id loses nothing, while resuming from an older one is reported, not skipped
    # (this test asserted the old silent skip before event cursors were checked)
    assert stored == 100
    assert [e.event_id for e in read] == ids[-100:]
    resumed = await bundle.events.read("s1", ids[-101], 10_000)
    assert [e.event_id for e in resumed] == ids[-100:]
    with pytest.raises(EventCursorTrimmedError):
        await bundle.events.read("s1", ids[0], 10_000)
    assert [e.event_id for e in await bundle.events.read("s1", ids[-3], 10)] == ids[-2:]


async def test_unreadable_stream_entries_are_contained(
    bundle: RedisBackends, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a frame bound of 1 KiB, an oversized envelope, a raw entry without the envelope
    # field, and a good message
    monkeypatch.setattr("stickless.wire.MAX_FRAME_BYTES", 1024)
    big = await bundle.inbox.deliver(envelope("big", submit_options={"pad": "x" * 4096}))
    raw_stream = bundle.keys.inbox("s1")[int(Priority.NEXT)]
    added = await bundle.client.xadd(raw_stream, {"other": b"\x00"})
    raw_id = added.decode() if isinstance(added, bytes) else added
    good = await bundle.inbox.deliver(envelope("good"))
    # When the session is collected
    batch = await bundle.inbox.collect("s1", Priority.LATER, 1)
    # Then the good one is readable and the other two are unreadable, each logged once
    assert [m.message_id for m in batch.messages] == [good]
    unreadable = {u.message_id: u for u in batch.unreadable}
    assert set(unreadable) == {big, f"{int(Priority.NEXT)}:{raw_id}"}
    assert "exceeds" in unreadable[big].reason
    assert all(u.turn_id is None for u in batch.unreadable)
    assert "x" * 100 not in caplog.text
    assert not await bundle.inbox.collect("s1", Priority.LATER, 1)  # nothing left queued
