"""Submit, forwarding and serialization through the public API on a simulated cluster (forwarding
over the memory backends and over Redis)."""

from __future__ import annotations

import asyncio

import pytest

from stickless import (
    FailureCode,
    Priority,
    RouterClosedError,
    SessionRouter,
    SubmitKind,
    TurnFailedError,
    TurnResult,
)
from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener, req, wait_until


async def test_single_node_router_runs_a_turn_with_memory_defaults(journal: Journal) -> None:
    # Given a router built with no backends (SINGLE_NODE fills in memory ones)
    router = SessionRouter.build(opener=ScriptedOpener(journal))
    await router.start()
    try:
        # When a turn is submitted
        disp = await router.submit(req("s1", "hello world"))
        result = await disp.result
    finally:
        await router.aclose()
    # Then it ran here and returned the agent's output
    assert disp.kind is SubmitKind.EXECUTED_LOCALLY
    assert result == TurnResult(
        session_id="s1",
        turn_id=disp.turn_id,
        executed_by=router.node_id,
        text="echo:hello world",
        data={"words": 2},
    )


async def test_session_factory_is_the_lambda_friendly_alternative(journal: Journal) -> None:
    from .agents import ScriptedSession

    router = SessionRouter.build(session_factory=lambda s, a: ScriptedSession(journal, s))
    await router.start()
    try:
        result = await (await router.submit(req("s1", "hi"))).result
    finally:
        await router.aclose()
    assert result.text == "echo:hi"


def test_build_requires_exactly_one_of_opener_and_factory(journal: Journal) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        SessionRouter.build()
    with pytest.raises(ValueError, match="exactly one"):
        SessionRouter.build(opener=ScriptedOpener(journal), session_factory=lambda s, a: None)


async def test_second_node_forwards_to_the_holder(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given node A holds the session (its first turn claimed it)
    first = await a.submit(req("s1", "one"))
    await first.result
    # When node B receives the next message for the same session
    second = await b.submit(req("s1", "two"))
    result = await asyncio.wait_for(second.result, 10)
    # Then B forwarded it and A ran both turns in order, with the live handle reused (opened
    # once)
    assert first.kind is SubmitKind.EXECUTED_LOCALLY
    assert second.kind is SubmitKind.FORWARDED
    assert result.executed_by == a.node_id
    assert journal.texts("s1") == ["one", "two"]
    assert [o[0] for o in journal.opened] == ["s1"]


async def test_thirty_concurrent_submits_over_three_nodes_never_overlap(
    cluster: LocalCluster, journal: Journal
) -> None:
    # Given 30 submits for one session fired at once through all three nodes
    nodes = cluster.nodes
    dispositions = await asyncio.gather(
        *(nodes[i % 3].submit(req("hot", f"msg {i}")) for i in range(30))
    )
    results = await asyncio.gather(*(d.result for d in dispositions))
    # Then every one completed, exactly once, and never two turns of the session at a time
    assert sorted(r.text for r in results) == sorted(f"echo:msg {i}" for i in range(30))
    assert len(journal.started) == 30
    assert journal.max_concurrency["hot"] == 1
    assert {d.kind for d in dispositions} == {SubmitKind.EXECUTED_LOCALLY, SubmitKind.FORWARDED}
    assert len({r.executed_by for r in results}) == 1


async def test_transcript_commits_on_success_and_is_visible_to_the_next_holder(
    cluster: LocalCluster,
) -> None:
    a, b, _ = cluster.nodes
    await (await a.submit(req("s1", "first"))).result
    # When the session moves to B (A releases it) and B runs a turn
    await a.release_session("s1")
    await (await b.submit(req("s1", "second"))).result
    # Then the record holds both turns, each tagged with its turn and fencing token
    record = await cluster.backends.records.load("s1")
    assert record is not None
    assert [e.content for e in record.entries] == ["first", "echo:first", "second", "echo:second"]
    tokens = [e.token for e in record.entries]
    assert tokens == sorted(tokens) and tokens[0] < tokens[-1]


async def test_failed_turn_commits_nothing_and_reports_failed(journal: Journal) -> None:
    class Exploding:
        async def run_turn(self, turn):  # type: ignore[no-untyped-def]
            from stickless import TranscriptEntry

            await turn.transcript.append(TranscriptEntry(role="user", content="lost"))
            raise RuntimeError("model exploded")

        async def interrupt(self, reason: str) -> None:
            return None

        async def aclose(self) -> None:
            return None

    router = SessionRouter.build(session_factory=lambda s, a: Exploding())
    await router.start()
    try:
        disp = await router.submit(req("s1", "x"))
        with pytest.raises(TurnFailedError) as failure:
            await disp.result
        record = await router.backends.records.load("s1")
    finally:
        await router.aclose()
    assert failure.value.code is FailureCode.FAILED
    assert "model exploded" in str(failure.value)
    assert record is not None and record.entries == ()


async def test_cancelling_one_callers_future_does_not_cancel_the_turn(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = cluster.nodes
    gate = journal.gate("slow")
    first = await a.submit(req("s1", "slow", idempotency_key="k"))
    attached = await b.submit(req("s1", "slow", idempotency_key="k"))
    await journal.entered["slow"].wait()
    # When the first caller cancels its own future
    first.result.cancel()
    gate.set()
    # Then the turn still finishes and the attached caller gets its result
    result = await attached.result
    assert result.turn_id == first.turn_id
    assert journal.finished == [("s1", first.turn_id)]


async def test_priority_now_runs_before_next_and_later(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = cluster.nodes
    gate = journal.gate("blocker")
    blocker = await a.submit(req("s1", "blocker"))
    await journal.entered["blocker"].wait()
    # Given a running turn and, queued behind it from several nodes, LATER, NEXT and NOW work
    later = await b.submit(req("s1", "later", priority=Priority.LATER))
    nxt = await c.submit(req("s1", "next", priority="NEXT"))
    now = await a.submit(req("s1", "now", priority=Priority.NOW))
    # When the running turn ends
    gate.set()
    await asyncio.gather(blocker.result, later.result, nxt.result, now.result)
    # Then NOW ran first, then NEXT, then LATER
    assert journal.texts("s1") == ["blocker", "now", "next", "later"]


async def test_now_message_is_injected_into_the_running_turn(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = cluster.nodes
    journal.accept_inject = True
    gate = journal.gate("long")
    running = await a.submit(req("s1", "long"))
    await journal.entered["long"].wait()
    # When a NOW message arrives mid-turn (forwarded from another node) and the agent takes it
    injected = await b.submit(req("s1", "urgent", priority=Priority.NOW))
    await wait_until(lambda: journal.injected == ["urgent"])
    gate.set()
    # Then its caller receives the result of the turn it joined, and no extra turn runs
    joined = await injected.result
    assert joined.text == (await running.result).text == "echo:long"
    assert joined.turn_id == injected.turn_id
    assert journal.texts("s1") == ["long"]


async def test_killed_node_fails_its_own_waiters_and_refuses_submits(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = cluster.nodes
    journal.gate("stuck")
    disp = await a.submit(req("s1", "stuck"))
    await journal.entered["stuck"].wait()
    # When node A crashes mid-turn
    await cluster.kill(a)
    # Then its caller is answered RouterClosedError (not left pending) and it takes no work
    with pytest.raises(RouterClosedError):
        await disp.result
    with pytest.raises(RouterClosedError):
        await a.submit(req("s1", "again"))
    # And the lease is left to expire: B serves the session only after the TTL
    lease = await cluster.backends.leases.current("s1")
    assert lease is not None and lease.holder == a.node_id
    result = await (await b.submit(req("s2", "other"))).result
    assert result.executed_by == b.node_id


async def test_forward_resolves_from_the_store_when_turn_result_is_missed(
    journal: Journal,
) -> None:
    from .conftest import make_cluster

    # (a short secondary TTL for a quick poll; touches must still come more often than it)
    async with make_cluster(
        journal, idempotency_secondary_ttl=0.2, lease_extend_interval=0.1
    ) as cluster:
        a, b, _ = cluster.nodes
        await (await a.submit(req("s1", "claim"))).result
        # Given the holder's TURN_RESULT broadcasts never arrive
        signals = a.backends.signals
        original = signals.publish

        async def drop_turn_results(signal):  # type: ignore[no-untyped-def]
            if signal.kind != "TURN_RESULT":
                await original(signal)

        signals.publish = drop_turn_results  # type: ignore[method-assign]
        hotpath = a.backends.hotpath  # (a finish publishes its TURN_RESULT itself)
        finish = hotpath.finish

        async def finish_unannounced(*args, **kwargs):  # type: ignore[no-untyped-def]
            return await finish(*args, **{**kwargs, "announce": None})

        hotpath.finish = finish_unannounced  # type: ignore[method-assign]
        # When B forwards a turn to A
        disp = await b.submit(req("s1", "polled"))
        # Then B still gets the result, from its poll of the idempotency store
        result = await asyncio.wait_for(disp.result, 10)
    assert disp.kind is SubmitKind.FORWARDED
    assert result.text == "echo:polled"


async def test_forward_to_a_stopping_holder_is_rerun_after_hand_over(journal: Journal) -> None:
    from .conftest import make_cluster

    async with make_cluster(journal, idle_ttl=0.3) as cluster:
        a, b, _ = cluster.nodes
        await (await a.submit(req("s1", "one"))).result
        # When A's idle sweeper hands the session back
        await wait_until(lambda: "s1" not in a.local_sessions())
        # Then the next submit anywhere claims it afresh and the handle was closed on A
        disp = await b.submit(req("s1", "two"))
        assert (await disp.result).executed_by == b.node_id
        assert journal.closed == ["s1"]
