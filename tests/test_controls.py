"""Interrupts, cross-node events, release, delete and status through the public API (delete over
the memory backends and over Redis)."""

from __future__ import annotations

import asyncio

import pytest

from stickless import (
    Event,
    FailureCode,
    SessionBusyError,
    SessionState,
    SubmitRequest,
    TurnFailedError,
)
from stickless.testing import LocalCluster

from .agents import Journal, req, wait_until
from .conftest import make_cluster


async def collect(stream: object, until_type: str) -> list[Event]:
    seen: list[Event] = []
    async for event in stream:  # type: ignore[attr-defined]
        seen.append(event)
        if event.type == until_type:
            break
    return seen


# ---------------------------------------------------------------- interrupt


async def test_session_interrupt_from_a_non_holder_stops_the_turn(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = cluster.nodes
    journal.gate("long")
    stream = c.events("s1")
    await stream.ready()
    disp = await a.submit(req("s1", "long"))
    await journal.entered["long"].wait()
    # When a node that does not hold the session interrupts it
    await b.interrupt("s1", reason="USER")
    # Then the caller gets INTERRUPTED, the agent heard why, subscribers see Interrupted
    with pytest.raises(TurnFailedError) as failure:
        await disp.result
    assert failure.value.code is FailureCode.INTERRUPTED
    assert journal.interrupts == [("s1", "USER")]
    events = await collect(stream, "interrupted")
    assert events[-1].reason == "USER"  # type: ignore[union-attr]
    # And nothing of the interrupted turn was committed
    record = await cluster.backends.records.load("s1")
    assert record is not None and record.entries == ()


async def test_targeted_interrupt_hits_only_the_named_turn(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = cluster.nodes
    gate = journal.gate("second")
    first = await a.submit(req("s1", "first"))
    await first.result
    second = await a.submit(req("s1", "second"))
    await journal.entered["second"].wait()
    # When a targeted interrupt names the earlier (no longer active) turn
    await b.interrupt("s1", reason="USER", turn_id=first.turn_id)
    # Then it is a no-op: the active turn completes
    gate.set()
    assert (await second.result).text == "echo:second"
    assert journal.interrupts == []
    # And one naming the active turn does interrupt it
    journal.gate("third")
    third = await a.submit(req("s1", "third"))
    await journal.entered["third"].wait()
    await b.interrupt("s1", reason="USER", turn_id=third.turn_id)
    with pytest.raises(TurnFailedError) as failure:
        await third.result
    assert failure.value.code is FailureCode.INTERRUPTED


async def test_interrupt_cancels_an_agent_that_ignores_it(journal: Journal) -> None:
    class Stubborn:
        async def run_turn(self, turn):  # type: ignore[no-untyped-def]
            await asyncio.Event().wait()  # never returns on its own

        async def interrupt(self, reason: str) -> None:
            return None

        async def aclose(self) -> None:
            return None

    async with LocalCluster(2, session_factory=lambda s, a: Stubborn(), interrupt_grace=0.1) as c:
        a, b = c.nodes
        disp = await a.submit(req("s1", "x"))
        await wait_until(lambda: a.local_sessions() == ["s1"])
        stream = b.events("s1")
        await stream.ready()
        await b.interrupt("s1")
        with pytest.raises(TurnFailedError) as failure:
            await disp.result
        assert failure.value.code is FailureCode.INTERRUPTED
        # The session stays usable after the cancelled turn
        assert "s1" in a.local_sessions()
        await stream.aclose()


# ---------------------------------------------------------------- events


async def test_events_reach_a_subscriber_on_another_node_in_order(
    cluster: LocalCluster,
) -> None:
    a, _, c = cluster.nodes
    stream = c.events("s1")
    await stream.ready()
    disp = await a.submit(req("s1", "one two three four five"))
    await disp.result
    events = await collect(stream, "turn_completed")
    await stream.aclose()
    # Then C saw every frame of the turn A ran, in order, stamped by the relay
    assert [e.type for e in events] == ["turn_started"] + ["text_delta"] * 5 + ["turn_completed"]
    assert [e.seq for e in events] == list(range(1, 8))
    assert {e.turn_id for e in events} == {disp.turn_id}
    assert "".join(e.text for e in events if e.type == "text_delta") == "one two three four five "  # type: ignore[union-attr]
    ids = [e.event_id for e in events]
    assert all(ids) and len(set(ids)) == len(ids)


async def test_events_after_none_is_live_only_and_after_cursor_replays(
    cluster: LocalCluster,
) -> None:
    a, b, _ = cluster.nodes
    await (await a.submit(req("s1", "earlier"))).result
    # A live subscriber started now sees only later turns
    live = b.events("s1")
    await live.ready()
    later = await a.submit(req("s1", "later"))
    await later.result
    live_events = await collect(live, "turn_completed")
    await live.aclose()
    assert {e.turn_id for e in live_events} == {later.turn_id}
    # A subscriber resuming after the first turn's TurnStarted replays the rest, then goes live
    log = await cluster.backends.events.read("s1", None, 100)
    cursor = log[0].event_id
    resumed = b.events("s1", after=cursor)
    await resumed.ready()
    third = await a.submit(req("s1", "third"))
    await third.result
    replayed = []
    async for event in resumed:
        replayed.append(event)
        if event.type == "turn_completed" and event.turn_id == third.turn_id:
            break
    await resumed.aclose()
    keys = [(e.turn_id, e.seq) for e in replayed]
    assert keys == [(e.turn_id, e.seq) for e in log[1:]] + [
        (third.turn_id, s) for s in range(1, len(keys) - len(log) + 2)
    ]
    assert len(keys) == len(set(keys))  # no duplicates between replay and live


async def test_turn_scoped_stream_ends_after_that_turns_terminal_frame(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = cluster.nodes
    journal.gate("watched")
    first = await a.submit(req("s1", "watched"))
    await journal.entered["watched"].wait()
    stream = b.events("s1", turn_id=first.turn_id)
    await stream.ready()
    journal.gates["watched"].set()
    events = [e async for e in stream]
    assert events[-1].type == "turn_completed"
    assert {e.turn_id for e in events} == {first.turn_id}


# ---------------------------------------------------------------- release / delete


async def test_release_keeps_history_and_frees_the_session(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = cluster.nodes
    await (await a.submit(req("s1", "remember me"))).result
    # When a non-holder releases the session (YIELD to the holder, wait for EVICT)
    await b.release_session("s1")
    # Then the holder closed its handle and gave up the lease; the history is still there
    assert journal.closed == ["s1"]
    assert "s1" not in a.local_sessions()
    assert await cluster.backends.leases.current("s1") is None
    record = await cluster.backends.records.load("s1")
    assert record is not None and next(e.content for e in record.entries) == "remember me"
    # And the next turn opens a fresh handle and sees that history
    await (await b.submit(req("s1", "again"))).result
    record = await cluster.backends.records.load("s1")
    assert record is not None and len(record.entries) == 4


async def test_release_answers_queued_messages_evicted(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _c = cluster.nodes
    journal.gate("running")
    running = await a.submit(req("s1", "running"))
    await journal.entered["running"].wait()
    queued = await b.submit(req("s1", "queued"))
    # When the holder releases the session while one turn runs and one waits
    await a.release_session("s1")
    # Then the running turn was cut short and the queued message answered, both EVICTED (not
    # the user's INTERRUPTED, which would stay the key's answer)
    with pytest.raises(TurnFailedError) as first:
        await running.result
    assert first.value.code is FailureCode.EVICTED
    assert journal.interrupts == [("s1", "SESSION_RELEASED")]
    with pytest.raises(TurnFailedError) as second:
        await queued.result
    assert second.value.code is FailureCode.EVICTED
    assert journal.texts("s1") == ["running"]


async def test_delete_clears_history_and_completes_subscribers(
    backend_cluster: LocalCluster,
) -> None:
    a, b, c = backend_cluster.nodes
    secret = await a.submit(req("s1", "secret", idempotency_key="k"))
    await secret.result
    stream = c.events("s1")
    await stream.ready()
    # When a non-holder deletes the session (YIELD hand-off, then delete as the holder)
    await b.delete_session("s1")
    # Then the record, the event log and the lease are gone and subscribers everywhere completed
    backends = backend_cluster.backends
    assert await backends.records.load("s1") is None
    assert await backends.events.read("s1", None, 10) == []
    assert await backends.leases.current("s1") is None
    # (the last frames of the turn answered just before may still reach the new subscriber)
    assert {e.turn_id async for e in stream} <= {secret.turn_id}
    # And the next submit starts a brand-new session at once (any agent may bind it)
    result = await (
        await c.submit(SubmitRequest(session_id="s1", agent_ref="other-bot", input="new"))
    ).result
    assert result.executed_by == c.node_id


async def test_delete_gives_up_when_the_holder_does_not_hand_over(
    journal: Journal,
) -> None:
    async with make_cluster(journal, release_interrupt_timeout=0.3) as cluster:
        a, b, _ = cluster.nodes
        await (await a.submit(req("s1", "held"))).result
        # Given a holder that no longer hears signals (its control subscription is gone)
        assert a._control is not None
        await a._control.close()
        # Then a delete from another node fails with SessionBusyError and deletes nothing
        with pytest.raises(SessionBusyError):
            await b.delete_session("s1")
        assert await cluster.backends.records.load("s1") is not None


# ---------------------------------------------------------------- status


async def test_status_from_another_node_shows_the_running_turn(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = cluster.nodes
    gate = journal.gate("busy")
    disp = await a.submit(req("s1", "busy"))
    await journal.entered["busy"].wait()

    async def running_seen() -> bool:
        status = await b.status("s1")
        return status.state is SessionState.RUNNING

    await wait_until(running_seen)
    status = await b.status("s1")
    assert status.holder == a.node_id
    assert status.active_turn_id == disp.turn_id
    gate.set()
    await disp.result

    async def idle_seen() -> bool:
        return (await b.status("s1")).state is SessionState.IDLE

    await wait_until(idle_seen)
    unknown = await b.status("never-seen")
    assert unknown.state is SessionState.UNHELD and unknown.holder is None


async def test_unknown_signal_kinds_are_dropped_without_harm(cluster: LocalCluster) -> None:
    from stickless.wire import Signal

    a, b, _ = cluster.nodes
    await (await a.submit(req("s1", "before"))).result
    # When a newer node broadcasts a kind this version does not know
    await cluster.backends.signals.publish(
        Signal(kind="FROM_THE_FUTURE", session_id="s1", origin="newer-node", payload={"x": 1})
    )
    # Then every node keeps handling signals: a forwarded turn still completes
    result = await (await b.submit(req("s1", "after"))).result
    assert result.executed_by == a.node_id
