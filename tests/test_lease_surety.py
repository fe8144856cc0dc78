"""A turn starts only while its node surely holds the session's lease: one that may have run
out (the node was paused or cut off past it) is handed on before the turn starts, or, when that
is found only in the turn task's first step, answered LEASE_LOST without calling the agent."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

import pytest

from stickless import FailureCode, SessionRouter

from .agents import Journal, failure_code, req
from .conftest import ClusterFactory


def _doubt_at(
    node: SessionRouter,
    monkeypatch: pytest.MonkeyPatch,
    checks: Collection[int],
    *,
    gone: bool = True,
) -> list[bool]:
    """Make the node doubt its lease of s1 at its `checks`-th looks (1-based) after this call,
    and the store then answer that the lease is `gone` (or still held); returns the node's
    answers."""
    renewer = node.renewer
    surely: Callable[[str, int], bool] = renewer.surely_holds
    liveness = node.backends.liveness
    renew = liveness.renew
    main = threading.current_thread()
    answers: list[bool] = []

    def doubting(session_id: str, token: int) -> bool:
        held = surely(session_id, token)
        if session_id == "s1":
            held = held and len(answers) + 1 not in checks
            answers.append(held)
        return held

    async def confirming(holder: str, incarnation: str, ttl: float, index_ttl: float) -> bool:
        # the node's own confirmation (on its loop) hears "gone"; its renewer thread does not
        if gone and threading.current_thread() is main:
            return False
        return await renew(holder, incarnation, ttl, index_ttl)

    monkeypatch.setattr(renewer, "surely_holds", doubting)
    monkeypatch.setattr(liveness, "renew", confirming)
    return answers


async def test_a_lease_in_doubt_that_the_store_confirms_runs_the_turn(
    journal: Journal, cluster_over: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_over(nodes=1) as cluster:
        node = cluster.nodes[0]
        await (await node.submit(req("s1", "first"))).result
        # Given the node doubts its lease at every look (its renewals were slow), but the store
        # still has it held by the node
        _doubt_at(node, monkeypatch, {1, 2, 3}, gone=False)
        # Then the turn runs and commits as usual
        assert (await (await node.submit(req("s1", "next"))).result).text == "echo:next"
        assert journal.texts("s1") == ["first", "next"]


async def test_a_turn_whose_lease_is_in_doubt_before_it_starts_is_handed_on(
    journal: Journal, cluster_over: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_over(nodes=2) as cluster:
        holder, other = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        # Given the holder doubts its lease right before starting the next turn
        answers = _doubt_at(holder, monkeypatch, {1})
        disp = await other.submit(req("s1", "next"))
        # Then the turn is not started there but handed on, and its caller still gets its result
        result = await disp.result
        assert result.text == "echo:next"
        assert answers[0] is False
        assert journal.texts("s1") == ["first", "next"]


async def test_a_turn_whose_lease_is_in_doubt_when_its_task_starts_never_calls_the_agent(
    journal: Journal, cluster_over: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_over(nodes=1) as cluster:
        node = cluster.nodes[0]
        await (await node.submit(req("s1", "first"))).result
        # Given the node still holds its lease as the turn is prepared, but not any more when
        # the turn task takes its first step
        answers = _doubt_at(node, monkeypatch, {2})
        disp = await node.submit(req("s1", "late"))
        # Then the agent is never called and the caller is told LEASE_LOST
        assert await failure_code(disp.result) is FailureCode.LEASE_LOST
        assert answers[:2] == [True, False]
        assert journal.texts("s1") == ["first"]
        record = await cluster.backends.records.load("s1")
        assert record is not None and [e.content for e in record.entries] == ["first", "echo:first"]
