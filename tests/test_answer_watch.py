"""The Redis bundle tells the node's path check about every answered command, so calls that
wait in a busy pool's queue never read as a stalled path, while calls the path never answers
(stalled through the fault proxy until the socket timeout) tell it nothing."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from stickless.backends.redis import RedisBackends

from .faults.fixtures import fault_proxy_fixture
from .faults.proxy import FaultProxy

__all__ = ["fault_proxy_fixture"]


async def test_every_answered_command_is_reported_and_an_unanswered_one_is_not(
    fault_proxy: FaultProxy,
) -> None:
    backends = RedisBackends.from_url(
        fault_proxy.url(), namespace="watch", socket_timeout=1.0, max_connections=4
    )
    answers: list[None] = []
    backends.watch_answers(lambda: answers.append(None))
    try:
        # Twenty calls through a pool of four connections: each one answered is reported,
        # whether it waited in the pool's queue or not.
        await asyncio.gather(*(backends.client.ping() for _ in range(20)))
        assert len(answers) == 20
        stall = fault_proxy.stall("to_client")
        with pytest.raises(RedisTimeoutError):
            await backends.client.ping()
        stall.release()
        assert len(answers) == 20
        await backends.client.ping()
        assert len(answers) == 21
    finally:
        await backends.aclose()
