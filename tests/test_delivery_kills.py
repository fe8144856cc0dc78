"""Delivery under real process and server faults: a message a holder process collected but never
started survives a redis-server restart and the holder's SIGKILL, and runs on a survivor; only
the turn that was running is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stickless import FailureCode, TurnFailedError

from . import test_multiprocess
from .mp_cluster import MpCluster
from .redis_fixture import RedisServer
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
