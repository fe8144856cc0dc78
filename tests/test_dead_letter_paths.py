"""What reaches the dead letters from a running cluster: a turn whose last attempt failed under
the retry policy (with its attempts, in the step that records its answer), and an inbox entry
whose pending payload is gone; both are answered, never dropped silently."""

from __future__ import annotations

import pytest

from stickless import FailureCode, RetryPolicy, SubmitKind
from stickless.backends.base import ReservationState
from stickless.backends.redis import RedisBackends
from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener, failure_code, req, stall_take_overs, wait_until
from .conftest import FAST, ClusterFactory

QUICK = RetryPolicy(max_attempts=3, initial_interval=0.05, backoff_factor=1.0, jitter=0.0)


async def test_a_turn_failing_its_last_attempt_is_dead_lettered_and_replayed_once_fixed(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=2, retry=QUICK) as cluster:
        a, b = cluster.nodes
        journal.fail_first["broken"] = 10
        disp = await b.submit(req("s1", "broken", idempotency_key="k"))
        # When every attempt fails
        assert await failure_code(disp.result) is FailureCode.FAILED
        # Then the message is a dead letter with each attempt and the reason
        (letter,) = await a.dead_letters.list()
        assert (letter.session_id, letter.turn_id, letter.idempotency_key) == (
            "s1",
            disp.turn_id,
            "k",
        )
        assert [r.attempt for r in letter.attempts] == [1, 2, 3]
        assert all("flaky attempt" in r.error for r in letter.attempts)
        assert letter.reason.startswith("failed 3 attempt(s)")
        assert letter.envelope is not None and letter.envelope.input.as_text() == "broken"
        # When the fault is fixed and the letter replayed
        journal.fail_first["broken"] = 0
        replayed = await b.dead_letters.replay(letter.letter_id)
        assert replayed.disposition is not None
        result = await replayed.disposition.result
        # Then it ran under its original key, and the key now answers from the cache
        assert result.text == "echo:broken"
        found = await cluster.backends.idempotency.find("s1", "c:k")
        assert found is not None and found.state is ReservationState.DONE
        again = await a.submit(req("s1", "broken", idempotency_key="k"))
        assert again.kind is SubmitKind.CACHED
        assert await a.dead_letters.list() == []


async def test_a_failure_that_is_not_retried_is_not_dead_lettered(
    journal: Journal, cluster_over: ClusterFactory
) -> None:
    async with cluster_over(nodes=1, retry=QUICK) as cluster:
        node = cluster.nodes[0]
        journal.terminal.add("fatal")
        journal.fail_first["flaky"] = 1
        fatal = await node.submit(req("s1", "fatal"))
        assert await failure_code(fatal.result) is FailureCode.FAILED
        assert (await (await node.submit(req("s1", "flaky"))).result).text == "echo:flaky"
        assert await node.dead_letters.list() == []


async def test_a_pending_entry_whose_payload_is_gone_is_dead_lettered_not_dropped(
    redis_url: str, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Redis only: there an entry's id and payload are kept apart, and one may go alone)
    over = LocalCluster.over_redis(
        redis_url, 2, opener=ScriptedOpener(journal), **{**FAST, "forward_ttl": 3.0}
    )
    async with over as cluster:
        holder, b = cluster.nodes
        await (await holder.submit(req("s1", "first"))).result
        # Given a holder that collected a message and stalls before taking it over
        stuck = stall_take_overs(holder, monkeypatch)
        disp = await b.submit(req("s1", "lost payload"))
        await stuck.wait()
        # And the message's payload is gone from the pending set (its id kept)
        backends = cluster.backends
        assert isinstance(backends, RedisBackends)
        ids_key, entries_key = backends.keys.pending("s1")
        client = backends.client
        (message_id,) = [m.decode() for m in await client.zrange(ids_key, 0, -1)]
        assert await client.hdel(entries_key, message_id) == 1
        # When the holder dies and a survivor collects what it left pending
        await cluster.kill(holder)
        # Then the entry is a dead letter naming its id, no longer pending, and the caller is
        # answered by its forward deadline (nothing says which turn the entry was)
        assert await failure_code(disp.result) is not None

        async def lettered() -> bool:
            return bool(await b.dead_letters.list())

        await wait_until(lettered)
        (letter,) = await b.dead_letters.list()
        assert letter.source_id == message_id and letter.envelope is None and letter.raw is None
        assert await client.zscore(ids_key, message_id) is None
