"""Turns answered without running: a take-over the store never decided does not run, a turn
re-queued and taken back by the same node is waited on as a local turn, and every turn answered
without running ends its stream with a frame that agrees with its recorded answer."""

from __future__ import annotations

import asyncio

import pytest

from stickless import BackendUnavailableError, FailureCode, TurnResult
from stickless.actors import TurnWork
from stickless.testing import LocalCluster
from stickless.wire import Outcome

from .agents import Journal, failure_code, req
from .commits import mark_done
from .conftest import make_cluster


async def test_a_message_whose_take_over_stays_undecided_never_runs(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_cluster(journal, nodes=2, forward_ttl=1.0) as cluster:
        holder, other = cluster.nodes
        gate = journal.gate("long")
        running = await holder.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        # Given a forwarded message whose take-over the store never answers on the holder
        queued = await other.submit(req("s1", "queued"))
        idem = holder.backends.idempotency
        acquire = idem.acquire_holder

        async def unreachable_for_queued(
            session_id: str, key: str, turn_id: str, *args: object, **kwargs: object
        ) -> object:
            if turn_id == queued.turn_id:
                raise BackendUnavailableError("connection reset")
            return await acquire(session_id, key, turn_id, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(idem, "acquire_holder", unreachable_for_queued)
        # And a later message the store does answer for
        after = await other.submit(req("s1", "after"))
        gate.set()
        # When the holder collects both
        assert (await running.result).text == "echo:long"
        assert (await after.result).text == "echo:after"
        # Then the undecided one never ran (it may have been withdrawn meanwhile), and its
        # caller was answered by its forward deadline
        assert await failure_code(queued.result) is FailureCode.FORWARD_TIMEOUT
        assert journal.texts("s1") == ["long", "after"]


async def test_a_turn_requeued_and_taken_back_by_its_node_waits_as_a_local_turn(
    journal: Journal,
) -> None:
    forward_ttl = 1.0
    # (no holder-loss sweep within the test: the node itself notices its loss)
    quiet_sweep = {"holder_loss_sweep_interval": 600.0}
    async with make_cluster(journal, nodes=1, forward_ttl=forward_ttl, **quiet_sweep) as cluster:
        node = cluster.nodes[0]
        journal.gate("long")
        queued_gate = journal.gate("queued")
        lost = await node.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        queued = await node.submit(req("s1", "queued"))
        # Given the node's incarnation ends (it loses every lease): its running turn ends
        # LEASE_LOST and the queued turn goes back to the inbox (its caller now follows it like
        # a forward)
        assert await cluster.backends.liveness.retire(node.node_id)
        assert await failure_code(lost.result) is FailureCode.LEASE_LOST
        # When the same node takes the session back and runs the turn for longer than
        # forward_ttl
        await journal.entered["queued"].wait()
        await asyncio.sleep(forward_ttl * 2)
        queued_gate.set()
        # Then its caller gets the turn's real answer, not FORWARD_TIMEOUT
        assert (await queued.result).text == "echo:queued"


async def test_a_queued_turn_ended_by_release_ends_its_stream(journal: Journal) -> None:
    async with make_cluster(journal, nodes=2) as cluster:
        holder, other = cluster.nodes
        journal.gate("long")
        await holder.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        queued = await other.submit(req("s1", "queued"))
        # When the session is released with a turn still queued
        await other.release_session("s1")
        # Then that turn's caller gets EVICTED and its stream a matching terminal frame
        assert await failure_code(queued.result) is FailureCode.EVICTED
        frames = await cluster.backends.events.read("s1", None, 1000)
        ends = [f for f in frames if f.turn_id == queued.turn_id]
        assert [(f.type, f.code) for f in ends] == [("turn_failed", FailureCode.EVICTED)]  # type: ignore[union-attr]


async def test_a_cancel_whose_turn_was_answered_elsewhere_sends_no_contradicting_frame(
    journal: Journal,
) -> None:
    async with make_cluster(journal, nodes=1) as cluster:
        node = cluster.nodes[0]
        gate = journal.gate("long")
        await node.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        queued = await node.submit(req("s1", "queued", idempotency_key="k"))
        # Given another node already recorded the queued turn's answer (a holder-loss reset)
        lost = Outcome.failure(queued.turn_id, FailureCode.HOLDER_LOST, "declared lost", "x")
        idem = cluster.backends.idempotency
        assert await idem.compare_and_reset("s1", "c:k", node.node_id, lost) is True
        # When the queued turn is cancelled here
        assert await node.interrupt("s1", turn_id=queued.turn_id) is True
        # Then its caller gets the recorded answer, and no frame says it was interrupted
        assert await failure_code(queued.result) is FailureCode.HOLDER_LOST
        gate.set()
        frames = await cluster.backends.events.read("s1", None, 1000)
        assert [f for f in frames if f.turn_id == queued.turn_id] == []


#: The answer another node ("other") records for turn-1.
DONE = Outcome(turn_id="turn-1", ok=True, text="the real answer", executed_by="other")


async def _reserved_elsewhere(
    cluster: LocalCluster, text: str
) -> tuple[TurnWork, asyncio.Future[TurnResult]]:
    """Turn-1 of s1 (key "k") reserved and held by another node, this node's copy of its work,
    and a caller of it waiting here."""
    node = cluster.nodes[0]
    request = req("s1", text, idempotency_key="k")
    work = TurnWork.from_request(request, "turn-1", "c:k", node.node_id)
    idem = cluster.backends.idempotency
    assert await idem.put_if_absent("s1", "c:k", "turn-1", "h", "other", 30.0, 60.0) is None
    return work, node._callers.add("turn-1", "s1")


async def test_a_refused_answer_whose_lookup_fails_never_contradicts_the_stored_one(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_cluster(journal, nodes=1) as cluster:
        node = cluster.nodes[0]
        # Given a turn whose answer is recorded (DONE, by another node), with a caller here
        work, caller = await _reserved_elsewhere(cluster, "done elsewhere")
        assert await mark_done(cluster.backends, "s1", "c:k", "other", DONE, 60.0)
        # And this node's lookups of the store would fail for a moment
        find = node.backends.idempotency.find
        failures = [BackendUnavailableError("connection reset")] * 2

        async def flaky_find(*args: object) -> object:
            if failures:
                raise failures.pop()
            return await find(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(node.backends.idempotency, "find", flaky_find)
        # When this node ends the turn without running it (say, purged by a release) and its
        # answer is refused by the store
        await node._outcomes.fail(work, FailureCode.EVICTED, "session released")
        # Then the caller gets the recorded answer, not a failure of this node's making: the
        # refused finish returned it, so no lookup was needed
        assert (await caller).text == "the real answer"
        assert len(failures) == 2


async def test_a_copy_of_a_turn_running_elsewhere_leaves_its_callers_to_that_turn(
    journal: Journal,
) -> None:
    async with make_cluster(journal, nodes=1) as cluster:
        node = cluster.nodes[0]
        # Given a turn that started on another node (its reservation is held there), with a
        # caller here following it
        work, caller = await _reserved_elsewhere(cluster, "running elsewhere")
        # When this node ends a copy of it without running (say, purged by a release)
        await node._outcomes.fail(work, FailureCode.EVICTED, "session released")
        # Then the caller is not answered for it: the turn's own holder answers, later
        assert not caller.done()
        assert await mark_done(cluster.backends, "s1", "c:k", "other", DONE, 60.0)
        await node._outcomes.announce("s1", "c:k", DONE)
        assert (await caller).text == "the real answer"
