"""Delivery under real process and server faults: a message a holder process collected but never
started survives a redis-server restart and the holder's SIGKILL, and runs on a survivor; only
the turn that was running is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stickless import FailureCode, TurnFailedError

from . import test_multiprocess
from .mp_cluster import LogEntry, MpCluster, poll
from .redis_fixture import RedisServer
from .storm.faults import ProxyPool
from .test_multiprocess import assert_fenced_and_unsplit, request, transcript

aof_server = test_multiprocess.aof_server
node_logs = test_multiprocess.node_logs

#: Hang guard for an answer: a forward's deadline (tests/mp_cluster.py) and slack.
ANSWER_WITHIN = 30.0


@pytest.mark.timeout(120)
async def test_a_collected_message_survives_a_redis_restart_and_its_holders_sigkill(
    aof_server: RedisServer, node_logs: Path
) -> None:
    async with MpCluster(aof_server.url, node_logs) as cluster:
        a, b, _ = cluster.nodes
        sid = "pending"
        # Given A holds the session and runs a turn held at a gate
        warm = await a.client.submit(request(sid, "warm", "gate:warm"))
        await cluster.started(sid, warm["turn_id"])
        # And B forwards two messages, which A collects together once the warm-up ends: the
        # first starts (held at a gate), the second waits in A's mailbox, pending in Redis
        running = await b.client.submit(request(sid, "running", "gate:running"))
        waiting = await b.client.submit(request(sid, "waiting"))
        await cluster.open_gate("warm")
        await cluster.started(sid, running["turn_id"])
        # When redis-server restarts (append-only) and then A is SIGKILLed
        await asyncio.to_thread(aof_server.restart)
        await a.sigkill()
        # Then the running turn's caller gets HOLDER_LOST (hang guard only)
        with pytest.raises(TurnFailedError) as failure:
            await asyncio.wait_for(b.client.result(running["turn_id"]), ANSWER_WITHIN)
        assert failure.value.code is FailureCode.HOLDER_LOST
        # And the waiting message, which never started, runs on a survivor: its caller gets the
        # real result
        result = await asyncio.wait_for(b.client.result(waiting["turn_id"]), ANSWER_WITHIN)
        assert result.text == f"echo:{sid}|waiting|"
        assert result.executed_by != a.node_id
        # And the transcript holds the warm-up and the waiting turn, each once, fenced in order
        entries = await transcript(cluster, sid)
        assert assert_fenced_and_unsplit(entries) == [warm["turn_id"], waiting["turn_id"]]


async def _starts(cluster: MpCluster, session_id: str, turn_id: str) -> list[LogEntry]:
    return [
        e for e in await cluster.log_entries(session_id) if e.ev == "start" and e.turn_id == turn_id
    ]


async def _ends(cluster: MpCluster, session_id: str, turn_id: str) -> list[LogEntry]:
    return [
        e for e in await cluster.log_entries(session_id) if e.ev == "end" and e.turn_id == turn_id
    ]


@pytest.mark.timeout(120)
async def test_a_holder_paused_past_its_lease_has_its_turn_run_again_and_its_late_answer_refused(
    aof_server: RedisServer, node_logs: Path
) -> None:
    async with MpCluster(aof_server.url, node_logs, on_holder_lost="retry") as cluster:
        a, b, _ = cluster.nodes
        sid = "paused"
        await b.client.run(request(sid, "warm"))
        holder = cluster.node((await cluster.backends.leases.current(sid)).holder)  # type: ignore[union-attr]
        other = b if holder is not b else a
        # Given a long turn running on the session's holder, its caller on another node
        gated = await other.client.submit(
            request(sid, "long", "gate:paused", idempotency_key="long")
        )
        await cluster.started(sid, gated["turn_id"])
        # When the holder is SIGSTOPped past its lease and its reservation's staleness bound
        holder.sigstop()

        async def second_attempt() -> bool:
            return len(await _starts(cluster, sid, gated["turn_id"])) == 2

        await poll(second_attempt, 30, "the lost attempt was not run again")
        # Then the successor runs the turn again, and its caller gets that attempt's result
        await cluster.open_gate("paused")
        result = await asyncio.wait_for(other.client.result(gated["turn_id"]), ANSWER_WITHIN)
        assert result.text == f"echo:{sid}|long|gate:paused"
        assert result.executed_by not in (holder.node_id, None)
        # When the stopped holder resumes, its stale attempt ends and tries to answer
        holder.sigcont()

        async def both_ended() -> bool:
            return len(await _ends(cluster, sid, gated["turn_id"])) == 2

        await poll(both_ended, 30, "the stale attempt never ended")
        # Then its writes were refused: the transcript holds the turn once, fenced in order
        entries = await transcript(cluster, sid)
        turns = assert_fenced_and_unsplit(entries)
        assert turns[-1] == gated["turn_id"] and len(turns) == len(set(turns))
        assert sum(1 for t, _, c in entries if t == gated["turn_id"] and c.startswith("echo:")) == 1
        found = await cluster.backends.idempotency.find(sid, "c:long")
        assert found is not None and found.outcome is not None
        assert found.outcome.executed_by == result.executed_by
        assert [(h.attempt, h.node) for h in found.history] == [(1, holder.node_id)]


RETRY = {"max_attempts": 3, "initial_interval": 0.2, "backoff_factor": 2.0, "jitter": 0.0}


@pytest.mark.timeout(120)
async def test_a_retried_turn_fails_at_the_maximum_and_a_terminal_error_is_not_retried(
    aof_server: RedisServer, node_logs: Path
) -> None:
    async with MpCluster(aof_server.url, node_logs, retry=RETRY) as cluster:
        a, b, _ = cluster.nodes
        sid = "retried"
        # Given a turn whose agent keeps raising a retryable error
        broken = await b.client.submit(request(sid, "broken", "fail:9"))
        # Then it runs max_attempts times and its caller gets the last attempt's failure
        with pytest.raises(TurnFailedError) as failure:
            await asyncio.wait_for(b.client.result(broken["turn_id"]), ANSWER_WITHIN)
        assert failure.value.code is FailureCode.FAILED
        assert "flaky attempt 3" in str(failure.value)
        ends = await _ends(cluster, sid, broken["turn_id"])
        assert [e.how for e in ends] == ["error", "error", "error"]
        # And the message is a dead letter holding its three attempts
        (letter,) = await cluster.backends.dead_letters.list(10, session_id=sid)
        assert letter.turn_id == broken["turn_id"]
        assert [a.attempt for a in letter.attempts] == [1, 2, 3]
        # And a terminal error is not retried
        fatal = await a.client.submit(request(sid, "fatal", "terminal"))
        with pytest.raises(TurnFailedError):
            await asyncio.wait_for(a.client.result(fatal["turn_id"]), ANSWER_WITHIN)
        assert len(await _starts(cluster, sid, fatal["turn_id"])) == 1


@pytest.mark.timeout(120)
async def test_a_retry_scheduled_by_a_holder_that_is_sigkilled_runs_on_its_successor(
    aof_server: RedisServer, node_logs: Path
) -> None:
    backoff = {**RETRY, "initial_interval": 1.0, "max_attempts": 2}
    async with MpCluster(aof_server.url, node_logs, retry=backoff) as cluster:
        a, b, _ = cluster.nodes
        sid = "backoff"
        await a.client.run(request(sid, "warm"))
        holder = cluster.node((await cluster.backends.leases.current(sid)).holder)  # type: ignore[union-attr]
        other = b if holder is not b else a
        # Given a forwarded turn whose first attempt failed on the holder
        flaky = await other.client.submit(request(sid, "flaky", "fail:1", idempotency_key="f"))

        async def retry_scheduled() -> bool:
            found = await cluster.backends.idempotency.find(sid, "c:f")
            return found is not None and bool(found.history) and found.holder is None

        await poll(retry_scheduled, 20, "no retry was scheduled")
        # When the holder is SIGKILLed while the retry waits out its backoff
        await holder.sigkill()
        # Then a survivor runs attempt 2 when it is due, and the caller gets its result
        result = await asyncio.wait_for(other.client.result(flaky["turn_id"]), ANSWER_WITHIN)
        assert result.text == f"echo:{sid}|flaky|fail:1"
        assert result.executed_by != holder.node_id
        assert [e.how for e in await _ends(cluster, sid, flaky["turn_id"])] == ["error", "ok"]


@pytest.mark.timeout(120)
async def test_a_turn_recorded_just_before_its_holder_is_sigkilled_is_acknowledged_and_never_reruns(
    aof_server: RedisServer, node_logs: Path
) -> None:
    pool = ProxyPool(aof_server)
    try:
        async with MpCluster(aof_server.url, node_logs, node_url=pool.open) as cluster:
            a, b, _ = cluster.nodes
            sid = "unacked"
            await a.client.run(request(sid, "warm"))
            holder = cluster.node((await cluster.backends.leases.current(sid)).holder)  # type: ignore[union-attr]
            other = b if holder is not b else a
            # Given a holder whose separate acknowledgements never reach Redis
            pool.proxies[holder.node_id].cut_before(script="inbox_ack", times=None)
            # When it runs a forwarded message, records its answer, and is SIGKILLed at once
            once = await other.client.submit(request(sid, "once", idempotency_key="once"))
            result = await asyncio.wait_for(other.client.result(once["turn_id"]), ANSWER_WITHIN)
            assert result.text == f"echo:{sid}|once|"
            await holder.sigkill()
            # Then the message was acknowledged in the very step that recorded its answer (no
            # window in which a recorded message stays pending), and it never runs again
            ids_key = cluster.backends.keys.pending(sid)[0]
            assert await cluster.redis.zcard(ids_key) == 0
            after = await other.client.run(request(sid, "after"))
            assert after.executed_by != holder.node_id
            assert len(await _starts(cluster, sid, once["turn_id"])) == 1
            entries = await transcript(cluster, sid)
            assert [t for t, _, c in entries if c.startswith("echo:")].count(once["turn_id"]) == 1
    finally:
        assert pool.close() == []
