"""The fault-injection proxy (`tests/faults`) against a real redis-server and real redis-py
asyncio clients: every fault, and what redis-py's retries make of it.

Two redis-py facts the tests lean on (redis-py 8):
- `Redis.from_url(url)` retries nothing (its pool's connections get `Retry(NoBackoff(), 0)`),
  while `Redis(host=..., port=...)` retries ConnectionError and TimeoutError 10 times.
- `incr()` is sent as INCRBY.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from stickless._types import Priority
from stickless.backends.base import Lease
from stickless.backends.redis import RedisBackends, RedisInbox
from tests.liveness import acquire_lease, live

from .faults import FaultProxy, stickless_scripts
from .faults.fixtures import fault_proxy_fixture  # noqa: F401  (fixture `fault_proxy`)
from .faults.resp import encode_command, frame_end, parse_command, reply_info
from .redis_fixture import RedisServer, redis_executable

Clients = Callable[..., Redis]
T = TypeVar("T")


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    """`clients(url, **options)`: a `Redis.from_url` client closed after the test."""
    made: list[Redis] = []

    def make(url: str, **options: Any) -> Redis:
        client = Redis.from_url(url, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


@pytest.fixture
async def direct(redis_url: str, clients: Clients) -> Redis:
    """A client straight to redis-server, bypassing the proxy."""
    return clients(redis_url)


def no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def spawn(call: Awaitable[T]) -> asyncio.Task[T]:
    """Run a redis-py call (typed as a bare Awaitable) as a task."""

    async def run() -> T:
        return await call

    return asyncio.create_task(run())


async def not_done_yet(task: asyncio.Task[Any]) -> bool:
    """True when `task` has not finished (after letting it run whatever is ready)."""
    await asyncio.sleep(0)
    return not task.done()


# --------------------------------------------------------------------------- RESP parsing


def test_resp_frames_are_found_at_every_split_point() -> None:
    frames = [
        b"+OK\r\n",
        b"-NOSCRIPT No matching script\r\n",
        b":42\r\n",
        b"$5\r\nhe\r\no\r\n",  # CRLF inside a bulk is data
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n*1\r\n+x\r\n",
        b"_\r\n",
        b"#t\r\n",
        b",3.5\r\n",
        b"(12345678901234567890\r\n",
        b"!9\r\nERR oops!\r\n",
        b"=8\r\ntxt:abcd\r\n",
        b"%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n:2\r\n",
        b"~2\r\n+a\r\n+b\r\n",
        b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
        b"|1\r\n+ttl\r\n:3\r\n$2\r\nok\r\n",
    ]
    stream = b"".join(frames)
    for split in range(len(stream) + 1):
        buf = bytearray(stream[:split])
        found: list[bytes] = []
        pos = 0
        for piece in (None, stream[split:]):
            if piece is not None:
                buf += piece
            while (end := frame_end(buf, pos)) is not None:
                found.append(bytes(buf[pos:end]))
                pos = end
        assert found == frames, split
    assert reply_info(frames[1]).error == b"NOSCRIPT No matching script"
    assert reply_info(frames[12]).error == b"ERR oops!"
    assert reply_info(frames[16]).is_push
    assert reply_info(frames[17]).kind == ord("$")  # the attribute is skipped


def test_resp_commands_pipelined_and_inline() -> None:
    stream = encode_command("SET", "k", b"v\r\n") + encode_command("GET", "k") + b"PING x\r\n"
    first = parse_command(stream)
    assert first is not None and first[0] == [b"SET", b"k", b"v\r\n"]
    second = parse_command(stream, first[1])
    assert second is not None and second[0] == [b"GET", b"k"]
    third = parse_command(stream, second[1])
    assert third == ([b"PING", b"x"], len(stream))
    assert parse_command(stream[: first[1] - 1]) is None


def test_every_stickless_script_is_known_by_sha() -> None:
    names = set(stickless_scripts().values())
    assert {"inbox_deliver", "lease_acquire", "turn_finish"} <= names
    assert "_prelude" not in names
    with FaultProxy("127.0.0.1", 1) as proxy, pytest.raises(ValueError, match="unknown"):
        proxy.cut_after(script="no_such_script")


# --------------------------------------------------------------------------- pass-through


@pytest.mark.parametrize("protocol", [2, 3])
async def test_pass_through(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients, protocol: int
) -> None:
    client = clients(fault_proxy.url(), protocol=protocol)
    assert await client.set("k", "v")
    assert await client.get("k") == b"v"
    assert await client.get("missing") is None
    pipe = client.pipeline(transaction=False)
    for i in range(100):
        pipe.rpush("list", i)
    pipe.lrange("list", 0, -1)
    replies = await pipe.execute()
    assert replies[-1] == [str(i).encode() for i in range(100)]
    async with client.pipeline(transaction=True) as tx:
        tx.incr("n")
        tx.incr("n")
        tx.hgetall("missing")
        assert await tx.execute() == [1, 2, {}]
    big = bytes(range(256)) * (8 * 1024)  # 2 MiB: crosses many packets both ways
    assert await client.set("big", big)
    assert await client.get("big") == big
    assert await direct.get("big") == big
    counts = fault_proxy.command_counts()
    assert counts["SET"] == 2 and counts["RPUSH"] == 100 and counts["MULTI"] == 1
    assert fault_proxy.open_connections == 1
    assert fault_proxy.connections()[0].unpaired is False


@pytest.mark.parametrize("protocol", [2, 3])
async def test_pubsub_through_the_proxy_and_a_stall_on_it(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients, protocol: int
) -> None:
    pubsub = clients(fault_proxy.url(), protocol=protocol).pubsub()
    try:
        await pubsub.subscribe("ch")
        confirmation = await pubsub.get_message(timeout=5)
        assert confirmation is not None and confirmation["type"] == "subscribe"
        assert await direct.publish("ch", "hello") == 1
        message = await pubsub.get_message(timeout=5)
        assert message is not None and message["data"] == b"hello"
        [info] = fault_proxy.connections()
        assert info.unpaired  # pushes answer no command: pairing stopped

        # A stall selecting "connections that sent SUBSCRIBE" (it did, before the stall).
        stall = fault_proxy.stall("to_client", command="SUBSCRIBE")
        await direct.publish("ch", "held")
        await stall.wait_fired()
        assert await pubsub.get_message(timeout=0.05) is None
        stall.release()
        message = await pubsub.get_message(timeout=5)
        assert message is not None and message["data"] == b"held"
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]


# --------------------------------------------------------------------------- cut_after


async def test_cut_after_applies_the_write_and_the_client_gets_an_error(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients
) -> None:
    client = clients(fault_proxy.url(), retry=no_retry())
    cut = fault_proxy.cut_after(command="INCRBY")
    with pytest.raises(RedisConnectionError):
        await client.incr("n")
    await cut.wait_fired()
    assert await direct.get("n") == b"1"  # the server applied it exactly once
    [event] = cut.events
    assert event.kind == "cut_after" and event.command == "INCRBY"
    assert fault_proxy.command_counts()["INCRBY"] == 1
    assert not cut.armed  # times=1: used up
    assert await client.incr("n") == 2  # a new connection works


async def test_serves_while_the_test_loop_is_blocked(
    fault_proxy: FaultProxy, direct: Redis
) -> None:
    # A synchronous client blocks this test's event loop; the proxy runs on its own.
    client = redis.Redis.from_url(fault_proxy.url())
    try:
        cut = fault_proxy.cut_after(command="INCRBY")
        with pytest.raises(redis.ConnectionError):
            client.incr("n")
        cut.wait()  # a blocking wait works too
        assert client.incr("n") == 2
    finally:
        client.close()
    assert await direct.get("n") == b"2"


async def test_cut_after_with_redis_py_default_retry_duplicates_the_write(
    fault_proxy: FaultProxy, direct: Redis
) -> None:
    # The Redis() constructor's default: Retry(ExponentialWithJitterBackoff, 10) on
    # ConnectionError and TimeoutError. The lost reply makes it send INCRBY again.
    client = Redis(host="127.0.0.1", port=fault_proxy.port)
    try:
        cut = fault_proxy.cut_after(command="INCRBY")
        assert await client.incr("n") == 2
        assert cut.count == 1
        assert await direct.get("n") == b"2"  # one call, applied twice
        assert fault_proxy.command_counts()["INCRBY"] == 2
    finally:
        await client.aclose()


async def test_redis_py_default_retry_reruns_a_write_whose_reply_is_slow(
    fault_proxy: FaultProxy, direct: Redis
) -> None:
    client = Redis(host="127.0.0.1", port=fault_proxy.port, socket_timeout=0.2)
    hold = fault_proxy.hold_reply(command="INCRBY", seconds=None)
    try:
        # The first INCRBY ran but its reply is held past socket_timeout: TimeoutError,
        # retried on a new connection, where it runs again.
        assert await client.incr("n") == 2
        assert hold.count == 1 and not hold.delivered.is_set()
        assert await direct.get("n") == b"2"
    finally:
        hold.release()
        await client.aclose()


async def test_cut_after_a_pipelined_command_forwards_nothing_after_it(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients
) -> None:
    client = clients(fault_proxy.url(), retry=no_retry())
    cut = fault_proxy.cut_after(match=lambda args: args[0] == b"INCRBY" and args[1] == b"b")
    pipe = client.pipeline(transaction=False)
    for key in ("a", "b", "c"):
        pipe.incr(key)
    with pytest.raises(RedisConnectionError):
        await pipe.execute()
    await cut.wait_fired()
    # a and b ran, c was sent in the same packet but never forwarded.
    assert await direct.mget("a", "b", "c") == [b"1", b"1", None]


async def test_cut_after_a_stickless_script(fault_proxy: FaultProxy, redis_url: str) -> None:
    node = RedisBackends.from_url(fault_proxy.url(), namespace="t", retry=no_retry())
    check = RedisBackends.from_url(redis_url, namespace="t")
    try:
        await live(check, "node-a")
        cut = fault_proxy.cut_after(script="lease_acquire")
        with pytest.raises(RedisConnectionError):
            await node.leases.acquire("s1", "node-a")
        await cut.wait_fired()
        lease = await check.leases.current("s1")
        assert lease is not None and lease.holder == "node-a"
        [event] = cut.events
        assert (event.command, event.script) == ("EVALSHA", "lease_acquire")
        # The flushed server first refused the EVALSHA (NOSCRIPT: it did not run, the rule
        # let it through); redis-py loaded the script and sent it again: that run was cut.
        assert fault_proxy.noscript_replies()["lease_acquire"] == 1
        assert fault_proxy.script_runs()["lease_acquire"] == 1
        assert fault_proxy.command_counts()["SCRIPT"] == 1
        # The index SADD after the script never happened: the client saw the error first.
        assert fault_proxy.command_counts()["SADD"] == 0
    finally:
        await node.aclose()
        await check.aclose()


async def test_stickless_default_retry_delivers_once_after_a_cut(
    fault_proxy: FaultProxy, direct: Redis
) -> None:
    node = RedisBackends.from_url(fault_proxy.url(), namespace="t")
    try:
        fault_proxy.cut_after(script="inbox_deliver")
        assert isinstance(node.inbox, RedisInbox)
        await node.inbox.deliver_raw("s1", Priority.NOW, b"payload")
        runs = fault_proxy.script_runs()["inbox_deliver"]
        queued = await direct.xlen(node.keys.inbox("s1")[0])
    finally:
        await node.aclose()
    # redis-py ran the script again after the lost reply; the rerun appended nothing
    assert (runs, queued) == (2, 1)


# --------------------------------------------------------------------------- cut_before


async def test_cut_before_the_server_never_runs_the_command(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients
) -> None:
    client = clients(fault_proxy.url(), retry=no_retry())
    await client.ping()
    cut = fault_proxy.cut_before(command="INCRBY")
    with pytest.raises(RedisConnectionError):
        await client.incr("n")
    await cut.wait_fired()
    assert await direct.get("n") is None
    # With a retry, a cut before the command is harmless: it runs once.
    retrying = clients(fault_proxy.url(), retry_on_error=[RedisConnectionError])
    fault_proxy.cut_before(command="INCRBY")
    assert await retrying.incr("n") == 1
    assert await direct.get("n") == b"1"


async def test_cut_before_selects_by_argument_predicate(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients
) -> None:
    client = clients(fault_proxy.url(), retry=no_retry())
    cut = fault_proxy.cut_before(match=lambda args: b"target" in args[1:2], times=None)
    assert await client.set("other", "1")
    with pytest.raises(RedisConnectionError):
        await client.set("target", "1")
    with pytest.raises(RedisConnectionError):
        await client.get("target")
    assert await client.get("other") == b"1"
    assert cut.count == 2
    assert await direct.exists("target") == 0


# --------------------------------------------------------------------------- hold_reply


async def test_hold_reply_of_a_stickless_script_until_released(
    fault_proxy: FaultProxy, redis_url: str
) -> None:
    node = RedisBackends.from_url(fault_proxy.url(), namespace="t")
    check = RedisBackends.from_url(redis_url, namespace="t")
    try:
        hold = fault_proxy.hold_reply(script="lease_acquire", seconds=None)
        task = asyncio.create_task(acquire_lease(node, "s1", "node-a", 30.0))
        await hold.wait_fired()
        # The lease is taken on the server while the caller still waits for the reply.
        lease = await check.leases.current("s1")
        assert lease is not None and lease.holder == "node-a"
        assert await not_done_yet(task)
        hold.release()
        won = await task
        assert isinstance(won, Lease) and won.token == lease.token
        await hold.wait_delivered()
    finally:
        await node.aclose()
        await check.aclose()


async def test_hold_reply_for_seconds(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients
) -> None:
    client = clients(fault_proxy.url())
    hold = fault_proxy.hold_reply(command="INCRBY", seconds=0.3)
    task = spawn(client.incr("n"))
    await hold.wait_fired()
    assert await direct.get("n") == b"1"
    assert await task == 1
    await hold.wait_delivered()
    [fired] = hold.events
    [delivered] = hold.delivered_at
    assert delivered - fired.at >= 0.3  # the proxy held it the full time


async def test_hold_reply_holds_everything_after_it_on_the_connection(
    fault_proxy: FaultProxy, clients: Clients
) -> None:
    client = clients(fault_proxy.url())
    hold = fault_proxy.hold_reply(command="INCRBY", seconds=None)
    pipe = client.pipeline(transaction=False)
    pipe.incr("n")
    pipe.set("after", "1")
    pipe.get("after")
    task = spawn(pipe.execute())
    await hold.wait_fired()
    # The commands after INCRBY reached the server (their replies are queued behind it).
    await fault_proxy.wait_until(lambda: fault_proxy.command_counts()["GET"] == 1)
    assert await not_done_yet(task)
    hold.release()
    assert await task == [1, True, b"1"]


# --------------------------------------------------------------------------- stall / delay


async def test_stall_to_server_until_release(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients
) -> None:
    client = clients(fault_proxy.url())
    await client.ping()
    stall = fault_proxy.stall("to_server")
    task = spawn(client.set("k", "v"))
    await stall.wait_fired()
    assert await direct.get("k") is None  # held before the server
    assert await not_done_yet(task)
    stall.release()
    assert await task is True
    assert await direct.get("k") == b"v"


async def test_stall_to_client_of_selected_connections(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients
) -> None:
    held_client = clients(fault_proxy.url())
    other = clients(fault_proxy.url())
    await other.ping()
    stall = fault_proxy.stall("to_client", command="INCRBY")
    task = spawn(held_client.incr("n"))
    await stall.wait_fired()
    assert await direct.get("n") == b"1"  # ran; only the reply is held
    assert await other.get("n") == b"1"  # a connection that sent no INCRBY is not stalled
    assert await not_done_yet(task)
    stall.release()
    assert await task == 1


async def test_stall_of_one_client_name_holds_its_open_and_new_connections_only(
    fault_proxy: FaultProxy, direct: Redis, clients: Clients
) -> None:
    # Given two pools, one named "app:commands" (one connection open already), one "app:other"
    named = clients(fault_proxy.url(), client_name="app:commands")
    other = clients(fault_proxy.url(), client_name="app:other")
    await named.ping()
    await other.ping()
    # When every connection named "app:commands" is stalled
    stall = fault_proxy.stall("both", client=named_of(fault_proxy, "app:commands"))
    first = spawn(named.set("k", "1"))
    await stall.wait_fired()
    # Then a second connection of that pool (opened after the stall) is held too, from its
    # SETNAME on, while the other pool's connection goes through
    second = spawn(named.set("k2", "2"))
    await stall.wait_fired(count=2)
    assert await other.set("k3", "3") is True
    assert await direct.get("k") is None and await direct.get("k2") is None
    assert await not_done_yet(first) and await not_done_yet(second)
    assert {c.name for c in fault_proxy.connections()} == {"app:commands", "app:other"}
    stall.release()
    assert await first is True and await second is True


def named_of(proxy: FaultProxy, name: str) -> str:
    """`name`, once the proxy saw a connection name itself so (CLIENT SETNAME)."""
    assert name in {c.name for c in proxy.connections()}, proxy.connections()
    return name


async def test_stall_for_seconds_ends_by_itself(fault_proxy: FaultProxy, clients: Clients) -> None:
    client = clients(fault_proxy.url())
    await client.ping()
    stall = fault_proxy.stall("both", seconds=0.2)
    assert await client.ping() is True  # no release(): the stall ends by itself
    assert stall.fired.is_set()
    assert time.monotonic() >= stall.armed_at + 0.2  # the reply came only after it ended


async def test_delay_adds_latency_and_keeps_order(
    fault_proxy: FaultProxy, clients: Clients
) -> None:
    client = clients(fault_proxy.url())
    await client.ping()
    delay = fault_proxy.delay("both", 0.05)
    started = time.monotonic()
    pipe = client.pipeline(transaction=False)
    for i in range(20):
        pipe.set(f"k{i}", i)
        pipe.get(f"k{i}")
    replies = await pipe.execute()
    elapsed = time.monotonic() - started
    assert replies == [r for i in range(20) for r in (True, str(i).encode())]
    assert elapsed >= 0.1  # one round trip, each way delayed: a lower bound, not a race
    delay.release()
    assert delay.count == 2  # once per direction of the one connection


# --------------------------------------------------------------------------- resets


async def test_reset_all_and_reconnect(fault_proxy: FaultProxy, clients: Clients) -> None:
    plain = clients(fault_proxy.url())  # from_url: no retry
    retrying = clients(fault_proxy.url(), retry_on_error=[RedisConnectionError])
    await plain.ping()
    await retrying.ping()
    assert fault_proxy.reset_all() == 2
    await fault_proxy.wait_connections(0)
    # The pool hands out its dead connection once: without a retry that call fails...
    with pytest.raises(RedisConnectionError):
        await plain.ping()
    assert await plain.ping() is True  # ...and the next one reconnects.
    assert await retrying.ping() is True  # one retry hides the reset
    assert [e.kind for e in fault_proxy.fired()] == ["reset_all", "reset_all"]


async def test_refuse_new_connections(fault_proxy: FaultProxy, clients: Clients) -> None:
    existing = clients(fault_proxy.url())
    await existing.ping()
    fault_proxy.refuse_new(True)
    newcomer = clients(fault_proxy.url())
    with pytest.raises(RedisConnectionError):
        await newcomer.ping()
    assert fault_proxy.refused == 1
    assert await existing.ping() is True  # its pooled connection is left alone
    fault_proxy.refuse_new(False)
    assert await newcomer.ping() is True
    assert fault_proxy.refused == 1


@pytest.mark.parametrize("protocol", [2, 3])
async def test_server_restart_behind_the_proxy(
    tmp_path: Path, clients: Clients, protocol: int
) -> None:
    server = RedisServer(tmp_path, executable=redis_executable())
    server.start()
    try:
        with FaultProxy("127.0.0.1", server.port) as proxy:
            client = clients(proxy.url(), protocol=protocol)
            assert await client.set("k", "v")
            server.stop()
            # The server's FIN is passed on (the client may still write: half-closed).
            await proxy.wait_until(lambda: all(c.eof_from_server for c in proxy.connections()))
            newcomer = clients(proxy.url(), protocol=protocol)
            with pytest.raises(RedisConnectionError):
                await newcomer.ping()  # the proxy cannot reach the server: reset
            server.start()
            if protocol == 3:
                # RESP3 (redis-py's default) enables maintenance notifications, which skips
                # the pool's check for a connection the server closed: one failed call,
                # exactly as without the proxy.
                with pytest.raises(RedisConnectionError, match="closed by server"):
                    await client.get("k")
            assert await client.set("k", "again")  # RESP2: the pool reconnected by itself
            assert await newcomer.ping() is True
            await proxy.wait_connections(2)
            assert proxy.errors == []
    finally:
        server.stop()


async def test_server_close_as_reset(
    redis_server: RedisServer, redis_url: str, clients: Clients
) -> None:
    with FaultProxy("127.0.0.1", redis_server.port, on_server_close="reset") as proxy:
        client = clients(proxy.url(), protocol=2)
        victim = clients(proxy.url(), protocol=2)
        assert await victim.client_setname("victim")
        assert await client.client_kill_filter(skipme=True, _type="normal") >= 1
        await proxy.wait_connections(1)  # the victim's proxied connection was reset
        with pytest.raises(RedisConnectionError):
            await victim.ping()  # a reset is not noticed by the pool: one failed call
        assert await victim.ping() is True


async def test_half_close_delivers_replies_then_eof(fault_proxy: FaultProxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", fault_proxy.port)
    try:
        writer.write(encode_command("PING") + encode_command("ECHO", "bye"))
        writer.write_eof()
        assert await reader.read() == b"+PONG\r\n$3\r\nbye\r\n"  # then EOF
        await fault_proxy.wait_connections(0)
    finally:
        writer.close()
        await writer.wait_closed()


# --------------------------------------------------------------------------- stop


async def test_stop_with_open_connections_leaves_nothing(
    redis_server: RedisServer, redis_url: str, clients: Clients
) -> None:
    proxy = FaultProxy("127.0.0.1", redis_server.port).start()
    idle = clients(proxy.url())
    await idle.ping()
    pubsub = clients(proxy.url()).pubsub()
    await pubsub.subscribe("ch")
    stalled = clients(proxy.url())
    await stalled.ping()
    stall = proxy.stall("to_client", command="SET")
    task = spawn(stalled.set("k", "v"))
    await stall.wait_fired()
    await proxy.wait_connections(3)
    thread = next(t for t in threading.enumerate() if t.name.startswith("FaultProxy"))
    # Garbage of earlier tests first (its warnings are not this proxy's), then the proxy's own.
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proxy.stop()
        gc.collect()
    assert not thread.is_alive() and not proxy.running
    assert proxy.open_connections == 0
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    with pytest.raises(RedisConnectionError):
        await task
    with pytest.raises(RedisConnectionError):
        await idle.ping()  # the dead pooled connection
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", proxy.port)) != 0  # nothing listens
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    assert proxy.errors == []
    proxy.stop()  # idempotent


async def test_restart_on_the_same_port(redis_server: RedisServer, clients: Clients) -> None:
    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        client = clients(proxy.url(), retry_on_error=[RedisConnectionError])
        assert await client.ping() is True
        port = proxy.port
        proxy.stop()
        proxy.start()
        assert proxy.port == port
        assert await client.ping() is True  # one retry over the reset connection


async def test_wait_helpers_time_out(fault_proxy: FaultProxy) -> None:
    cut = fault_proxy.cut_after(command="NEVER")
    with pytest.raises(TimeoutError):
        await cut.wait_fired(within=0.05)
    with pytest.raises(TimeoutError):
        await fault_proxy.wait_until(lambda: False, within=0.05)
    waiter: Awaitable[None] = asyncio.to_thread(cut.wait, 1, 0.05)
    with pytest.raises(TimeoutError):
        await waiter
