"""Interrupts that reach a turn before it starts: the turn is cancelled, never run."""

from __future__ import annotations

import pytest

from stickless import FailureCode

from .agents import Journal, failure_code, req
from .conftest import ClusterFactory, make_cluster


@pytest.mark.parametrize("where", ["local", "forwarded"])
async def test_an_interrupt_right_after_submit_stops_that_turn(
    journal: Journal, where: str
) -> None:
    async with make_cluster(journal, nodes=2) as cluster:
        holder, other = cluster.nodes
        # Given a session held by one node
        await (await holder.submit(req("s1", "warm up"))).result
        submitter = holder if where == "local" else other
        codes = []
        for n in range(10):
            # When a turn is submitted and the session interrupted right away
            disposition = await submitter.submit(req("s1", f"turn {n}"))
            assert await submitter.interrupt("s1") is True
            codes.append(await failure_code(disposition.result))
        # Then no such turn ran to completion: each was cancelled or interrupted
        assert codes == [FailureCode.INTERRUPTED] * 10
        warm_up = [("s1", t) for _, t, text in journal.started if text == "warm up"]
        assert journal.finished == warm_up


async def test_an_interrupt_naming_a_queued_turn_cancels_only_that_turn(journal: Journal) -> None:
    async with make_cluster(journal, nodes=3) as cluster:
        holder, second, third = cluster.nodes
        gate = journal.gate("long")
        # Given a running turn and two turns queued behind it, submitted on other nodes
        running = await holder.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        doomed = await second.submit(req("s1", "doomed"))
        kept = await second.submit(req("s1", "kept"))
        # When a third node interrupts the first queued turn by its id
        assert await third.interrupt("s1", turn_id=doomed.turn_id) is True
        gate.set()
        # Then that turn is answered INTERRUPTED and never runs; the others run as usual
        assert await failure_code(doomed.result) is FailureCode.INTERRUPTED
        assert (await running.result).text == "echo:long"
        assert (await kept.result).text == "echo:kept"
        assert journal.texts("s1") == ["long", "kept"]


async def test_an_interrupt_with_nothing_to_stop_says_so(journal: Journal) -> None:
    async with make_cluster(journal, nodes=2) as cluster:
        holder, other = cluster.nodes
        # Given an idle session held by one node, and a session nobody holds
        await (await holder.submit(req("s1", "done"))).result
        # Then interrupting either, or a turn id that is no longer queued, reports nothing done
        assert await holder.interrupt("s1") is False
        assert await other.interrupt("nobody") is False
        assert await holder.interrupt("s1", turn_id="0" * 32) is False


async def test_an_interrupt_naming_a_finished_turn_answers_at_once(
    cluster_over: ClusterFactory, journal: Journal
) -> None:
    # A grace of ten minutes: an interrupt that waits for an answer nobody sends would outlast
    # the test's own timeout.
    async with cluster_over(nodes=2, interrupt_grace=600.0) as cluster:
        holder, other = cluster.nodes
        # Given a turn that finished on its holder
        done = await holder.submit(req("s1", "done"))
        await done.result
        # When a node that does not hold the session, then the holder, interrupt it by its id,
        # and a turn id the session never had
        # Then each says at once that nothing was stopped
        assert await other.interrupt("s1", turn_id=done.turn_id) is False
        assert await holder.interrupt("s1", turn_id=done.turn_id) is False
        assert await other.interrupt("s1", turn_id="0" * 32) is False
        # And a running turn named from another node is still interrupted
        journal.gate("long")
        running = await holder.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        assert await other.interrupt("s1", turn_id=running.turn_id) is True
        assert await failure_code(running.result) is FailureCode.INTERRUPTED
