"""Two-phase collect end to end: messages a holder collected but never took over are not lost
when it dies; the next holder takes them over and runs them, and their callers get the real
result."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stickless import BackendUnavailableError

from .agents import Journal, req, stall_take_overs, wait_until
from .conftest import ClusterFactory

QUICK = dict(
    lease_ttl=1.0,
    lease_extend_interval=0.25,
    idempotency_secondary_ttl=0.5,
    holder_loss_sweep_interval=0.25,
    forward_ttl=10.0,
)


async def test_messages_collected_by_a_holder_that_died_before_taking_them_run_on_its_successor(
    cluster_over: ClusterFactory, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_over(**QUICK) as cluster:
        holder, b, c = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        # Given a holder that collects forwarded messages but stalls before taking them over
        stuck = stall_take_overs(holder, monkeypatch)
        on_b = await b.submit(req("s1", "from b"))
        on_c = await c.submit(req("s1", "from c"))
        await stuck.wait()
        # When it dies there, its collected batch never taken over
        await cluster.kill(holder)
        # Then a survivor takes the session over and runs both messages: their callers get the
        # real results (hang guard only: forward_ttl is their deadline)
        results = [await asyncio.wait_for(d.result, QUICK["forward_ttl"]) for d in (on_b, on_c)]
        assert [r.text for r in results] == ["echo:from b", "echo:from c"]
        assert {r.executed_by for r in results} <= {b.node_id, c.node_id}
        assert journal.texts("s1") == ["first", "from b", "from c"]


async def test_a_turn_recorded_but_never_acknowledged_by_a_dead_holder_never_runs_again(
    cluster_over: ClusterFactory, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_over(**QUICK) as cluster:
        holder, b, _ = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        # Given a holder whose acknowledgements never reach the store (its finishes record
        # without acknowledging: the state a message answered by another call is left in)
        acks: list[object] = []
        finish = holder.backends.hotpath.finish

        async def lost_ack(*args: object, **kwargs: object) -> None:
            acks.append(args)
            raise BackendUnavailableError("connection reset")

        async def unacknowledged(*args: Any, pending: object = None, **kwargs: Any) -> Any:
            if pending is not None:
                acks.append(pending)
            return await finish(*args, **kwargs)

        monkeypatch.setattr(holder.backends.inbox, "ack", lost_ack)
        monkeypatch.setattr(holder.backends.hotpath, "finish", unacknowledged)
        # When it runs a forwarded message, records its answer, and dies before acknowledging
        done = await b.submit(req("s1", "once", idempotency_key="k"))
        assert (await done.result).text == "echo:once"
        assert acks
        await cluster.kill(holder)
        # Then the next holder, finding the message still pending, answers it from the store
        # and acknowledges it without running it again
        after = await asyncio.wait_for((await b.submit(req("s1", "after"))).result, 10)
        assert after.text == "echo:after"

        async def acknowledged() -> bool:
            return await cluster.backends.inbox.is_empty("s1")

        await wait_until(acknowledged)
        assert journal.texts("s1") == ["first", "once", "after"]
