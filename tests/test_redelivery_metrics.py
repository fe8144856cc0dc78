"""Redelivery metrics end to end: a successor's collect of a dead holder's pending messages
emits `on_redelivered`, a holder's own collect in doubt emits `on_reclaimed`.

Both wait on the actor calling `ActorHost.entries_reclaimed` after each collect (the call
belongs in `actors/_actor.py`): strict xfail until it does, then drop the marker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stickless import Priority
from stickless.backends.base import CollectedBatch
from stickless.testing import CountingMetrics

from .agents import Journal, req, stall_take_overs
from .conftest import ClusterFactory

QUICK = dict(
    lease_ttl=1.0,
    lease_extend_interval=0.25,
    idempotency_secondary_ttl=0.5,
    holder_loss_sweep_interval=0.25,
    forward_ttl=10.0,
)


def _counted(metrics: CountingMetrics, hook: str, session_id: str) -> int:
    return sum(args[1] for name, args in metrics.calls if name == hook and args[0] == session_id)


async def test_a_successor_taking_over_a_dead_holders_messages_counts_them_redelivered(
    cluster_over: ClusterFactory, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = CountingMetrics()
    async with cluster_over(metrics=metrics, **QUICK) as cluster:
        holder, b, c = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        # Given a holder that collected a forwarded message and stalls before taking it over
        stuck = stall_take_overs(holder, monkeypatch)
        on_b = await b.submit(req("s1", "from b"))
        await stuck.wait()
        assert (await cluster.backends.inbox.pending_stats(["s1"]))["s1"].pending == 1
        # When it dies, and a survivor takes the session over and runs it (hang guard only)
        await cluster.kill(holder)
        result = await asyncio.wait_for(on_b.result, QUICK["forward_ttl"])
        assert result.executed_by in {b.node_id, c.node_id}
        # Then the successor counted what it was handed again, and nothing as its own reclaim
        assert _counted(metrics, "on_redelivered", "s1") == 1
        assert _counted(metrics, "on_reclaimed", "s1") == 0


async def test_a_holder_taking_back_a_batch_whose_collect_reply_was_lost_counts_it_reclaimed(
    cluster_over: ClusterFactory, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = CountingMetrics()
    async with cluster_over(metrics=metrics) as cluster:
        holder, b, _ = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        # Given a holder whose first collect of a forwarded message ran but lost its reply
        inbox = holder.backends.inbox
        collect = inbox.collect
        lost = asyncio.Event()

        async def reply_lost(
            session_id: str, max_priority: Priority, token: int, *, reclaim_own: bool = False
        ) -> CollectedBatch:
            batch = await collect(session_id, max_priority, token, reclaim_own=reclaim_own)
            if batch and not lost.is_set():
                lost.set()
                raise ConnectionError("reply lost after the store ran the collect")
            return batch

        take = holder.backends.hotpath.take

        async def take_reply_lost(
            session_id: str, max_priority: Priority, token: int, *args: Any, **kwargs: Any
        ) -> CollectedBatch:
            batch = await take(session_id, max_priority, token, *args, **kwargs)
            if batch and not lost.is_set():
                lost.set()
                raise ConnectionError("reply lost after the store ran the take")
            return batch

        monkeypatch.setattr(inbox, "collect", reply_lost)
        monkeypatch.setattr(holder.backends.hotpath, "take", take_reply_lost)
        in_doubt = await b.submit(req("s1", "in doubt"))
        await lost.wait()
        # When the next message rings the holder again
        after = await b.submit(req("s1", "after"))
        # Then both run, and the holder counted the one it took back as reclaimed
        assert (await in_doubt.result).text == "echo:in doubt"
        assert (await after.result).text == "echo:after"
        assert _counted(metrics, "on_reclaimed", "s1") == 1
        assert _counted(metrics, "on_redelivered", "s1") == 0
