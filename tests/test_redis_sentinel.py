"""Redis Sentinel: the `redis+sentinel://` URL (and `--redis-sentinel` / `--redis-service`), and
nodes that follow a failover — a real primary SIGKILLed and a replica promoted by three real
Sentinels: commands, pub/sub and the renewer's own connections all reach the new primary."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import pytest
import redis.asyncio as aioredis

from stickless import (
    BackendUnavailableError,
    Event,
    EventStream,
    SessionRouter,
    TextDelta,
    TurnCompleted,
)
from stickless.backends.redis._connect import SentinelTarget, parse_sentinel_url, sentinel_url
from stickless.cli import parse_args
from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener, req
from .conftest import FAST
from .redis_sentinel import FAILOVER_TIMEOUT, SentinelSet, sentinel_set

__all__ = ["sentinel_set"]

T = TypeVar("T")

GOOD = [
    (
        "redis+sentinel://127.0.0.1:26379,h2:26380/svc",
        SentinelTarget((("127.0.0.1", 26379), ("h2", 26380)), "svc"),
    ),
    ("redis+sentinel://h1/svc?db=3", SentinelTarget((("h1", 26379),), "svc", db=3)),
    (
        "redis+sentinel://me:p%40ss@h1:1/svc",
        SentinelTarget((("h1", 1),), "svc", username="me", password="p@ss"),
    ),
    ("redis+sentinel://:pw@h1:1/svc", SentinelTarget((("h1", 1),), "svc", password="pw")),
]
BAD = [
    ("redis://h1:1/svc", "starts with redis\\+sentinel"),
    ("redis+sentinel:///svc", "at least one Sentinel"),
    ("redis+sentinel://h1:1", "ends with /service_name"),
    ("redis+sentinel://h1:1/", "ends with /service_name"),
    ("redis+sentinel://h1:x/svc", "is not host:port"),
    ("redis+sentinel://h1:99999/svc", "is not host:port"),
    ("redis+sentinel://h1:1/svc?db=-1", "non-negative integer"),
]


@pytest.mark.parametrize(("url", "target"), GOOD)
def test_a_sentinel_url_names_its_sentinels_service_and_credentials(
    url: str, target: SentinelTarget
) -> None:
    assert parse_sentinel_url(url) == target


@pytest.mark.parametrize(("url", "error"), BAD)
def test_a_bad_sentinel_url_is_refused_naming_the_rule(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_sentinel_url(url)


@pytest.mark.parametrize("command", ["serve", "node"])
def test_the_cli_options_make_the_same_url(command: str) -> None:
    args = parse_args(
        [command, "--redis-sentinel", "h1:1,h2:2", "--redis-service", "svc", "--node-id", "n"]
        + (["--opener", "m:f"] if command == "node" else [])
    )
    assert args.redis == sentinel_url("h1:1,h2:2", "svc") == "redis+sentinel://h1:1,h2:2/svc"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--redis", "redis://h:1", "--redis-sentinel", "h:2", "--redis-service", "s"], "exclude"),
        (["--redis-sentinel", "h:2"], "go together"),
        (["--redis-service", "s"], "go together"),
        ([], "one of --redis and --redis-sentinel is required"),
    ],
)
def test_a_bad_mix_of_redis_options_is_refused(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["node", "--node-id", "n", "--opener", "m:f", *argv])
    assert error in capsys.readouterr().err


async def eventually(call: Callable[[], Awaitable[T]]) -> T:
    """`call` until the store answers it (connections move to the new primary meanwhile)."""
    deadline = asyncio.get_running_loop().time() + FAILOVER_TIMEOUT
    while True:
        try:
            return await call()
        except BackendUnavailableError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def renewed(client: aioredis.Redis, key: str, first: int) -> bool:
    return bool(await client.pexpiretime(key) != first)


async def eventually_true(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll `check` until it holds (bounded by the failover timeout)."""
    deadline = asyncio.get_running_loop().time() + FAILOVER_TIMEOUT
    while True:
        if await check():
            return
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


async def run_turn(router: SessionRouter, session: str, text: str) -> str:
    async def once() -> str:
        disp = await router.submit(req(session, text, idempotency_key=f"{session}-{text}"))
        return (await disp.result).text

    return await eventually(once)


async def frames_until_end(stream: EventStream, turn_text: str) -> list[Event]:
    seen: list[Event] = []
    async for event in stream:
        seen.append(event)
        if isinstance(event, TurnCompleted) and event.text == f"echo:{turn_text}":
            return seen
    raise AssertionError(f"the stream ended before the turn of {turn_text!r}: {seen}")


@pytest.mark.timeout(180)
async def test_nodes_follow_a_failover_commands_pubsub_and_renewals(
    sentinel_set: SentinelSet,
) -> None:
    namespace = f"sent-{uuid.uuid4().hex[:8]}"
    journal = Journal()
    cluster = LocalCluster.over_redis(
        sentinel_set.url, 2, namespace=namespace, opener=ScriptedOpener(journal), **FAST
    )
    await cluster.start()
    a, b = cluster.nodes
    try:
        assert await run_turn(a, "s1", "before failover") == "echo:before failover"
        promoted = await asyncio.to_thread(sentinel_set.failover_after_kill)
        # Commands: both nodes run turns on the new primary.
        assert await run_turn(a, "s1", "after on a") == "echo:after on a"
        assert await run_turn(b, "s2", "after on b") == "echo:after on b"
        # Pub/sub: a subscriber on b hears a turn that runs on a.
        stream = b.events("s1")
        await stream.ready()
        ran = asyncio.ensure_future(run_turn(a, "s1", "heard on b"))
        seen = await asyncio.wait_for(frames_until_end(stream, "heard on b"), FAILOVER_TIMEOUT)
        await ran
        await stream.aclose()
        assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "heard on b "
        # Renewals: each node's liveness key on the new primary gets extended again.
        direct = aioredis.Redis(host="127.0.0.1", port=promoted.port)
        try:
            for node in (a, b):
                key = f"{namespace}:live:{node.node_id.partition('/')[0]}"
                first = await direct.pexpiretime(key)
                assert first > 0, key
                await eventually_true(partial(renewed, direct, key, first), f"{key} renewed")
        finally:
            await direct.aclose()
    finally:
        await cluster.aclose()
