"""The fused finish over a real Redis: a local turn's finish is one round trip that publishes its
TURN_RESULT from inside the script, and a finish whose reply is lost (redis-py sends it again)
commits, records, acknowledges and announces once, its callers answered once."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio

from stickless import SessionRouter
from stickless.backends.redis import RedisBackends
from stickless.backends.redis._scripts import source
from stickless.wire import Signal, SignalKind, TurnResultPayload

from .agents import Journal, req, wait_until
from .faults import FaultProxy
from .faults.fixtures import fault_proxy_fixture  # noqa: F401  (fixture `fault_proxy`)
from .redis_routers import Start, start_fixture  # noqa: F401  (fixture `start`)


def _sha(script: str) -> str:
    return hashlib.sha1(source(script).encode("utf-8")).hexdigest()


def _bundle(router: SessionRouter) -> RedisBackends:
    backends = router.backends
    assert isinstance(backends, RedisBackends)
    return backends


@contextlib.asynccontextmanager
async def _monitor(url: str) -> AsyncIterator[list[tuple[str, str]]]:
    """(client type, command line) of every command Redis runs while open (MONITOR)."""
    client = redis.asyncio.Redis.from_url(url)
    seen: list[tuple[str, str]] = []
    marker = f"monitor-end-{uuid.uuid4().hex}"
    done = asyncio.Event()
    async with client.monitor() as monitor:

        async def read() -> None:
            while True:
                info = await monitor.next_command()
                command = str(info.get("command", ""))
                if marker in command:
                    done.set()
                    return
                seen.append((str(info.get("client_type", "")), command))

        reader = asyncio.get_running_loop().create_task(read())
        try:
            yield seen
            await client.echo(marker)
            await asyncio.wait_for(done.wait(), 10.0)
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
    await client.aclose()


def _count_round_trips(router: SessionRouter) -> dict[str, int]:
    """Count the round trips the task finishing a turn makes inside `TurnOutcomes.complete`
    (each command or pipeline takes one pooled connection); keyed by turn id."""
    pool = _bundle(router).client.connection_pool
    outcomes = router._outcomes
    complete, get_connection = outcomes.complete, pool.get_connection
    counts: dict[str, int] = {}
    finishing: dict[asyncio.Task[Any] | None, str] = {}

    async def counted_complete(work: Any, *args: Any, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        finishing[task] = work.turn_id
        counts.setdefault(work.turn_id, 0)
        try:
            return await complete(work, *args, **kwargs)
        finally:
            del finishing[task]

    async def counted_get_connection(*args: Any, **kwargs: Any) -> Any:
        turn_id = finishing.get(asyncio.current_task())
        if turn_id is not None:
            counts[turn_id] += 1
        return await get_connection(*args, **kwargs)

    outcomes.complete = counted_complete  # type: ignore[method-assign]
    pool.get_connection = counted_get_connection  # type: ignore[method-assign]
    return counts


async def test_a_local_turn_finishes_in_one_call_that_publishes_its_result(
    start: Start, redis_url: str
) -> None:
    node = await start(redis_url)
    await (await node.submit(req("s1", "warm up"))).result
    counts = _count_round_trips(node)
    control = _bundle(node).keys.control_channel
    # When a local turn runs, watched by MONITOR
    async with _monitor(redis_url) as seen:
        disposition = await node.submit(req("s1", "once", idempotency_key="k"))
        assert (await disposition.result).text == "echo:once"
    # Then its finish was one round trip: one turn_finish script, which published the
    # TURN_RESULT itself; no client sent a TURN_RESULT, an inbox ack or another finish
    assert counts == {disposition.turn_id: 1}
    finishes = [c for t, c in seen if t != "lua" and c.lower().startswith("evalsha")]
    assert sum(_sha("turn_finish") in c for c in finishes) == 1
    assert not any(_sha("inbox_ack") in c for c in finishes)
    published = [t for t, c in seen if c.lower().startswith(f"publish {control}".lower())]
    assert [t for t, c in seen if c.lower().startswith("publish") and "TURN_RESULT" in c] == ["lua"]
    assert "lua" in published


async def _turn_results(pubsub: Any, turn_id: str, within: float = 0.5) -> list[bytes]:
    """The TURN_RESULT messages of `turn_id` received within `within` seconds."""
    found: list[bytes] = []
    deadline = asyncio.get_running_loop().time() + within
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if message is None:
            continue
        signal = Signal.decode(message["data"])
        if signal.kind == SignalKind.TURN_RESULT:
            payload = TurnResultPayload.model_validate(signal.payload)
            if payload.outcome.turn_id == turn_id:
                found.append(message["data"])
    return found


async def test_a_finish_whose_reply_is_lost_commits_acknowledges_and_announces_once(
    start: Start, fault_proxy: FaultProxy, redis_url: str, journal: Journal
) -> None:
    holder = await start(fault_proxy.url())
    submitter = await start(redis_url)
    await (await holder.submit(req("s1", "warm up"))).result
    listener = redis.asyncio.Redis.from_url(redis_url)
    pubsub = listener.pubsub()
    await pubsub.subscribe(_bundle(holder).keys.control_channel)
    try:
        # Given the holder's connection is cut right after the server ran its finish of a
        # forwarded turn (collected from the inbox: it has a pending entry); redis-py sends the
        # very same script again
        cut = fault_proxy.cut_after(script="turn_finish")
        disposition = await submitter.submit(req("s1", "once", idempotency_key="k"))
        result = await asyncio.wait_for(disposition.result, 10.0)
        # Then the caller got the turn's success, the script ran twice, yet the turn committed
        # once, its one outcome is recorded, its message acknowledged and its TURN_RESULT sent
        # once
        assert result.text == "echo:once" and result.executed_by == holder.node_id
        # (the caller may hear the TURN_RESULT the script published before the proxy has cut
        # its reply and redis-py has sent the script again: both are awaited)
        await cut.wait_fired()
        await wait_until(lambda: fault_proxy.script_runs()["turn_finish"] >= 2)
        assert cut.count == 1 and fault_proxy.script_runs()["turn_finish"] >= 2
        record = await submitter.backends.records.load("s1")
        assert record is not None
        assert [e.content for e in record.entries if e.turn_id == disposition.turn_id] == [
            "once",
            "echo:once",
        ]
        found = await submitter.backends.idempotency.find("s1", "c:k")
        assert found is not None and found.outcome is not None
        assert (found.turn_id, found.outcome.text) == (disposition.turn_id, "echo:once")
        assert await submitter.backends.inbox.is_empty("s1")
        (sent,) = await _turn_results(pubsub, disposition.turn_id)
        assert journal.texts("s1") == ["warm up", "once"]
        # And a second copy of that TURN_RESULT (what a rerun that published again would send)
        # answers nobody twice: callers resolve once, and a later one with the key gets the
        # recorded answer
        await listener.publish(_bundle(holder).keys.control_channel, sent)
        await asyncio.sleep(0.2)
        assert disposition.result.result() == result
        again = await submitter.submit(req("s1", "once", idempotency_key="k"))
        assert await again.result == result
        assert journal.texts("s1") == ["warm up", "once"]
    finally:
        await pubsub.aclose()
        await listener.aclose()
