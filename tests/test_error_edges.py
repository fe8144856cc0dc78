"""Errors say what happened, over a real redis-server: a cursor past its bound is a 400 naming
the field, a refusal no retry changes is a 500 (not "unavailable, retry"), a full Redis is an
outage (inside a turn too: BACKEND_UNAVAILABLE, not the agent's FAILED), a stalled finish still
answers its callers within forward_ttl, an oversized input is a 413, and what a client sees
names the idempotency key it sent."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import msgpack
import pytest
import redis.asyncio as aioredis
from redis import exceptions as rx

from stickless import (
    BackendUnavailableError,
    DeploymentMode,
    FailureCode,
    InputTooLargeError,
    InternalError,
    InvalidRequestError,
    LiveSession,
    RouterConfig,
    SessionRouter,
    TurnContext,
    TurnFailedError,
    TurnOutput,
)
from stickless._store_errors import refused, store_error
from stickless.backends.base import unpack_letter
from stickless.backends.redis import RedisBackends
from stickless.web import create_app

from .agents import Journal, ScriptedOpener, req, wait_until
from .conftest import FAST
from .faults import FaultProxy
from .faults.fixtures import fault_proxy_fixture  # noqa: F401  (fixture `fault_proxy`)

# ---------------------------------------------------------------- which store errors are outages

_PIPELINE = "Command # 2 (LRANGE {p:s:S}:transcript 9 -1) of pipeline caused error: "


@pytest.mark.parametrize(
    ("error", "is_refusal"),
    [
        (rx.ResponseError("value is not an integer or out of range"), True),  # ERR, stripped
        (rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"), True),
        (rx.ResponseError(_PIPELINE + "('value is not an integer or out of range',)"), True),
        (rx.NoPermissionError("this user has no permissions to run the 'eval' command"), True),
        (rx.DataError("Invalid input of type: 'dict'"), True),
        (rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), False),
        (rx.ResponseError("BUSY Redis is busy running a script."), False),
        (rx.ResponseError(_PIPELINE + "('BUSY Redis is busy running a script.',)"), False),
        (rx.ResponseError("MASTERDOWN Link with MASTER is down"), False),
        (rx.ResponseError("MISCONF Redis is configured to save RDB snapshots"), False),
        (rx.ResponseError("NOREPLICAS Not enough good replicas to write."), False),
        (rx.ReadOnlyError("You can't write against a read only replica."), False),
        (rx.NoScriptError("No matching script."), False),
        (rx.BusyLoadingError("Redis is loading the dataset in memory"), False),
        (rx.ConnectionError("Connection reset by peer"), False),
        (rx.TimeoutError("Timeout reading from socket"), False),
        (OSError("connection refused"), False),
    ],
)
def test_a_store_error_is_a_refusal_only_when_no_retry_changes_it(
    error: Exception, is_refusal: bool
) -> None:
    assert refused(error) is is_refusal
    expected = InternalError if is_refusal else BackendUnavailableError
    assert type(store_error(error)) is expected


# ---------------------------------------------------------------- an app over Redis


@dataclass
class OverRedis:
    router: SessionRouter
    backends: RedisBackends
    client: httpx.AsyncClient


@pytest.fixture
async def over_redis(redis_url: str) -> AsyncIterator[Callable[..., Any]]:
    """`await over_redis(**config)`: a started router over the test Redis with the gateway on
    it, reached through httpx."""
    made: list[OverRedis] = []

    async def make(**overrides: Any) -> OverRedis:
        backends = RedisBackends.from_url(redis_url, namespace=f"e{uuid.uuid4().hex[:8]}")
        config = RouterConfig(
            node_id="n0", mode=DeploymentMode.DISTRIBUTED, **{**FAST, **overrides}
        )
        router = SessionRouter.build(
            config=config, opener=ScriptedOpener(Journal()), backends=backends
        )
        await router.start()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(router)), base_url="http://gateway"
        )
        made.append(OverRedis(router, backends, client))
        return made[-1]

    yield make
    for served in made:
        await served.client.aclose()
        await served.router.aclose(grace=0.5)
        await served.backends.aclose()


async def _committed(served: OverRedis, session_id: str = "S") -> None:
    accepted = await served.client.post(
        f"/v1/sessions/{session_id}/turns", json={"agent_ref": "bot", "input": "hello"}
    )
    turn_id = accepted.json()["turn_id"]
    view = await served.client.get(f"/v1/sessions/{session_id}/turns/{turn_id}?wait=10")
    assert view.json()["state"] == "completed"


async def test_a_transcript_cursor_past_its_bound_is_a_400_naming_the_field(
    over_redis: Callable[..., Any],
) -> None:
    served: OverRedis = await over_redis()
    await _committed(served)
    # Given cursors at and past the largest version a Redis list can be read from
    last = await served.client.get(f"/v1/sessions/S/transcript?after={2**63 - 1}")
    assert last.status_code == 200 and last.json()["entries"] == []
    for after in (2**63, 99999999999999999999999):
        answer = await served.client.get(f"/v1/sessions/S/transcript?after={after}")
        # Then the request is refused as bad input naming the field, never "retry"
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "INVALID_REQUEST"
        assert "after" in answer.json()["error"]["message"]
        assert "Retry-After" not in answer.headers
        # And the router's own call says the same
        with pytest.raises(InvalidRequestError, match="after"):
            await served.router.transcript("S", after)


async def test_a_refusal_no_retry_changes_is_a_500_internal_error_not_an_outage(
    over_redis: Callable[..., Any],
) -> None:
    served: OverRedis = await over_redis()
    await _committed(served)
    # Given a session whose transcript key holds the wrong type (a bug, or a hand edit)
    transcript = served.backends.keys.transcript("S")
    await served.backends.client.delete(transcript)
    await served.backends.client.set(transcript, "not a list")
    # When a client reads it
    answer = await served.client.get("/v1/sessions/S/transcript")
    # Then it is an internal error quoting Redis, with no invitation to retry
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"]["code"] == "INTERNAL_ERROR"
    assert "WRONGTYPE" in answer.json()["error"]["message"]
    assert "Retry-After" not in answer.headers
    with pytest.raises(InternalError, match="WRONGTYPE"):
        await served.router.transcript("S")


# ---------------------------------------------------------------- a full Redis


@pytest.fixture
async def fill_redis(redis_url: str) -> AsyncIterator[Callable[[], Any]]:
    """`await fill()`: the test Redis becomes full (`noeviction`, maxmemory just above what it
    holds, filled until a write is refused OOM, then the limit lowered below what it holds, so
    no small write slips in either); its limit is lifted after the test."""
    client = aioredis.Redis.from_url(redis_url)

    async def fill() -> None:
        await client.config_set("maxmemory-policy", "noeviction")
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory", used + 512 * 1024)
        with pytest.raises(rx.OutOfMemoryError):
            for i in range(10_000):
                await client.set(f"filler:{i}", b"x" * 65536)
        await client.config_set("maxmemory", used // 2)

    try:
        yield fill
    finally:
        await client.config_set("maxmemory", 0)
        await client.aclose()


async def test_a_full_redis_is_a_503_outage_with_retry_after(
    over_redis: Callable[..., Any], fill_redis: Callable[[], Any]
) -> None:
    served: OverRedis = await over_redis()
    await _committed(served)
    # Given Redis is full (it then refuses even the transaction that reads a transcript)
    await fill_redis()
    # When a client reads the transcript
    answer = await served.client.get("/v1/sessions/S/transcript")
    # Then it is told the backend is unavailable, to retry later
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "BACKEND_UNAVAILABLE"
    assert answer.headers["Retry-After"] == "1"


class _Loading:
    """A session whose turn waits for `go`, then reads the transcript (the read's error, if
    any, propagates as an agent framework would: wrapped in its own error)."""

    def __init__(self, go: asyncio.Event, entered: asyncio.Event) -> None:
        self.go, self.entered = go, entered

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        self.entered.set()
        await self.go.wait()
        try:
            entries = await turn.transcript.load()
        except Exception as exc:
            raise RuntimeError("the agent could not read its history") from exc
        return TurnOutput(text=f"{len(entries)} entries")

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


class _LoadingOpener:
    def __init__(self) -> None:
        self.go, self.entered = asyncio.Event(), asyncio.Event()

    async def open(self, session_id: str, agent_ref: str, attributes: Any) -> LiveSession:
        return _Loading(self.go, self.entered)


async def test_a_full_redis_inside_a_turn_answers_backend_unavailable_not_failed(
    redis_url: str, fill_redis: Callable[[], Any]
) -> None:
    backends = RedisBackends.from_url(redis_url, namespace=f"e{uuid.uuid4().hex[:8]}")
    opener = _LoadingOpener()
    config = RouterConfig(node_id="n0", mode=DeploymentMode.DISTRIBUTED, **FAST)
    router = SessionRouter.build(config=config, opener=opener, backends=backends)
    await router.start()
    try:
        disposition = await router.submit(req("s1", "read history", idempotency_key="k"))
        await opener.entered.wait()
        # Given Redis is full while the turn runs, and the turn's transcript read fails on it
        await fill_redis()
        opener.go.set()
        with pytest.raises(TurnFailedError) as failed:
            await asyncio.wait_for(disposition.result, 30)
        # Then the turn's answer names the infrastructure, not the agent, and leaves the key
        # free: a retry runs fresh
        assert failed.value.code is FailureCode.BACKEND_UNAVAILABLE
        assert "OutOfMemoryError" in failed.value.detail
        assert not FailureCode.BACKEND_UNAVAILABLE.final
    finally:
        await router.aclose(grace=0.5)
        await backends.aclose()


# ---------------------------------------------------------------- a stalled store


async def test_a_finish_stalled_by_the_store_answers_its_callers_within_forward_ttl(
    fault_proxy: FaultProxy, journal: Journal
) -> None:
    # No client timeout bounds a store call here (as with `socket_timeout=None`): only the
    # router's own bound can answer the caller while the store stalls.
    backends = RedisBackends.from_url(
        fault_proxy.url(), namespace=f"e{uuid.uuid4().hex[:8]}", socket_timeout=3600.0
    )
    patient = dict(lease_ttl=30.0, lease_extend_interval=5.0, idempotency_secondary_ttl=60.0)
    config = RouterConfig(
        node_id="n0",
        mode=DeploymentMode.DISTRIBUTED,
        **{**FAST, **patient, "forward_ttl": 1.0},
    )
    router = SessionRouter.build(config=config, opener=ScriptedOpener(journal), backends=backends)
    await router.start()
    stall = None
    try:
        gate = journal.gate("held")
        disposition = await router.submit(req("s1", "held", idempotency_key="k"))
        await journal.entered["held"].wait()
        # Given every byte between the node and Redis is held back as the turn finishes
        stall = fault_proxy.stall("both")
        gate.set()
        # Then its caller is answered within forward_ttl: the answer is unknown, retry the key
        with pytest.raises(TurnFailedError) as unknown:
            await asyncio.wait_for(disposition.result, 30)
        assert unknown.value.code is FailureCode.FORWARD_TIMEOUT
        # And once the store answers again, the finish it was waiting for is recorded
        stall.release()

        async def recorded() -> bool:
            found = await router.backends.idempotency.find("s1", "c:k")
            return found is not None and found.outcome is not None

        await wait_until(recorded)
        retry = await router.submit(req("s1", "held", idempotency_key="k"))
        assert (await retry.result).text == "echo:held"
        assert journal.texts("s1") == ["held"]
    finally:
        if stall is not None:
            stall.release()
        await router.aclose(grace=0.5)
        await backends.aclose()


# ---------------------------------------------------------------- oversized input, client keys


async def test_an_input_over_max_input_bytes_is_a_413(over_redis: Callable[..., Any]) -> None:
    served: OverRedis = await over_redis(max_input_bytes=64)
    # Given a body the gateway accepts whose input is over the router's max_input_bytes
    body = {"agent_ref": "bot", "input": "x" * 200}
    for headers in ({}, {"Accept": "text/event-stream"}):
        answer = await served.client.post("/v1/sessions/S/turns", json=body, headers=headers)
        # Then it is refused as too large, naming the limit, and nothing was reserved
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["code"] == "INPUT_TOO_LARGE"
        assert "max_input_bytes" in answer.json()["error"]["message"]
    assert await served.router.backends.records.load("S") is None
    with pytest.raises(InputTooLargeError, match="max_input_bytes"):
        await served.router.submit(req("S", "x" * 200))


async def test_an_idempotency_conflict_names_the_key_the_client_sent(
    over_redis: Callable[..., Any],
) -> None:
    served: OverRedis = await over_redis()
    headers = {"Idempotency-Key": "msg-1"}
    first = await served.client.post(
        "/v1/sessions/S/turns", json={"agent_ref": "bot", "input": "one"}, headers=headers
    )
    assert first.status_code == 202
    # When the same key comes with another input (as a submit and as a stream)
    for accept in ({}, {"Accept": "text/event-stream"}):
        again = await served.client.post(
            "/v1/sessions/S/turns",
            json={"agent_ref": "bot", "input": "two"},
            headers={**headers, **accept},
        )
        # Then the conflict names the client's key, never the gateway's scoped one
        assert again.status_code == 409, again.text
        error = again.json()["error"]
        assert error["code"] == "IDEMPOTENCY_CONFLICT"
        assert "'msg-1'" in error["message"] and "http:" not in error["message"]


def test_a_stored_letter_shows_the_client_key_and_keeps_the_reservation_key() -> None:
    # A letter as every earlier node packed it (layout 1: the reservation key under "key")
    def packed(key: str | None) -> bytes:
        body = {"id": "s1~" + "0" * 32, "session": "s1", "turn": "t1", "key": key}
        return msgpack.packb([1, 5.0, {**body, "source": "", "reason": "r", "attempts": []}])

    client = unpack_letter(packed("c:my-key"))
    assert (client.idempotency_key, client.reservation_key) == ("my-key", "c:my-key")
    internal = unpack_letter(packed("t:t1"))
    assert (internal.idempotency_key, internal.reservation_key) == (None, "t:t1")
    assert unpack_letter(packed(None)).idempotency_key is None
