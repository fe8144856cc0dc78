"""Forward deadlines: FORWARD_TIMEOUT is on time, and only ever fails callers that follow a turn
running elsewhere."""

from __future__ import annotations

import asyncio

import pytest

from stickless import FailureCode, TurnFailedError

from .agents import Journal, req
from .conftest import make_cluster


async def test_a_same_key_retry_on_the_holder_does_not_time_out_the_original_caller(
    journal: Journal,
) -> None:
    forward_ttl = 1.0
    async with make_cluster(journal, nodes=1, forward_ttl=forward_ttl) as cluster:
        node = cluster.nodes[0]
        gate = journal.gate("long")
        # Given a turn running on this node and a same-key retry that attached to it here
        first = await node.submit(req("s1", "long", idempotency_key="k"))
        await journal.entered["long"].wait()
        retry = await node.submit(req("s1", "long", idempotency_key="k"))
        assert retry.turn_id == first.turn_id
        # When the turn outlasts forward_ttl (the time a forward may wait for an answer)
        await asyncio.sleep(forward_ttl * 2)
        gate.set()
        # Then both callers get the turn's real answer: nobody followed it from another node
        assert (await first.result).text == "echo:long"
        assert (await retry.result).text == "echo:long"


async def test_forward_timeout_arrives_at_the_deadline_even_when_the_store_poll_hangs(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_cluster(journal, nodes=2, forward_ttl=1.0) as cluster:
        holder, other = cluster.nodes
        journal.gate("long")
        await holder.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        # Given a submitter whose reads of the idempotency store hang (a stalled connection)
        never = asyncio.Event()

        async def stalled_find(*args: object) -> None:
            await never.wait()

        monkeypatch.setattr(other.backends.idempotency, "find", stalled_find)
        # And a forwarded turn queued behind a turn that outlasts forward_ttl
        queued = await other.submit(req("s1", "queued"))
        # Then its caller still gets FORWARD_TIMEOUT once forward_ttl has passed (hang guard only)
        with pytest.raises(TurnFailedError) as failed:
            await asyncio.wait_for(queued.result, 10.0)
        assert failed.value.code is FailureCode.FORWARD_TIMEOUT
