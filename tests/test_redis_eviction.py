"""A Redis whose `maxmemory-policy` may evict keys is refused (at start, and on every new
connection after a reconnect), unless the operator allows it: then every start warns, a gauge
counts the warning and `/readyz` names it. A private redis-server per module, its policy set by
`CONFIG SET` before each test."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from redis.asyncio import Redis

from stickless import (
    BackendUnavailableError,
    DeploymentMode,
    RouterConfig,
    SessionRouter,
    StoreMisconfiguredError,
)
from stickless.backends.redis import RedisBackends
from stickless.backends.redis._server import (
    EvictionVerdict,
    judge_eviction_policy,
    parse_policy,
)
from stickless.local_services import RedisServer
from stickless.metrics import PrometheusMetrics
from stickless.web import create_app

from .agents import Journal, ScriptedOpener, req
from .redis_fixture import command, redis_executable

EVICTING = ("volatile-lru", "allkeys-lru", "volatile-ttl", "allkeys-random", "volatile-lfu")
ALL_POLICIES = ("noeviction", *EVICTING, None)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private server, so changing its policy touches no other test."""
    private = RedisServer(tmp_path_factory.mktemp("evicting"), executable=redis_executable())
    private.start()
    try:
        yield private
    finally:
        private.stop()


def set_policy(server: RedisServer, policy: str) -> None:
    assert command(server.port, "CONFIG", "SET", "maxmemory-policy", policy) == b"+OK"


@pytest.fixture
def policy_server(server: RedisServer) -> Iterator[RedisServer]:
    """The private server, flushed, with `noeviction` again afterwards."""
    server.start()
    server.flush()
    try:
        yield server
    finally:
        set_policy(server, "noeviction")


@pytest.fixture
async def raw(policy_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(policy_server.url)
    try:
        yield client
    finally:
        await client.aclose()


def build(backends: RedisBackends, metrics: PrometheusMetrics | None = None) -> SessionRouter:
    config = RouterConfig(node_id="evict", mode=DeploymentMode.DISTRIBUTED)
    return SessionRouter.build(
        config=config, opener=ScriptedOpener(Journal()), backends=backends, metrics=metrics
    )


@pytest.mark.parametrize("allowed", [False, True])
@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_only_noeviction_is_safe_and_the_rest_needs_the_opt_out(
    policy: str | None, allowed: bool
) -> None:
    verdict = judge_eviction_policy(policy, allowed)
    if policy == "noeviction":
        assert verdict is EvictionVerdict.SAFE
    else:
        assert verdict is (EvictionVerdict.ALLOWED if allowed else EvictionVerdict.REFUSED)


def test_the_policy_is_read_from_a_raw_or_parsed_info_reply() -> None:
    raw = b"# Memory\r\nused_memory:1\r\nmaxmemory_policy:allkeys-lru\r\nx:y\r\n"
    assert parse_policy(raw) == "allkeys-lru"
    assert parse_policy({"maxmemory_policy": "noeviction"}) == "noeviction"
    assert parse_policy(b"# Memory\r\nused_memory:1\r\n") is None


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-lru"])
async def test_an_evicting_server_refuses_the_start_naming_the_setting_and_the_fix(
    policy_server: RedisServer, raw: Redis, policy: str
) -> None:
    set_policy(policy_server, policy)
    namespace = f"ev-{uuid.uuid4().hex[:8]}"
    router = build(RedisBackends.from_url(policy_server.url, namespace=namespace))
    try:
        with pytest.raises(StoreMisconfiguredError) as refused:
            await router.start()
        message = str(refused.value)
        assert f"maxmemory-policy is {policy!r}" in message
        assert "maxmemory-policy noeviction" in message  # the fix
        assert "--redis-allow-eviction" in message  # and the opt-out
        assert not router.accepting
        # Nothing was registered or subscribed: the node never joined.
        assert await raw.keys(f"{namespace}*") == []
        assert await raw.pubsub_numpat() == 0
        assert await raw.pubsub_channels(f"{namespace}*") == []
    finally:
        await router.aclose(grace=0)
        await router.backends.aclose()


async def test_allowed_eviction_starts_warns_counts_and_shows_in_readyz(
    policy_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    set_policy(policy_server, "allkeys-lru")
    metrics = PrometheusMetrics()
    backends = RedisBackends.from_url(
        policy_server.url, namespace=f"ev-{uuid.uuid4().hex[:8]}", allow_evicting_redis=True
    )
    router = build(backends, metrics)
    with caplog.at_level(logging.WARNING, logger="stickless"):
        await router.start()
    try:
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("'allkeys-lru'" in m and "allow_evicting_redis" in m for m in warned), warned
        assert len(router.store_warnings) == 1
        assert metrics.registry.get_sample_value("stickless_store_warnings") == 1.0
        disp = await router.submit(req("s1", "hello"))
        assert (await disp.result).text == "echo:hello"
        app = create_app(router, chat_page=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://node"
        ) as client:
            ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["warnings"] == list(router.store_warnings)
    finally:
        await router.aclose(grace=0)
        await backends.aclose()


async def test_a_safe_server_starts_without_warnings(policy_server: RedisServer) -> None:
    metrics = PrometheusMetrics()
    backends = RedisBackends.from_url(policy_server.url, namespace=f"ev-{uuid.uuid4().hex[:8]}")
    router = build(backends, metrics)
    await router.start()
    try:
        assert router.store_warnings == ()
        assert metrics.registry.get_sample_value("stickless_store_warnings") == 0.0
    finally:
        await router.aclose(grace=0)
        await backends.aclose()


async def test_a_reconnect_to_a_server_that_turned_evicting_is_refused(
    policy_server: RedisServer,
) -> None:
    backends = RedisBackends.from_url(policy_server.url, namespace=f"ev-{uuid.uuid4().hex[:8]}")
    router = build(backends)
    await router.start()
    try:
        disp = await router.submit(req("s1", "before"))
        assert (await disp.result).text == "echo:before"
        set_policy(policy_server, "volatile-lru")
        # Every command connection goes (pub/sub stays): the next ones must connect anew.
        command(policy_server.port, "CLIENT", "KILL", "TYPE", "normal")
        with pytest.raises(BackendUnavailableError) as refused:
            await router.transcript("s1")
        assert "maxmemory-policy is 'volatile-lru'" in str(refused.value)
        set_policy(policy_server, "noeviction")
        assert [e.content for e in await router.transcript("s1")] == ["before", "echo:before"]
    finally:
        await router.aclose(grace=0)
        await backends.aclose()


def _serve(url: str, *extra: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "stickless", "serve", "--redis", url, "--port", "0", *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_serve_refuses_an_evicting_redis_and_starts_with_the_opt_out(
    policy_server: RedisServer,
) -> None:
    set_policy(policy_server, "volatile-lru")
    refused = _serve(policy_server.url, "--namespace", "ev-cli")
    try:
        _, err = refused.communicate(timeout=45)
    finally:
        refused.kill()
    assert refused.returncode != 0
    assert "maxmemory-policy is 'volatile-lru'" in err, err
    allowed = _serve(policy_server.url, "--namespace", "ev-cli", "--redis-allow-eviction")
    try:
        assert allowed.stdout is not None
        ready = allowed.stdout.readline().split()
        assert ready[0] == "READY", ready
        base = f"http://127.0.0.1:{ready[1]}"
        body = httpx.get(f"{base}/readyz", timeout=10).json()
        assert len(body["warnings"]) == 1 and "'volatile-lru'" in body["warnings"][0]
        assert 'stickless_store_warnings 1.0' in httpx.get(f"{base}/metrics", timeout=10).text
    finally:
        allowed.terminate()
        allowed.communicate(timeout=30)
