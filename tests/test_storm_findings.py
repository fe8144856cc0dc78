"""Focused, deterministic repros of the stickless bugs the randomized storms found.

Each runs in-process (one event loop), over the real redis-server or the memory backends, so its
symptom is deterministic. Each is marked xfail(strict) while its switch in
tests/storm/known_bugs.py is True: fixing the bug turns it into a pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from stickless import (
    BackendUnavailableError,
    DeploymentMode,
    FailureCode,
    RouterClosedError,
    RouterConfig,
    SessionRouter,
    SubmitDisposition,
    SubmitKind,
    SubmitRequest,
    TurnContext,
    TurnFailedError,
    TurnOutput,
    TurnResult,
)
from stickless.backends.base import ReservationState
from stickless.backends.redis import RedisBackends, RedisIdempotencyStore
from stickless.testing import LocalCluster
from stickless.wire import Outcome

from .agents import Journal, ScriptedOpener, failure_code, req
from .conftest import make_cluster
from .mp_cluster import poll
from .storm.journal import Journal as StormJournal
from .storm.journal import JournalOpener
from .storm.known_bugs import (
    ATTACHED_EVICT_BUG,
    FENCED_QUEUE_BUG,
    GHOST_RESERVATION_BUG,
    KILLED_NODE_ANSWERS_BUG,
    LATE_DELIVERY_EVICT_BUG,
    LOST_COLLECT_BUG,
    REFUSED_BUT_QUEUED_BUG,
    STALE_SUCCESS_BUG,
)
from .storm.local import SETTINGS as STORM_SETTINGS
from .storm.rules import CLIENT_KEY

# ---------------------------------------------------------------- found by the node-process storm

REPRO: dict[str, Any] = dict(
    lease_ttl=1.0,
    lease_extend_interval=0.25,
    idempotency_secondary_ttl=0.5,
    holder_loss_sweep_interval=0.25,
    forward_ttl=3.0,
    release_interrupt_timeout=1.0,
    interrupt_grace=0.2,
)


@contextlib.asynccontextmanager
async def two_redis_routers(url: str) -> AsyncIterator[tuple[Journal, list[Any], list[Any]]]:
    """Routers A and B over one redis-server, each with its own bundle; A holds s1."""
    journal = Journal()
    bundles = [RedisBackends.from_url(url, namespace="repro") for _ in range(2)]
    routers = [
        SessionRouter.build(
            config=RouterConfig(node_id=f"node-{n}", mode=DeploymentMode.DISTRIBUTED, **REPRO),
            opener=ScriptedOpener(journal),
            backends=bundle,
        )
        for n, bundle in zip("ab", bundles, strict=True)
    ]
    for router in routers:
        await router.start()
    try:
        await (await routers[0].submit(repro_request("first"))).result
        yield journal, bundles, routers
    finally:
        for router in routers:
            await router.aclose(grace=0.5)
        for bundle in bundles:
            await bundle.aclose()


def repro_request(text: str, **extra: Any) -> SubmitRequest:
    return SubmitRequest(session_id="s1", agent_ref="bot", input=text, **extra)


def connection_lost() -> redis.ConnectionError:
    return redis.ConnectionError("Connection closed by server.")


@pytest.mark.xfail(LOST_COLLECT_BUG, strict=True, reason="see LOST_COLLECT_BUG")
async def test_a_collect_whose_index_write_fails_loses_nothing(redis_url: str) -> None:
    async with two_redis_routers(redis_url) as (journal, bundles, (_, b)):
        inbox = bundles[0].inbox  # A's, the holder's
        real_take = inbox._take

        async def take_then_fail(*args: Any, **kwargs: Any) -> Any:
            batch = await real_take(*args, **kwargs)
            if not batch:
                return batch
            inbox._take = real_take  # once
            # (what `_take` meets when its index_drop command, or the take's reply, is lost)
            raise connection_lost()

        inbox._take = take_then_fail
        # Given B forwards a turn to A, and A's collect removes it but then fails
        forwarded = await b.submit(repro_request("second"))
        # Then the message still runs: it stayed pending, and A's next collect takes it back
        result = await asyncio.wait_for(forwarded.result, 10)
        assert result.text == "echo:second"
        assert journal.texts("s1") == ["first", "second"]


@pytest.mark.xfail(GHOST_RESERVATION_BUG, strict=True, reason="see GHOST_RESERVATION_BUG")
@pytest.mark.parametrize("failing", ["delivery", "reserve reply"])
async def test_a_refused_submit_leaves_its_key_free(
    redis_url: str, failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with two_redis_routers(redis_url) as (journal, bundles, (_, b)):
        idempotency = bundles[1].idempotency  # B's

        async def unreachable(*args: Any, **kwargs: Any) -> Any:
            raise connection_lost()

        if failing == "delivery":
            # Given the store fails B's reserve (which queues the message for the holder) and
            # the clean-up after it (an outage)
            monkeypatch.setattr(idempotency, "put", unreachable)
            monkeypatch.setattr(idempotency, "discard_reservation", unreachable)
        else:
            # Given B's reserve (one script: the reservation, the message queued for the holder
            # and its doorbell) is applied but its reply is lost
            assert isinstance(idempotency, RedisIdempotencyStore)
            real_put = idempotency.put

            async def put_then_lose(*args: Any, **kwargs: Any) -> Any:
                await real_put(*args, **kwargs)
                monkeypatch.setattr(idempotency, "put", real_put)  # once
                raise connection_lost()

            monkeypatch.setattr(idempotency, "put", put_then_lose)
        try:
            submitted: SubmitDisposition | None = await b.submit(
                repro_request("keyed", idempotency_key="k")
            )
        except BackendUnavailableError:
            submitted = None  # refused: its message, if queued, was withdrawn and never runs
        monkeypatch.undo()
        if submitted is None:
            # When the client retries with the same key at once, the store being back
            submitted = await b.submit(repro_request("keyed", idempotency_key="k"))
        # Then the turn runs once (a submit is refused only while its message cannot run; a
        # queued one that the holder took is followed instead) (formerly: the retry attached
        # to the refused turn, which was never queued, and got HOLDER_LOST or FORWARD_TIMEOUT)
        result = await asyncio.wait_for(submitted.result, 10)
        assert result.text == "echo:keyed"
        assert journal.texts("s1").count("keyed") == 1


@pytest.mark.xfail(REFUSED_BUT_QUEUED_BUG, strict=True, reason="see REFUSED_BUT_QUEUED_BUG")
async def test_a_delivery_whose_reply_was_lost_is_queued_once_and_runs_once(
    redis_url: str,
) -> None:
    async with two_redis_routers(redis_url) as (journal, bundles, (_, b)):
        inbox = bundles[1].inbox  # B's
        real_deliver = inbox.deliver

        async def deliver_then_lose_the_reply(*args: Any, **kwargs: Any) -> Any:
            inbox.deliver = real_deliver  # once
            await real_deliver(*args, **kwargs)
            raise connection_lost()

        # Given B's delivery is written but its reply is lost
        inbox.deliver = deliver_then_lose_the_reply
        sent = await b.submit(repro_request("sent once"))
        # When a later turn of the session comes along
        later = await b.submit(repro_request("later"))
        await asyncio.wait_for(later.result, 10)
        # Then the submit was not refused (the delivery was sent again with its id, and so
        # queued once): it ran once, before the later one (it used to be refused, then run)
        assert (await asyncio.wait_for(sent.result, 10)).text == "echo:sent once"
        assert journal.texts("s1") == ["first", "sent once", "later"]


async def test_a_success_the_store_did_not_record_never_runs_twice(redis_url: str) -> None:
    async with two_redis_routers(redis_url) as (journal, bundles, (a, b)):
        hotpath = bundles[0].hotpath  # A's, the holder's
        real_finish = hotpath.finish

        async def finish_fails(*args: Any, **kwargs: Any) -> Any:
            hotpath.finish = real_finish  # once
            raise connection_lost()

        # Given a keyed turn commits on A but recording its outcome fails
        hotpath.finish = finish_fails
        first = await (await a.submit(repro_request("pay", idempotency_key="k"))).result
        # When the reservation has settled (the holder-loss sweep finds it unowned and stale)
        backends = bundles[1]

        async def settled() -> bool:
            found = await backends.idempotency.find("s1", "c:k")
            return found is not None and found.state is not ReservationState.IN_FLIGHT

        await poll(settled, 10, "the reservation never settled")
        # Then a retry with the key gets the first result (the outcome was recorded later)
        again = await (await b.submit(repro_request("pay", idempotency_key="k"))).result
        assert again.turn_id == first.turn_id
        assert journal.texts("s1") == ["first", "pay"]


@pytest.mark.xfail(LATE_DELIVERY_EVICT_BUG, strict=True, reason="see LATE_DELIVERY_EVICT_BUG")
async def test_a_message_delivered_after_the_release_purge_is_not_failed_as_evicted() -> None:
    journal = Journal()
    async with LocalCluster(2, opener=ScriptedOpener(journal), **REPRO) as cluster:
        a, b = cluster.nodes
        await (await a.submit(repro_request("first"))).result
        leases = a.backends.leases  # (A's own link to the shared backends)
        real_release = leases.release
        purged, go = asyncio.Event(), asyncio.Event()

        async def slow_release(lease: Any) -> Any:
            purged.set()
            await go.wait()
            return await real_release(lease)

        leases.release = slow_release
        # Given A releases s1: it has purged the inbox and is releasing the lease...
        releasing = asyncio.ensure_future(a.release_session("s1"))
        await asyncio.wait_for(purged.wait(), 10)
        # ...when B forwards a turn to A, whose message lands after the purge
        forwarded = await b.submit(repro_request("second"))
        leases.release = real_release
        go.set()
        await releasing
        # Then B's caller is told what happened to the message: if it ran, its result
        try:
            outcome: Any = await asyncio.wait_for(forwarded.result, 10)
        except TurnFailedError as exc:
            outcome = exc.code
        # (a later turn runs after whatever was queued before it)
        await (await a.submit(repro_request("third"))).result
        record = await cluster.backends.records.load("s1")
        committed = record is not None and any(e.content == "echo:second" for e in record.entries)
        # (today: EVICTED, while the message survived the purge, ran under the next lease and
        # committed)
        assert committed == isinstance(outcome, TurnResult), (outcome, journal.texts("s1"))


@pytest.mark.xfail(FENCED_QUEUE_BUG, strict=True, reason="see FENCED_QUEUE_BUG")
async def test_work_queued_behind_a_fenced_out_turn_goes_to_the_new_holder() -> None:
    journal = Journal()
    # (no holder-loss sweep within the test: only A's lease runs out, with its liveness)
    settings = {**REPRO, "holder_loss_sweep_interval": 600.0}
    async with LocalCluster(2, opener=ScriptedOpener(journal), **settings) as cluster:
        a, b = cluster.nodes
        await (await a.submit(repro_request("first"))).result
        # Given A runs a held turn with another turn queued behind it in its mailbox
        gate = journal.gate("held")
        held = await a.submit(repro_request("held"))
        await journal.entered["held"].wait()
        queued = await a.submit(repro_request("queued"))
        assert queued.kind is SubmitKind.EXECUTED_LOCALLY
        # When A stops renewing, B takes the session over and commits a turn...
        a.renewer.pause()

        async def lease_moved() -> bool:
            lease = await cluster.backends.leases.current("s1")
            return lease is None or lease.holder != a.node_id

        await poll(lease_moved, 10, "A kept its lease")
        await (await b.submit(repro_request("takeover"))).result
        # ...and A's held turn returns, its commit refused by fencing
        gate.set()
        with pytest.raises(TurnFailedError) as fenced:
            await asyncio.wait_for(held.result, 10)
        assert fenced.value.code is FailureCode.LEASE_LOST
        # Then the queued turn, which never started, runs on the new holder (today: LEASE_LOST)
        result = await asyncio.wait_for(queued.result, 10)
        assert result.executed_by == b.node_id


@pytest.mark.xfail(STALE_SUCCESS_BUG, strict=True, reason="see STALE_SUCCESS_BUG")
async def test_a_success_is_not_reported_over_a_recorded_holder_loss() -> None:
    journal = Journal()
    async with LocalCluster(2, opener=ScriptedOpener(journal), **REPRO) as cluster:
        a, _ = cluster.nodes
        await (await a.submit(repro_request("first"))).result
        # Given A runs a keyed turn, held mid-flight
        gate = journal.gate("pay")
        on_a = await a.submit(repro_request("pay", idempotency_key="k"))
        await journal.entered["pay"].wait()
        # When a holder-loss sweep has just recorded the turn lost (its store write is done, its
        # TURN_RESULT announcement not yet heard by A: what a sweep does when A's touches lagged
        # past the secondary TTL)
        lost = Outcome(
            turn_id=on_a.turn_id,
            ok=False,
            code=FailureCode.HOLDER_LOST.value,
            message=f"holder {a.node_id} stopped answering",
        )
        assert await cluster.backends.idempotency.compare_and_reset("s1", "c:k", a.node_id, lost)
        # ...and the turn then finishes and commits (A still holds the lease)
        gate.set()
        try:
            outcome: Any = await asyncio.wait_for(on_a.result, 10)
        except TurnFailedError as exc:
            outcome = exc.code
        # Then A's caller is told what the store says (today: the TurnResult, while the store
        # says HOLDER_LOST -- so a retry with the key runs "pay" a second time)
        found = await cluster.backends.idempotency.find("s1", "c:k")
        assert found is not None and found.outcome is not None
        assert isinstance(outcome, TurnResult) == found.outcome.ok, (outcome, found.outcome)


# ---------------------------------------------------------------- found by the in-process storm

FORWARD_TTL: float = STORM_SETTINGS["forward_ttl"]


class Returning:
    """Stages nothing and returns as soon as its gate opens."""

    def __init__(self, entered: asyncio.Event, gate: asyncio.Event) -> None:
        self.entered = entered
        self.gate = gate

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        self.entered.set()
        await self.gate.wait()
        return TurnOutput(text="done")

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


@pytest.mark.xfail(
    KILLED_NODE_ANSWERS_BUG,
    strict=True,
    reason="a node being killed still answers its own callers (see KILLED_NODE_ANSWERS_BUG)",
)
async def test_a_killed_node_answers_its_own_callers_only_with_router_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, gate = asyncio.Event(), asyncio.Event()
    async with LocalCluster(
        2, session_factory=lambda s, a: Returning(entered, gate), **STORM_SETTINGS
    ) as cluster:
        a, b = cluster.nodes
        request = SubmitRequest(session_id="s1", agent_ref="bot", input="x", idempotency_key="k")
        # Given a turn running on A, with a caller on A and one on B attached to it
        on_a = await a.submit(request)
        await entered.wait()
        on_b = await b.submit(request)
        assert on_b.turn_id == on_a.turn_id
        # ...and A's renewal thread slow to stop (as when it is mid round trip to the store)
        stop = a.renewer.stop

        def slow_stop() -> None:
            time.sleep(0.1)  # on the thread that SessionRouter.kill stops it from
            stop()

        monkeypatch.setattr(a.renewer, "stop", slow_stop)
        # When A crashes just as its agent returns
        gate.set()
        await cluster.kill(a)
        # Then B's caller learns the holder was lost, the store records it lost...
        with pytest.raises(TurnFailedError) as lost:
            await asyncio.wait_for(on_b.result, FORWARD_TTL)
        assert lost.value.code is FailureCode.HOLDER_LOST
        found = await cluster.backends.idempotency.find("s1", CLIENT_KEY + "k")
        assert found is not None and found.outcome is not None and not found.outcome.ok
        # ...and A's own caller gets RouterClosedError, not a result nobody recorded
        # (before bd38119 it got TurnResult(text="done"): the kill yielded after severing the
        # link, the turn completed, mark_done failed, and SessionRouter.complete resolved it)
        with pytest.raises(RouterClosedError):
            await on_a.result


@pytest.mark.xfail(
    ATTACHED_EVICT_BUG,
    strict=True,
    reason="an attached caller is failed by any EVICT (see ATTACHED_EVICT_BUG)",
)
async def test_a_late_evict_does_not_fail_a_caller_attached_to_the_next_lease() -> None:
    async with LocalCluster(3, opener=JournalOpener(StormJournal()), **STORM_SETTINGS) as cluster:
        a, _, c = cluster.nodes
        first = SubmitRequest(session_id="s1", agent_ref="bot", input="s1|u1|")
        await (await a.submit(first)).result
        # Given A released s1 (its EVICT, under the first lease, is still on its way to C)...
        await a.release_session("s1")
        # ...and a keyed turn that A runs under a new lease, with C's caller attached to it
        keyed = SubmitRequest(
            session_id="s1", agent_ref="bot", input="s1|k1|", idempotency_key="k1"
        )
        on_a = await a.submit(keyed)
        on_c = await c.submit(keyed)
        assert on_c.turn_id == on_a.turn_id
        # When the turn completes (C hears the old lease's EVICT meanwhile)
        result = await on_a.result
        # Then the turn was not evicted: the store holds its result...
        found = await cluster.backends.idempotency.find("s1", CLIENT_KEY + "k1")
        assert found is not None and found.outcome is not None and found.outcome.ok
        # ...so C's attached caller gets that result too, not EVICTED
        # (before bd38119 it got TurnFailedError(EVICTED): SessionRouter._attach registered its
        # _Forward with token 0, and _apply_evict fails every forward whose token <= the EVICT's)
        assert (await asyncio.wait_for(on_c.result, FORWARD_TTL)) == result


async def test_a_submit_whose_reserve_is_rerun_after_its_turn_was_declared_lost_gets_that_answer(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_cluster(journal, nodes=2) as cluster:
        a, b = cluster.nodes
        await (await a.submit(req("s1", "first"))).result
        idempotency, hotpath = b.backends.idempotency, b.backends.hotpath
        reserve = hotpath.reserve
        lost = Outcome.failure("", FailureCode.HOLDER_LOST, "holder stopped answering")

        async def rerun_after_a_reset(*args: Any, **kwargs: Any) -> Any:
            # The reserve runs (it queues the message for A); its reply is lost while another
            # node declares the turn lost; the client sends the reserve again.
            first = await reserve(*args, **kwargs)
            session_id, key, turn_id = args[:3]
            verdict = lost.model_copy(update={"turn_id": turn_id})
            holder = None if first.forwarded is not None else args[4]
            assert await idempotency.compare_and_reset(session_id, key, holder, verdict)
            return await reserve(*args, **kwargs)

        monkeypatch.setattr(hotpath, "reserve", rerun_after_a_reset)
        # When B's submit goes through that
        disp = await b.submit(req("s1", "revived?", idempotency_key="k"))
        # Then its caller gets the recorded answer and the turn never runs
        assert await failure_code(disp.result) is FailureCode.HOLDER_LOST
        assert journal.texts("s1") == ["first"]
        found = await cluster.backends.idempotency.find("s1", "c:k")
        assert found is not None and found.outcome is not None
        assert found.outcome.code == FailureCode.HOLDER_LOST.value


async def test_a_dead_holders_turn_whose_reset_reply_is_lost_is_answered_holder_lost(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (no holder-loss sweep within the test: the take-over is what finds the dead holder)
    async with make_cluster(journal, nodes=2, holder_loss_sweep_interval=600.0) as cluster:
        a, b = cluster.nodes
        await (await a.submit(req("s1", "warm up"))).result
        # Given B's turn running on A when A dies (its reservation held by A's dead incarnation)
        journal.gate("long")
        lost = await b.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        await cluster.kill(a)
        # ...and B's store losing the reply of the first reset it sends (after applying it)
        idem = b.backends.idempotency
        reset = idem.compare_and_reset

        async def reply_lost_once(*args: Any, **kwargs: Any) -> bool:
            await reset(*args, **kwargs)
            monkeypatch.setattr(idem, "compare_and_reset", reset)
            raise BackendUnavailableError("reply lost after the store ran the reset")

        monkeypatch.setattr(idem, "compare_and_reset", reply_lost_once)
        # When B takes the session over (its next submit claims it) and finds that turn
        after = await b.submit(req("s1", "after"))
        # Then the lost turn is answered HOLDER_LOST, not "unknown" (the reset is sent again and
        # finds its own answer), and the session goes on
        assert await failure_code(lost.result) is FailureCode.HOLDER_LOST
        assert (await after.result).text == "echo:after"
