"""Attempts: a turn whose holder is lost runs again under `on_holder_lost="retry"`, a turn whose
agent raised runs again under a retry policy (the backoff scheduled durably, surviving its
holder), and every attempt knows its number and fencing token."""

from __future__ import annotations

import asyncio

import pytest

from stickless import (
    Event,
    FailureCode,
    RetryPolicy,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
    is_terminal,
)
from stickless.router import EventStream

from .agents import Journal, failure_code, req, wait_until
from .conftest import ClusterFactory

#: A quick policy: retries 50 ms apart, no jitter.
QUICK = RetryPolicy(max_attempts=3, initial_interval=0.05, backoff_factor=1.0, jitter=0.0)


async def _frames_until_end(
    stream: EventStream, turn_id: str | None = None, frames: list[Event] | None = None
) -> list[Event]:
    """Every frame of a turn's stream (or of `turn_id` in a session's stream), up to the frame
    that ends the turn, appended to `frames` as they come."""
    frames = [] if frames is None else frames
    async for frame in stream:
        if turn_id is None or frame.turn_id == turn_id:
            frames.append(frame)
            if is_terminal(frame):
                break
    return frames


def _runs(journal: Journal, text: str) -> list[int]:
    return [attempt for _, _, t, attempt, _ in journal.attempts if t == text]


async def test_a_failed_turn_is_run_again_until_it_succeeds(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=1, retry=QUICK) as cluster:
        node = cluster.nodes[0]
        journal.fail_first["flaky"] = 2
        # Given a turn whose agent raises on its first two attempts
        disp = await node.submit(req("s1", "flaky"))
        stream = node.events("s1", disp.turn_id)
        # When it runs under a policy of three attempts
        result = await disp.result
        # Then the caller gets the third attempt's result, each attempt knew its number
        assert result.text == "echo:flaky"
        assert _runs(journal, "flaky") == [1, 2, 3]
        # And subscribers saw each failed attempt end as retrying, then the success
        frames = await _frames_until_end(stream)
        started = [f.attempt for f in frames if isinstance(f, TurnStarted)]
        retried = [f.attempt for f in frames if isinstance(f, TurnFailed) and f.retrying]
        assert started == [1, 2, 3]
        assert retried == [1, 2]
        assert isinstance(frames[-1], TurnCompleted) and frames[-1].attempt == 3
        # And only the successful attempt committed to the transcript
        record = await cluster.backends.records.load("s1")
        assert record is not None
        assert [e.content for e in record.entries] == ["flaky", "echo:flaky"]


async def test_a_turn_failing_every_attempt_fails_after_the_last(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=1, retry=QUICK) as cluster:
        node = cluster.nodes[0]
        journal.fail_first["broken"] = 10
        disp = await node.submit(req("s1", "broken", idempotency_key="k"))
        # When every attempt raises
        assert await failure_code(disp.result) is FailureCode.FAILED
        # Then it ran max_attempts times, and the reservation remembers the failed attempts
        assert _runs(journal, "broken") == [1, 2, 3]
        found = await cluster.backends.idempotency.find("s1", "c:k")
        assert found is not None and found.outcome is not None
        assert [h.attempt for h in found.history] == [1, 2]
        assert "flaky attempt 3" in found.outcome.message


async def test_a_terminal_error_is_never_retried(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=1, retry=QUICK) as cluster:
        node = cluster.nodes[0]
        journal.terminal.add("fatal")
        disp = await node.submit(req("s1", "fatal"))
        assert await failure_code(disp.result) is FailureCode.FAILED
        assert _runs(journal, "fatal") == [1]


async def test_without_a_policy_a_failed_turn_runs_once(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=1) as cluster:
        journal.fail_first["flaky"] = 1
        disp = await cluster.nodes[0].submit(req("s1", "flaky"))
        assert await failure_code(disp.result) is FailureCode.FAILED
        assert _runs(journal, "flaky") == [1]


async def test_a_retry_waiting_out_its_backoff_survives_its_holder(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    # The backoff is long enough for the holder to die during it, short enough to wait out.
    policy = RetryPolicy(max_attempts=2, initial_interval=1.0, backoff_factor=1.0, jitter=0.0)
    async with cluster_over(nodes=2, retry=policy) as cluster:
        holder, other = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        journal.fail_first["flaky"] = 1
        # Given a forwarded turn whose first attempt failed on the holder
        stream = other.events("s1")
        await stream.ready()
        disp = await other.submit(req("s1", "flaky", idempotency_key="k"))
        await wait_until(lambda: _runs(journal, "flaky") == [1])

        async def retry_scheduled() -> bool:
            found = await cluster.backends.idempotency.find("s1", "c:k")
            return found is not None and bool(found.history) and found.holder is None

        await wait_until(retry_scheduled)
        # When the holder dies while the retry waits out its backoff
        await cluster.kill(holder)
        # Then the next holder runs attempt 2 and the caller gets its result
        result = await disp.result
        assert result.text == "echo:flaky"
        assert result.executed_by == other.node_id
        assert _runs(journal, "flaky") == [1, 2]
        frames = await _frames_until_end(stream, disp.turn_id)
        assert [f.attempt for f in frames if isinstance(f, TurnStarted)] == [1, 2]


@pytest.mark.parametrize("submitted_on", ["holder", "elsewhere"])
async def test_a_turn_whose_holder_died_runs_again_under_retry(
    journal: Journal, cluster_over: ClusterFactory, submitted_on: str
) -> None:
    async with cluster_over(nodes=2, on_holder_lost="retry") as cluster:
        holder, other = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        gate = journal.gate("long")
        # Given a turn running on the holder (submitted there, or forwarded to it), with a
        # caller on the other node following it
        submitter = holder if submitted_on == "holder" else other
        stream = other.events("s1")
        await stream.ready()
        seen: list[Event] = []
        running = await submitter.submit(req("s1", "long", idempotency_key="k"))
        follower = await other.submit(req("s1", "long", idempotency_key="k"))
        reading = asyncio.ensure_future(_frames_until_end(stream, running.turn_id, seen))
        await journal.entered["long"].wait()
        await wait_until(lambda: any(isinstance(f, TurnStarted) for f in seen))
        # When the holder dies mid-turn (its first attempt's start seen by subscribers)
        await cluster.kill(holder)
        gate.set()
        # Then the turn runs again on the survivor as attempt 2, and the caller gets its result
        result = await follower.result
        assert result.text == "echo:long"
        assert result.executed_by == other.node_id
        assert _runs(journal, "long") == [1, 2]
        tokens = [token for _, _, t, _, token in journal.attempts if t == "long"]
        assert tokens[1] > tokens[0]
        # And subscribers saw the lost attempt fail (not the turn's end), then attempt 2
        frames = await reading
        lost = [f for f in frames if isinstance(f, TurnFailed)]
        assert [(f.attempt, f.code, f.retrying) for f in lost] == [
            (1, FailureCode.HOLDER_LOST, True)
        ]
        assert [f.attempt for f in frames if isinstance(f, TurnStarted)] == [1, 2]
        assert isinstance(frames[-1], TurnCompleted) and frames[-1].attempt == 2
        record = await cluster.backends.records.load("s1")
        assert record is not None
        assert [e.content for e in record.entries] == ["first", "echo:first", "long", "echo:long"]


async def test_a_lost_turn_fails_once_its_attempts_are_used_up(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=3, on_holder_lost="retry", holder_lost_max_attempts=2) as c:
        first, *survivors = c.nodes
        await (await first.submit(req("s1", "warm"))).result
        journal.gate("long")
        await first.submit(req("s1", "long", idempotency_key="k"))
        followers = {
            node.node_id: await node.submit(req("s1", "long", idempotency_key="k"))
            for node in survivors
        }
        await journal.entered["long"].wait()
        # Given the turn's first holder died and its second attempt started on a survivor
        await c.kill(first)
        await wait_until(lambda: _runs(journal, "long") == [1, 2])
        lease = await c.backends.leases.current("s1")
        assert lease is not None
        (second,) = [node for node in survivors if node.node_id == lease.holder]
        # When that holder dies too
        await c.kill(second)
        # Then the last caller gets HOLDER_LOST: no third attempt
        (last,) = [disp for node_id, disp in followers.items() if node_id != second.node_id]
        assert await failure_code(last.result) is FailureCode.HOLDER_LOST
        assert _runs(journal, "long") == [1, 2]
        # And the next holder, finding the message still pending, keeps it as a dead letter
        # with both lost attempts
        survivor = next(node for node in survivors if node is not second)

        async def lettered() -> bool:
            return bool(await survivor.dead_letters.list())

        await wait_until(lettered)
        (letter,) = await survivor.dead_letters.list()
        assert letter.turn_id == last.turn_id and letter.envelope is not None
        assert [(r.attempt, r.node) for r in letter.attempts] == [
            (1, first.node_id),
            (2, second.node_id),
        ]
        assert _runs(journal, "long") == [1, 2]


async def test_under_fail_a_lost_turn_is_not_run_again(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=2) as cluster:
        holder, other = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        journal.gate("long")
        await holder.submit(req("s1", "long", idempotency_key="k"))
        follower = await other.submit(req("s1", "long", idempotency_key="k"))
        await journal.entered["long"].wait()
        await cluster.kill(holder)
        assert await failure_code(follower.result) is FailureCode.HOLDER_LOST
        assert _runs(journal, "long") == [1]


async def test_an_attempt_given_up_while_its_holder_kept_the_lease_runs_again(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    # A lease that outlasts the test: the node takes its own lease back after giving the
    # session up, and must find the copy pending under it.
    async with cluster_over(nodes=1, on_holder_lost="retry", lease_ttl=60.0) as cluster:
        node = cluster.nodes[0]
        gate = journal.gate("long")
        disp = await node.submit(req("s1", "long", idempotency_key="k"))
        await journal.entered["long"].wait()
        # Given a sweep gave the running attempt up (its touches had stopped reaching the
        # store), while the node still holds the session's lease
        idem = cluster.backends.idempotency
        assert await idem.requeue_lost("s1", "c:k", disp.turn_id, node.node_id, "test", 3, 20.0)
        # When the attempt ends and its answer is refused
        gate.set()
        # Then the node runs the turn again from its pending copy, and the caller gets the
        # second attempt's result
        result = await disp.result
        assert result.text == "echo:long"
        assert _runs(journal, "long") == [1, 2]
        tokens = [token for _, _, t, _, token in journal.attempts if t == "long"]
        assert tokens[0] == tokens[1]  # under the same lease
        record = await cluster.backends.records.load("s1")
        assert record is not None
        assert [e.content for e in record.entries] == ["long", "echo:long"]


async def test_an_interrupt_between_attempts_cancels_the_turn_instead_of_running_it_again(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=3, on_holder_lost="retry") as cluster:
        holder, *others = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        journal.gate("long")
        running = await holder.submit(req("s1", "long", idempotency_key="k"))
        follower = await others[0].submit(req("s1", "long", idempotency_key="k"))
        await journal.entered["long"].wait()
        # Given the holder died mid-turn and no node runs the turn's next attempt yet
        await cluster.kill(holder)
        # When a client interrupts the turn (nothing is running it: nothing is interrupted now)
        assert not await others[1].interrupt("s1", "USER", turn_id=running.turn_id)
        # Then the next holder cancels the turn rather than running it again
        assert await failure_code(follower.result) is FailureCode.INTERRUPTED
        assert _runs(journal, "long") == [1]


async def test_an_interrupt_during_a_retrys_backoff_cancels_it_on_its_holder(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    policy = RetryPolicy(max_attempts=3, initial_interval=30.0, jitter=0.0)
    async with cluster_over(nodes=1, retry=policy) as cluster:
        node = cluster.nodes[0]
        journal.fail_first["flaky"] = 1
        disp = await node.submit(req("s1", "flaky", idempotency_key="k"))

        async def backing_off() -> bool:
            found = await cluster.backends.idempotency.find("s1", "c:k")
            return found is not None and bool(found.history) and found.holder is None

        await wait_until(backing_off)
        # When the turn is interrupted while its retry waits out a long backoff on this node
        assert await node.interrupt("s1", "USER", turn_id=disp.turn_id)
        # Then its caller is answered INTERRUPTED at once, and the retry never runs
        assert await failure_code(disp.result) is FailureCode.INTERRUPTED
        assert _runs(journal, "flaky") == [1]
