"""Failure handling on the simulated cluster: renewal, watchdog, fencing, holder loss, orphans,
poison entries, graceful shutdown and metrics that fail (fencing and holder loss over the memory
backends and over Redis)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from stickless import (
    FailureCode,
    Priority,
    RouterClosedError,
    SubmitKind,
    TurnFailedError,
)
from stickless.testing import CountingMetrics, LocalCluster
from stickless.wire import pack

from .agents import Journal, ScriptedOpener, ScriptedSession, req, wait_until
from .conftest import ClusterFactory, make_cluster

#: Failure tests shrink every bound so detection happens within a couple of seconds.
QUICK: dict[str, Any] = dict(
    lease_ttl=1.0,
    lease_extend_interval=0.25,
    idempotency_secondary_ttl=0.5,
    holder_loss_sweep_interval=0.25,
)


async def lease_of(cluster: LocalCluster, session: str) -> tuple[str, int] | None:
    lease = await cluster.backends.leases.current(session)
    return (lease.holder, lease.token) if lease else None


# ---------------------------------------------------------------- renewal and watchdog


async def test_agent_blocking_the_loop_for_two_lease_ttls_keeps_its_lease(
    journal: Journal,
) -> None:
    class Blocking(ScriptedSession):
        async def run_turn(self, turn):  # type: ignore[no-untyped-def]
            if turn.input.as_text() == "block":
                # A CPU-bound turn that starves the event loop (deliberately blocking).
                time.sleep(2 * QUICK["lease_ttl"])  # noqa: ASYNC251
            return await super().run_turn(turn)

    async with LocalCluster(
        2, session_factory=lambda s, a: Blocking(journal, s), **QUICK
    ) as cluster:
        a = cluster.nodes[0]
        await (await a.submit(req("s1", "warm"))).result
        before = await lease_of(cluster, "s1")
        # When a turn blocks the whole event loop for twice the lease TTL
        result = await (await a.submit(req("s1", "block"))).result
        # Then the renewal thread kept the lease: same holder, same token, and the commit landed
        assert await lease_of(cluster, "s1") == before
        assert result.executed_by == a.node_id
        record = await cluster.backends.records.load("s1")
        assert record is not None and record.entries[-1].content == "echo:block"


async def test_watchdog_stops_renewing_for_a_wedged_loop(journal: Journal) -> None:
    async with make_cluster(journal, **QUICK, watchdog_timeout=0.5) as cluster:
        a, b, _ = cluster.nodes
        await (await a.submit(req("s1", "mine"))).result
        # When A's main loop stops ticking (as seen by its renewer)
        a.renewer.ignore_heartbeats()

        # Then A stops renewing past the watchdog bound and B can take the session
        await wait_until(lambda: lease_expired(cluster), within=10)
        disp = await b.submit(req("s1", "b's turn"))
        assert disp.kind is SubmitKind.EXECUTED_LOCALLY
        assert (await disp.result).executed_by == b.node_id


async def lease_expired(cluster: LocalCluster) -> bool:
    return await cluster.backends.leases.current("s1") is None


async def test_lost_lease_interrupts_the_turn_once_and_requeues_waiting_work(
    journal: Journal,
) -> None:
    metrics = CountingMetrics()
    # (no holder-loss sweep within the test: A itself notices its loss and re-queues its work)
    settings = {**QUICK, "holder_loss_sweep_interval": 600.0}
    async with LocalCluster(
        3, opener=ScriptedOpener(journal), metrics=metrics, **settings
    ) as cluster:
        a = cluster.nodes[0]
        journal.gate("first")
        first = await a.submit(req("s1", "first"))
        await journal.entered["first"].wait()
        queued = await a.submit(req("s1", "queued"))
        # When A's renewals stall past the lease TTL, so the next renewal finds it lost
        a.renewer.pause()
        await wait_until(lambda: lease_expired(cluster), within=10)
        a.renewer.resume()
        # Then A's turn ends with LEASE_LOST exactly once, and the queued turn runs elsewhere
        with pytest.raises(TurnFailedError) as failure:
            await first.result
        assert failure.value.code is FailureCode.LEASE_LOST
        result = await asyncio.wait_for(queued.result, 10)
        assert result.text == "echo:queued"
        assert metrics.counts["on_lease_extend_failed"] == 1


# ---------------------------------------------------------------- fencing


async def test_paused_holders_late_commit_is_fenced_out(
    cluster_over: ClusterFactory, journal: Journal
) -> None:
    # (no holder-loss sweep within the test, so the fence answers, not the sweep)
    async with cluster_over(**{**QUICK, "holder_loss_sweep_interval": 600.0}) as cluster:
        a, b, _ = cluster.nodes
        await (await a.submit(req("s1", "before"))).result
        gate = journal.gate("late")
        late = await a.submit(req("s1", "late"))
        await journal.entered["late"].wait()
        # Given A is paused past its lease (renewals frozen) and B takes the session
        a.renewer.pause()
        await wait_until(lambda: lease_expired(cluster), within=10)
        taken = await b.submit(req("s1", "from b"))
        assert taken.kind is SubmitKind.EXECUTED_LOCALLY
        await taken.result
        # When A's turn finally finishes and tries to commit
        gate.set()
        # Then the write is refused by the fence and the turn ends LEASE_LOST
        with pytest.raises(TurnFailedError) as failure:
            await late.result
        assert failure.value.code is FailureCode.LEASE_LOST
        record = await cluster.backends.records.load("s1")
        assert record is not None
        assert [e.content for e in record.entries] == [
            "before",
            "echo:before",
            "from b",
            "echo:from b",
        ]
        tokens = [e.token for e in record.entries]
        assert tokens == sorted(tokens)
        turns = [e.turn_id for e in record.entries]
        assert turns[0] == turns[1] and turns[2] == turns[3] and turns[1] != turns[2]


# ---------------------------------------------------------------- holder loss


async def test_holder_death_loses_only_the_running_turn_and_the_collected_one_runs_elsewhere(
    cluster_over: ClusterFactory, journal: Journal
) -> None:
    async with cluster_over(**QUICK) as cluster:
        a, b, c = cluster.nodes
        await (await a.submit(req("s1", "committed"))).result
        watcher = c.events("s1")
        await watcher.ready()
        journal.gate("warmup")
        warm = await a.submit(req("s1", "warmup"))
        await journal.entered["warmup"].wait()
        # Given two forwarded callers, on B and C, queued behind A's running turn
        journal.gate("running")
        on_b = await b.submit(req("s1", "running"))
        on_c = await c.submit(req("s1", "waiting"))
        journal.gates["warmup"].set()
        await warm.result
        # ...A collected both: one runs, the other waits in A's mailbox, never started
        await journal.entered["running"].wait()
        # When A dies abruptly (tasks stopped, connections cut, nothing released)
        await cluster.kill(a)
        # Then the running turn's caller gets HOLDER_LOST (hang guard only)
        with pytest.raises(TurnFailedError) as failure:
            await asyncio.wait_for(on_b.result, 10)
        assert failure.value.code is FailureCode.HOLDER_LOST
        # And the turn that never started runs on a survivor: its caller gets the real result
        waited = await asyncio.wait_for(on_c.result, 10)
        assert waited.text == "echo:waiting"
        assert waited.executed_by in (b.node_id, c.node_id)
        # And the next submit is served by a survivor on top of the committed history (the
        # lost turn committed nothing)
        result = await (await b.submit(req("s1", "after"))).result
        assert result.executed_by in (b.node_id, c.node_id)
        record = await cluster.backends.records.load("s1")
        assert record is not None
        assert [e.content for e in record.entries] == [
            "committed",
            "echo:committed",
            "warmup",
            "echo:warmup",
            "waiting",
            "echo:waiting",
            "after",
            "echo:after",
        ]
        # And the subscriber saw why: exactly one TurnFailed(HOLDER_LOST), for the lost turn,
        # and no other turn's end but completions
        lost: list[str] = []
        async for event in watcher:
            assert event.type != "interrupted", event
            if event.type == "turn_failed":
                assert event.code == "HOLDER_LOST", event
                lost.append(event.turn_id)
            if event.type == "turn_completed" and event.turn_id == result.turn_id:
                break
        await watcher.aclose()
        assert lost == [on_b.turn_id]


# ---------------------------------------------------------------- orphaned messages


async def test_forwarder_rerings_the_doorbell_for_an_uncollected_message(
    journal: Journal,
) -> None:
    metrics = CountingMetrics()
    async with LocalCluster(3, opener=ScriptedOpener(journal), metrics=metrics, **QUICK) as cluster:
        a, b, _ = cluster.nodes
        await (await a.submit(req("s1", "claim"))).result
        # Given the holder dies before it could collect a forwarded message
        await cluster.kill(a)
        disp = await b.submit(req("s1", "orphan"))
        assert disp.kind is SubmitKind.FORWARDED
        # Then the forwarder's poll re-rings until the lease expires and someone drains
        result = await asyncio.wait_for(disp.result, 10)
        assert result.text == "echo:orphan"
        assert metrics.counts["on_forward_doorbell_rerung"] >= 1


async def test_message_survives_death_of_both_holder_and_submitter(journal: Journal) -> None:
    async with make_cluster(journal, **QUICK) as cluster:
        a, b, c = cluster.nodes
        await (await a.submit(req("s1", "claim"))).result
        await cluster.kill(a)
        disp = await b.submit(req("s1", "orphan", idempotency_key="k"))
        await cluster.kill(b)

        # When nobody is left waiting for it, the survivor's pending-sessions scan claims it
        async def done() -> bool:
            found = await cluster.backends.idempotency.find("s1", "c:k")
            return found is not None and found.outcome is not None

        await wait_until(done, within=10)
        found = await cluster.backends.idempotency.find("s1", "c:k")
        assert found is not None and found.outcome is not None
        assert found.outcome.ok and found.outcome.executed_by == c.node_id
        assert disp.kind is SubmitKind.FORWARDED


# ---------------------------------------------------------------- poison entries


async def test_unreadable_entry_fails_its_caller_and_spares_its_batch(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = cluster.nodes
    journal.gate("busy")
    busy = await a.submit(req("s1", "busy"))
    await journal.entered["busy"].wait()
    # Given B's delivery of one message is corrupted on the way into the inbox
    inbox = b.backends.inbox
    deliver = inbox.deliver

    async def corrupting(envelope, delivery_id=None):  # type: ignore[no-untyped-def]
        if envelope.input.as_text() == "poison":
            raw = envelope.model_dump(mode="python")
            raw["priority"] = "not a priority"
            return await cluster.backends.inbox.deliver_raw(
                envelope.session_id, Priority.NEXT, pack(raw)
            )
        return await deliver(envelope, delivery_id)

    inbox.deliver = corrupting  # type: ignore[method-assign]
    # (B's reserve queues nothing itself, so its message goes through that delivery)
    hotpath = b.backends.hotpath
    reserve = hotpath.reserve

    async def reserving_only(*args):  # type: ignore[no-untyped-def]
        return await reserve(*args[:8])

    hotpath.reserve = reserving_only  # type: ignore[method-assign]
    good1 = await c.submit(req("s1", "good one"))
    poison = await b.submit(req("s1", "poison", idempotency_key="p"))
    good2 = await c.submit(req("s1", "good two"))
    # When the holder collects the batch
    journal.gates["busy"].set()
    # Then the corrupt entry's caller is answered UNREADABLE and the others run in order
    with pytest.raises(TurnFailedError) as failure:
        await poison.result
    assert failure.value.code is FailureCode.UNREADABLE
    assert (await good1.result).text == "echo:good one"
    assert (await good2.result).text == "echo:good two"
    await busy.result
    assert journal.texts("s1") == ["busy", "good one", "good two"]
    assert await cluster.backends.idempotency.find("s1", "c:p") is None
    assert await cluster.backends.inbox.is_empty("s1")
    # And the entry is kept in the dead letters, with its bytes and what could be read of it
    (letter,) = await a.dead_letters.list()
    assert (letter.turn_id, letter.idempotency_key) == (poison.turn_id, "p")
    assert letter.envelope is None and letter.raw is not None and b"poison" in letter.raw
    assert letter.reason.startswith("unreadable inbox entry")


# ---------------------------------------------------------------- graceful shutdown


async def test_graceful_shutdown_hands_sessions_over_at_once(journal: Journal) -> None:
    # (long timings: the hand-over must wait for none of them)
    settings = dict(lease_ttl=30.0, lease_extend_interval=10.0, idempotency_secondary_ttl=30.0)
    async with make_cluster(journal, **settings) as cluster:
        a, b, c = cluster.nodes
        journal.gate("long")
        long_turn = await a.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        queued = await b.submit(req("s1", "queued"))
        # When A shuts down gracefully with a short grace while a turn runs
        started = asyncio.get_running_loop().time()
        await a.aclose(grace=0.1)
        # Then the running turn was interrupted for shutdown, the waiting message is served by
        # another node, and all of it well under one lease TTL (30 s here)
        with pytest.raises(TurnFailedError) as interrupted:
            await long_turn.result
        assert interrupted.value.code is FailureCode.SHUTDOWN
        assert interrupted.value.executed_by == a.node_id
        result = await asyncio.wait_for(queued.result, 10)
        assert result.executed_by in (b.node_id, c.node_id)
        assert asyncio.get_running_loop().time() - started < 5.0
        assert ("s1", "SYSTEM_SHUTDOWN") in journal.interrupts
        assert journal.closed.count("s1") == 1
        with pytest.raises(RouterClosedError):
            await a.submit(req("s1", "refused"))
        await a.aclose()  # idempotent


# ---------------------------------------------------------------- metrics


async def test_failing_metrics_never_break_a_session(journal: Journal) -> None:
    class Broken(CountingMetrics):
        def _record(self, hook: str, *args: Any) -> None:
            super()._record(hook, *args)
            raise RuntimeError(f"metrics backend down in {hook}")

    metrics = Broken()
    async with LocalCluster(3, opener=ScriptedOpener(journal), metrics=metrics) as cluster:
        a, b, _ = cluster.nodes
        assert (await (await a.submit(req("s1", "x"))).result).text == "echo:x"
        assert (await (await b.submit(req("s1", "y"))).result).text == "echo:y"
    assert metrics.counts["on_submit"] == 2
    assert metrics.counts["on_lock_acquire"] >= 1


async def test_one_renewal_call_per_tick_however_many_sessions(journal: Journal) -> None:
    async with make_cluster(journal, nodes=1, **QUICK) as cluster:
        node = cluster.nodes[0]
        # Given a node holding 40 sessions, one of them mid-turn (so it holds a reservation)
        for i in range(40):
            await (await node.submit(req(f"s{i}", "x"))).result
        journal.gate("busy")
        busy = await node.submit(req("s0", "busy"))
        await journal.entered["busy"].wait()
        liveness = node.renewer._backends.liveness
        renew_calls: list[str] = []
        renew = liveness.renew

        async def counting_renew(holder, incarnation, ttl, index_ttl):  # type: ignore[no-untyped-def]
            renew_calls.append(holder)
            return await renew(holder, incarnation, ttl, index_ttl)

        liveness.renew = counting_renew  # type: ignore[method-assign]
        ticks = node.renewer.ticks
        await wait_until(lambda: node.renewer.ticks >= ticks + 3)
        # Then every tick renewed the node's one liveness key, and nothing else, and every
        # lease and the running turn's reservation are still the node's
        assert len(renew_calls) >= 3 and set(renew_calls) == {node.node_id}
        assert len(renew_calls) <= node.renewer.ticks - ticks + 1
        for i in range(40):
            lease = await cluster.backends.leases.current(f"s{i}")
            assert lease is not None and lease.holder == node.node_id
        found = await cluster.backends.idempotency.find_stale_in_flight(10)
        assert found == []
        journal.gates["busy"].set()
        await busy.result


async def test_outcome_is_recorded_later_when_finishing_fails(journal: Journal) -> None:
    async with make_cluster(journal, **QUICK) as cluster:
        a, b, _ = cluster.nodes
        # Given the store refuses the first two attempts to record an outcome (a blip)
        store = a.backends.hotpath
        finish = store.finish
        failures = [RuntimeError("blip"), RuntimeError("blip")]

        async def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
            if failures:
                raise failures.pop()
            return await finish(*args, **kwargs)

        store.finish = flaky  # type: ignore[method-assign]
        # When a keyed turn succeeds and its caller is answered
        first = await (await a.submit(req("s1", "once", idempotency_key="k"))).result

        # Then the outcome is still recorded (the reservation never went stale meanwhile)
        async def recorded() -> bool:
            found = await cluster.backends.idempotency.find("s1", "c:k")
            return found is not None and found.outcome is not None

        await wait_until(recorded)
        # And a retry gets the cached result instead of running the turn again
        retry = await b.submit(req("s1", "once", idempotency_key="k"))
        assert await retry.result == first
        assert journal.texts("s1") == ["once"]
        assert failures == []
