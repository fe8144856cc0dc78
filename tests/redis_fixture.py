"""A private `redis-server` for tests: started on a free loopback port, never the shared 6379.

`RedisServer` (from `stickless.local_services`) is reusable by multi-process and restart tests
(same directory and port across `restart()`, optional append-only persistence). The session
fixture `redis_server` starts one; `redis_url` flushes it before each test. Without
`redis-server` on PATH the fixtures skip the test, except under `CI=true` where they fail it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from stickless.local_services import REDIS_START_TIMEOUT as START_TIMEOUT
from stickless.local_services import RedisServer, find_redis_server, free_port
from stickless.local_services import redis_command as command

__all__ = [
    "START_TIMEOUT",
    "RedisServer",
    "command",
    "free_port",
    "redis_executable",
    "redis_server",
    "redis_url",
]


def redis_executable() -> str:
    """The `redis-server` on PATH; fails under CI=true and skips otherwise when it is missing."""
    found = find_redis_server()
    if found is not None:
        return found
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(
            "redis-server is not on PATH but CI=true requires the Redis tests: "
            "install it (apt-get install -y redis-server)"
        )
    pytest.skip("redis-server is not on PATH")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server for the whole test session."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), executable=redis_executable())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of the session's redis-server, running (restarted if a test stopped it) and empty."""
    redis_server.start()
    redis_server.flush()
    return redis_server.url
