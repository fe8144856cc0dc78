"""All seven rows of the idempotency matrix, through the public API."""

from __future__ import annotations

import asyncio

import pytest

from stickless import (
    ConflictingAgentError,
    FailureCode,
    IdempotencyConflictError,
    SubmitKind,
    SubmitRequest,
    TurnConflictingAgentError,
    TurnFailedError,
)
from stickless.testing import LocalCluster
from stickless.wire import Envelope, Signal

from .agents import Journal, req, wait_until
from .conftest import make_cluster


async def test_row1_no_key_never_deduplicates(cluster: LocalCluster, journal: Journal) -> None:
    a, b, _ = cluster.nodes
    # When the same input is submitted twice without a key
    first = await (await a.submit(req("s1", "same"))).result
    second = await (await b.submit(req("s1", "same"))).result
    # Then both ran as separate turns
    assert first.turn_id != second.turn_id
    assert journal.texts("s1") == ["same", "same"]


async def test_row2_new_key_runs_normally(cluster: LocalCluster, journal: Journal) -> None:
    disp = await cluster.nodes[0].submit(req("s1", "hello", idempotency_key="k1"))
    assert (await disp.result).text == "echo:hello"
    assert journal.texts("s1") == ["hello"]


async def test_row3_same_key_in_flight_attaches_to_the_original_turn(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = cluster.nodes
    gate = journal.gate("slow")
    original = await a.submit(req("s1", "slow", idempotency_key="k"))
    await journal.entered["slow"].wait()
    # When the same key and input arrive again, on other nodes, while the turn runs
    retry_b = await b.submit(req("s1", "slow", idempotency_key="k"))
    retry_c = await c.submit(req("s1", "slow", idempotency_key="k"))
    gate.set()
    results = await asyncio.gather(original.result, retry_b.result, retry_c.result)
    # Then no new turn ran: every caller got the original turn's id and result
    assert retry_b.kind is SubmitKind.FORWARDED
    assert retry_b.attached and retry_c.attached and not original.attached
    assert {retry_b.turn_id, retry_c.turn_id} == {original.turn_id}
    assert {r.turn_id for r in results} == {original.turn_id}
    assert journal.texts("s1") == ["slow"]


async def test_row4_same_key_done_returns_the_cached_result(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, _, c = cluster.nodes
    first = await a.submit(req("s1", "once", idempotency_key="k"))
    result = await first.result
    # When the request is retried after it finished, on another node
    retry = await c.submit(req("s1", "once", idempotency_key="k"))
    # Then the cached result answers at once, without running the agent again
    assert retry.kind is SubmitKind.CACHED
    assert not retry.attached
    assert retry.result.done()
    assert await retry.result == result
    assert retry.turn_id == first.turn_id
    assert journal.texts("s1") == ["once"]


async def test_row5_same_key_different_input_is_a_conflict(cluster: LocalCluster) -> None:
    a, b, _ = cluster.nodes
    await (await a.submit(req("s1", "original", idempotency_key="k"))).result
    with pytest.raises(IdempotencyConflictError, match="different input"):
        await b.submit(req("s1", "changed", idempotency_key="k"))


async def test_keys_are_scoped_per_session(cluster: LocalCluster, journal: Journal) -> None:
    a = cluster.nodes[0]
    await (await a.submit(req("s1", "x", idempotency_key="k"))).result
    # The same key on another session is a different reservation
    result = await (await a.submit(req("s2", "y", idempotency_key="k"))).result
    assert result.text == "echo:y"


async def test_row6_key_past_primary_ttl_runs_as_new(journal: Journal) -> None:
    async with make_cluster(journal, idempotency_primary_ttl=0.2) as cluster:
        a = cluster.nodes[0]
        first = await (await a.submit(req("s1", "again", idempotency_key="k"))).result
        store = cluster.backends.idempotency

        async def expired() -> bool:
            return await store.find("s1", "c:k") is None

        await wait_until(expired)
        # When the key is reused after its primary TTL
        second = await (await a.submit(req("s1", "again", idempotency_key="k"))).result
    # Then it ran afresh
    assert second.turn_id != first.turn_id
    assert journal.texts("s1") == ["again", "again"]


async def test_row7_stale_in_flight_is_reset_and_rerun(journal: Journal) -> None:
    # (touches must come more often than the short secondary TTL)
    async with make_cluster(
        journal, idempotency_secondary_ttl=0.2, lease_extend_interval=0.1
    ) as cluster:
        a = cluster.nodes[0]
        request = req("s1", "retry me", idempotency_key="k")
        store = cluster.backends.idempotency
        # Given a reservation left IN_FLIGHT by a holder that died (nobody touches it)
        await store.put_if_absent(
            "s1", "c:k", "dead-turn", request.input_hash(), "dead-node", 0.2, 86400
        )

        async def stale() -> bool:
            found = await store.find("s1", "c:k")
            return found is not None and found.stale

        await wait_until(stale)
        # When the client retries with the same key and input
        disp = await a.submit(request)
        result = await disp.result
        # Then the stale reservation was reset (its turn announced lost) and the request ran
        assert result.text == "echo:retry me"
        assert disp.turn_id != "dead-turn"
        assert journal.texts("s1") == ["retry me"]


async def test_conflicting_agent_is_refused_before_anything_is_reserved(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = cluster.nodes
    await (await a.submit(req("s1", "bound to bot", idempotency_key="k"))).result
    # When another agent is asked to run the session (the agent-binding check at submit)
    with pytest.raises(ConflictingAgentError, match="bound to agent 'bot'"):
        await b.submit(
            SubmitRequest(session_id="s1", agent_ref="other", input="x", idempotency_key="k2")
        )
    # Then no reservation was left: the key is still free for the right agent
    result = await (await b.submit(req("s1", "fresh", idempotency_key="k2"))).result
    assert result.text == "echo:fresh"


async def test_conflicting_agent_in_the_inbox_is_rejected_on_drain(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b, c = cluster.nodes
    await (await a.submit(req("s1", "first"))).result
    stream = c.events("s1")
    await stream.ready()
    # Given a message for another agent that passed the binding check at submit before the
    # binding existed (a race that pre-check cannot close) and sits in the inbox, with its
    # caller waiting on B
    backends = cluster.backends
    request = SubmitRequest(session_id="s1", agent_ref="intruder", input="hi")
    await backends.idempotency.put_if_absent(
        "s1", "t:race", "race", request.input_hash(), b.node_id, 1, 60
    )
    await backends.idempotency.release_holder("s1", "t:race", b.node_id, 60)
    await backends.inbox.deliver(
        Envelope(
            session_id="s1",
            turn_id="race",
            agent_ref="intruder",
            input=request.input,
            key="t:race",
            origin=b.node_id,
        )
    )
    # When the holder hears the doorbell and drains
    await backends.signals.publish(
        Signal(kind="MESSAGE_ENQUEUED", session_id="s1", origin=b.node_id, payload={})
    )
    # Then it emits Rejected(CONFLICTING_AGENT) and records the failure for the caller
    async for event in stream:
        if event.type == "rejected":
            assert event.reason == FailureCode.CONFLICTING_AGENT.value
            assert event.turn_id == "race"
            break
    await stream.aclose()
    found = await backends.idempotency.find("s1", "t:race")
    assert found is not None and found.outcome is not None
    assert found.outcome.failure_code is FailureCode.CONFLICTING_AGENT
    assert journal.texts("s1") == ["first"]


async def test_turn_failure_with_conflicting_agent_is_also_a_conflicting_agent_error() -> None:
    err = TurnFailedError.of(FailureCode.CONFLICTING_AGENT, "x")
    assert isinstance(err, TurnConflictingAgentError)
    assert isinstance(err, ConflictingAgentError)
