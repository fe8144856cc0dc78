"""Release and delete take effect or say they did not: a dead holder's session is still ended, and
a delete that races other nodes' submits neither gives up early nor kills a turn for nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stickless import FailureCode, TurnFailedError
from stickless.backends.base import Lease

from .agents import Journal, req
from .conftest import make_cluster


async def test_release_of_a_session_whose_holder_died_still_ends_it(journal: Journal) -> None:
    # (no sweep or store poll claims the orphaned session meanwhile: only the release acts)
    quiet = dict(idempotency_secondary_ttl=30.0, holder_loss_sweep_interval=30.0)
    async with make_cluster(
        journal, nodes=3, lease_ttl=1.0, lease_extend_interval=0.3, **quiet
    ) as cluster:
        holder, releaser, other = cluster.nodes
        journal.gate("long")
        await holder.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        queued = await other.submit(req("s1", "queued"))
        # Given the holder crashed with a message queued for the session
        await cluster.kill(holder)
        # When another node releases the session
        await releaser.release_session("s1")
        # Then the release took effect: the queued message is answered EVICTED and never runs
        with pytest.raises(TurnFailedError) as failed:
            await queued.result
        assert failed.value.code is FailureCode.EVICTED
        after = await other.submit(req("s1", "after"))
        assert (await after.result).text == "echo:after"
        assert "queued" not in journal.texts("s1")


async def test_delete_racing_submits_from_other_nodes_deletes_the_session(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_cluster(journal, nodes=3) as cluster:
        holder, deleter, submitter = cluster.nodes
        await (await holder.submit(req("s1", "history"))).result
        journal.gate("long")
        running = await holder.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        # Given another node whose submit lands the moment the holder lets the session go
        racing: list[Any] = []
        release = holder.backends.leases.release

        async def release_then_race(lease: Lease) -> bool:
            released = await release(lease)
            racing.append(await submitter.submit(req("s1", "racing")))
            return released

        monkeypatch.setattr(holder.backends.leases, "release", release_then_race)
        # When a third node deletes the session
        await deleter.delete_session("s1")
        # Then the delete took effect (it did not lose the session to that claim and give up):
        # the history is gone and the running turn ended EVICTED for a delete that happened
        record = await cluster.backends.records.load("s1")
        assert record is None or "history" not in [e.content for e in record.entries]
        with pytest.raises(TurnFailedError) as failed:
            await running.result
        assert failed.value.code is FailureCode.EVICTED
        await asyncio.gather(*(d.result for d in racing), return_exceptions=True)
