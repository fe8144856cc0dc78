"""Turn lookup on every node: `result`, `turn` and `transcript` from the store, over memory and
Redis, whichever node took the submit (even a dead one)."""

from __future__ import annotations

import asyncio

import pytest

from stickless import (
    FailureCode,
    SubmitKind,
    TurnFailedError,
    TurnState,
    UnknownTurnError,
)
from stickless.testing import LocalCluster

from .agents import Journal, req, wait_until


async def test_a_result_is_fetched_on_a_node_other_than_the_accepting_one(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = backend_cluster.nodes
    # Given a turn submitted on A and still running
    journal.gate("slow")
    disp = await a.submit(req("s1", "slow"))
    await journal.entered["slow"].wait()
    # When B and C ask for its result while it runs, and it then finishes
    on_b = asyncio.ensure_future(b.result("s1", disp.turn_id))
    on_c = asyncio.ensure_future(c.result("s1", disp.turn_id))
    assert not on_b.done() and not on_c.done()
    journal.gates["slow"].set()
    # Then both get the turn's own result, as A's caller does
    own = await disp.result
    assert await on_b == own == await on_c
    assert own.text == "echo:slow" and own.executed_by == a.node_id
    # And a later lookup is answered from the store
    assert await c.result("s1", disp.turn_id) == own


async def test_a_result_outlives_the_accepting_node(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a finished turn and a running one, both taken by A, which then crashes
    done = await a.submit(req("s1", "first"))
    await done.result
    journal.gate("cut")
    cut = await a.submit(req("s1", "cut"))
    await journal.entered["cut"].wait()
    await backend_cluster.kill(a)
    # When B asks for both results
    first = await b.result("s1", done.turn_id)
    # Then the finished turn's result is there, and the running one fails HOLDER_LOST once
    # the dead holder's reservation is reset
    assert first.text == "echo:first" and first.executed_by == a.node_id
    with pytest.raises(TurnFailedError) as lost:
        await b.result("s1", cut.turn_id)
    assert lost.value.code is FailureCode.HOLDER_LOST
    assert lost.value.turn_id == cut.turn_id


async def test_a_queued_turn_is_waited_for_and_reported_queued(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = backend_cluster.nodes
    # Given a running turn on A and a second turn forwarded from B, queued behind it
    journal.gate("one")
    journal.gate("two")
    one = await a.submit(req("s1", "one"))
    await journal.entered["one"].wait()
    two = await b.submit(req("s1", "two"))
    assert two.kind is SubmitKind.FORWARDED
    # When C waits for the queued turn's result and looks at both turns
    waiting = asyncio.ensure_future(c.result("s1", two.turn_id))
    running_info = await a.turn("s1", one.turn_id)
    queued_here, queued_there = await a.turn("s1", two.turn_id), await c.turn("s1", two.turn_id)
    # Then the first runs on A, the second is queued (on the holder and elsewhere)
    assert (running_info.state, running_info.executed_by) == (TurnState.RUNNING, a.node_id)
    assert queued_here.state is queued_there.state is TurnState.QUEUED
    assert queued_there.executed_by is None and queued_there.result is None
    assert not waiting.done()
    # When the first finishes, the second runs (taken over on A: running seen from C)
    journal.gates["one"].set()
    await journal.entered["two"].wait()
    running_there = await c.turn("s1", two.turn_id)
    assert (running_there.state, running_there.executed_by) == (TurnState.RUNNING, a.node_id)
    # Then, once it finishes, the waiting lookup gets its result
    journal.gates["two"].set()
    result = await waiting
    assert (result.text, result.executed_by) == ("echo:two", a.node_id)
    completed = await b.turn("s1", two.turn_id)
    assert completed.state is TurnState.COMPLETED and completed.result == result
    assert journal.texts("s1") == ["one", "two"]


async def test_a_failed_turn_raises_its_code_and_is_reported_failed(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = backend_cluster.nodes
    # Given a running turn interrupted, and a queued turn evicted by a release
    journal.gate("stop me")
    stopped = await a.submit(req("s1", "stop me"))
    await journal.entered["stop me"].wait()
    assert await c.interrupt("s1", turn_id=stopped.turn_id)
    journal.gate("held")
    await a.submit(req("s2", "held"))
    await journal.entered["held"].wait()
    evicted = await b.submit(req("s2", "never"))
    await a.release_session("s2")
    # When another node asks for their results
    with pytest.raises(TurnFailedError) as interrupted:
        await b.result("s1", stopped.turn_id)
    with pytest.raises(TurnFailedError) as gone:
        await c.result("s2", evicted.turn_id)
    # Then each raises its code, and `turn` reports it failed with that code
    assert interrupted.value.code is FailureCode.INTERRUPTED
    assert gone.value.code is FailureCode.EVICTED
    info = await c.turn("s1", stopped.turn_id)
    assert (info.state, info.failure_code) == (TurnState.FAILED, FailureCode.INTERRUPTED)
    assert "never" not in journal.texts("s2")


async def test_an_unknown_turn_is_reported_unknown(backend_cluster: LocalCluster) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a session with one turn
    disp = await a.submit(req("s1", "hello"))
    await disp.result
    # When a turn id it never had is looked up, or its turn in another session
    # Then each lookup raises UnknownTurnError (a LookupError)
    with pytest.raises(UnknownTurnError):
        await b.result("s1", "no-such-turn")
    with pytest.raises(UnknownTurnError):
        await b.turn("s1", "no-such-turn")
    with pytest.raises(LookupError):
        await b.result("other", disp.turn_id)


async def test_a_result_wait_is_bounded_by_its_timeout(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a turn held mid-run
    journal.gate("held")
    disp = await a.submit(req("s1", "held"))
    await journal.entered["held"].wait()
    # When B waits for it with a short timeout, then it raises TimeoutError
    with pytest.raises(TimeoutError):
        await b.result("s1", disp.turn_id, timeout=0.05)
    # And the turn goes on: a wait without one gets its result
    waiting = asyncio.ensure_future(b.result("s1", disp.turn_id))
    journal.gates["held"].set()
    assert (await waiting).text == "echo:held"


async def test_the_transcript_is_read_on_any_node(backend_cluster: LocalCluster) -> None:
    a, b, _ = backend_cluster.nodes
    # Given two turns of a session
    for text in ("one", "two"):
        await (await a.submit(req("s1", text))).result
    # When another node reads its transcript
    entries = await b.transcript("s1")
    # Then it holds both turns' committed entries in order, and an unknown session has none
    assert [(e.role, e.content) for e in entries] == [
        ("user", "one"),
        ("assistant", "echo:one"),
        ("user", "two"),
        ("assistant", "echo:two"),
    ]
    assert await b.transcript("nobody") == []


async def test_turns_held_by_their_submitter_are_told_apart_by_the_holders_status(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given two turns submitted on A, which holds the session: one running, one in its mailbox
    # (both reservations held by A at attempt 0)
    journal.gate("first")
    first = await a.submit(req("s1", "first"))
    await journal.entered["first"].wait()
    second = await a.submit(req("s1", "second"))

    # When B has heard A's status naming the running turn
    async def heard() -> bool:
        return (await b.status("s1")).active_turn_id == first.turn_id

    await wait_until(heard)
    running, queued = await b.turn("s1", first.turn_id), await b.turn("s1", second.turn_id)
    # Then B reports the first running on A and the second queued
    assert (running.state, running.executed_by) == (TurnState.RUNNING, a.node_id)
    assert (queued.state, queued.executed_by) == (TurnState.QUEUED, None)
    journal.gates["first"].set()
    assert (await b.result("s1", second.turn_id)).text == "echo:second"


async def test_a_result_wait_reads_the_store_when_no_signal_comes(
    backend_cluster: LocalCluster, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a running turn on A, and B deaf to every answer announced to it
    journal.gate("quiet")
    disp = await a.submit(req("s1", "quiet"))
    await journal.entered["quiet"].wait()
    monkeypatch.setattr(b._callers, "resolve", lambda outcome: None)
    # When B waits for its result and the turn finishes
    waiting = asyncio.ensure_future(b.result("s1", disp.turn_id))
    journal.gates["quiet"].set()
    # Then B still gets it, from the stored outcome
    assert (await waiting).text == "echo:quiet"
