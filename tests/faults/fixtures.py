"""pytest fixtures for fault tests. Register them by importing into a conftest or test module:
`from .faults.fixtures import fault_proxy_fixture  # noqa: F401`; tests then ask for
`fault_proxy` (the function has another name so a test's parameter does not shadow it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..redis_fixture import RedisServer
from .proxy import FaultProxy


@pytest.fixture(name="fault_proxy")
def fault_proxy_fixture(redis_server: RedisServer, redis_url: str) -> Iterator[FaultProxy]:
    """A started `FaultProxy` in front of the session's (flushed) redis-server; stopped after
    the test, which fails if the proxy recorded an internal error."""
    with FaultProxy("127.0.0.1", redis_server.port, password=redis_server.password) as proxy:
        yield proxy
    assert proxy.errors == [], proxy.errors
