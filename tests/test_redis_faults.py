"""Faults between a node and Redis (a cut after the server ran a write, a stalled path): a key
runs at most once, a turn commits at most once, and a failure answer means nothing committed."""

from __future__ import annotations

import asyncio

import pytest

from stickless import (
    BackendUnavailableError,
    FailureCode,
    SessionRouter,
    SubmitDisposition,
    SubmitKind,
    TurnFailedError,
)
from stickless.backends.base import FencedOut

from .agents import Journal, req, wait_until
from .faults import FaultProxy
from .faults.fixtures import fault_proxy_fixture  # noqa: F401  (fixture `fault_proxy`)
from .redis_routers import Start, start_fixture  # noqa: F401  (fixture `start`)


async def _entries(router: SessionRouter, session_id: str) -> list[str]:
    record = await router.backends.records.load(session_id)
    return [e.content for e in record.entries] if record is not None else []


async def test_a_delivery_retried_after_a_lost_reply_runs_once(
    start: Start, fault_proxy: FaultProxy, redis_url: str, journal: Journal
) -> None:
    holder = await start(redis_url)
    submitter = await start(fault_proxy.url())
    gate = journal.gate("busy")
    busy = await holder.submit(req("s1", "busy"))
    await journal.entered["busy"].wait()
    # Given the submitter's connection is cut right after the server ran its reserve, which
    # queued the message for the holder (redis-py sends it again), while the holder is busy
    cut = fault_proxy.cut_after(script="idem_put")
    disposition = await submitter.submit(req("s1", "once", idempotency_key="k"))
    await cut.wait_fired()
    gate.set()
    await busy.result
    # Then the turn ran once, committed once, and its caller got one answer
    assert (await disposition.result).text == "echo:once"
    idle = await holder.submit(req("s1", "after"))
    await idle.result
    assert journal.texts("s1") == ["busy", "once", "after"]
    assert await _entries(holder, "s1") == [
        "busy",
        "echo:busy",
        "once",
        "echo:once",
        "after",
        "echo:after",
    ]


async def test_a_commit_retried_after_a_lost_reply_appends_once(
    start: Start, fault_proxy: FaultProxy, journal: Journal
) -> None:
    holder = await start(fault_proxy.url())
    # Given the holder's connection is cut right after the server ran its commit
    cut = fault_proxy.cut_after(script="turn_finish")
    disposition = await holder.submit(req("s1", "once", idempotency_key="k"))
    # Then the turn's entries are in the transcript once and its caller got success
    assert (await disposition.result).text == "echo:once"
    assert cut.count == 1
    assert await _entries(holder, "s1") == ["once", "echo:once"]


async def test_holder_lost_means_nothing_committed_even_when_the_commit_was_held_back(
    start: Start, fault_proxy: FaultProxy, redis_url: str, journal: Journal
) -> None:
    holder = await start(fault_proxy.url())
    survivor = await start(redis_url)
    await (await holder.submit(req("s1", "warm up"))).result
    gate = journal.gate("held")
    # Given a turn running on a holder whose whole path to Redis then stalls as it commits
    disposition = await survivor.submit(req("s1", "held", idempotency_key="k"))
    await journal.entered["held"].wait()
    stall = fault_proxy.stall("to_server")
    gate.set()
    # When the survivor's sweep declares the holder lost
    with pytest.raises(TurnFailedError) as lost:
        await disposition.result
    assert lost.value.code is FailureCode.HOLDER_LOST
    # And the held-back commit then reaches the server
    stall.release()
    await wait_until(lambda: fault_proxy.script_runs().get("turn_finish", 0) >= 1)
    await asyncio.sleep(0)
    # Then nothing of the lost turn was committed, and a retry of its key runs it once
    warm = ["warm up", "echo:warm up"]
    assert await _entries(survivor, "s1") == warm
    retry = await survivor.submit(req("s1", "held", idempotency_key="k"))
    assert (await retry.result).text == "echo:held"
    assert await _entries(survivor, "s1") == [*warm, "held", "echo:held"]


async def test_a_forward_whose_answer_was_missed_while_resubscribing_is_answered_at_once(
    start: Start, fault_proxy: FaultProxy, redis_url: str, journal: Journal
) -> None:
    # The store poll runs every secondary_ttl / 2 = 15 s: an answer from the poll would come
    # long after the hang guard below.
    slow_poll = dict(idempotency_secondary_ttl=30.0, lease_ttl=20.0, lease_extend_interval=5.0)
    holder = await start(redis_url, **slow_poll)
    submitter = await start(fault_proxy.url(), **slow_poll)
    await (await holder.submit(req("s1", "warm up"))).result
    gate = journal.gate("long")
    # Given a forwarded turn running on the holder
    forwarded = await submitter.submit(req("s1", "long"))
    await journal.entered["long"].wait()
    # When the submitter's connections drop and stay down while the turn's answer goes out
    fault_proxy.refuse_new(True)
    fault_proxy.reset_all()
    gate.set()
    key = f"t:{forwarded.turn_id}"

    async def recorded() -> bool:
        found = await holder.backends.idempotency.find("s1", key)
        return found is not None and found.outcome is not None

    await wait_until(recorded)  # (its TURN_RESULT goes out right after: nobody hears it)
    fault_proxy.refuse_new(False)
    # Then, once resubscribed, the submitter checks its pending forwards and answers at once
    assert (await asyncio.wait_for(forwarded.result, 10.0)).text == "echo:long"


async def test_a_claim_fenced_out_at_provisioning_is_not_an_error_for_the_caller(
    start: Start, redis_url: str, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start(redis_url)
    provision = node.backends.records.provision
    calls = 0

    async def fenced_once(session_id: str, agent_ref: str, token: int) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:  # as when a newer lease provisioned the record meanwhile (a cut reply)
            raise FencedOut(f"token {token} is older than the record's fence")
        return await provision(session_id, agent_ref, token)

    monkeypatch.setattr(node.backends.records, "provision", fenced_once)
    # When a submit's claim finds the record fenced by a newer lease
    disposition = await node.submit(req("s1", "fenced", idempotency_key="k"))
    # Then the caller is not failed: the turn goes through the inbox and is answered
    assert (await asyncio.wait_for(disposition.result, 10.0)).text == "echo:fenced"
    assert journal.texts("s1") == ["fenced"]


async def test_a_lease_won_by_an_incarnation_that_ended_meanwhile_is_not_run_on(
    start: Start, fault_proxy: FaultProxy, redis_url: str, journal: Journal
) -> None:
    # (no holder-loss sweep within the test: it would answer the turn, whose reservation the
    # ended incarnation held, HOLDER_LOST before the reply comes in)
    quiet_sweep = {"holder_loss_sweep_interval": 600.0}
    late = await start(fault_proxy.url(), **quiet_sweep)
    direct = (await start(redis_url, **quiet_sweep)).backends
    # Given a node's lease acquisition runs on the server, but its reply is held until the
    # node's incarnation has ended (its liveness ran out: anyone may claim the session by then)
    # and the node has registered a new one
    held = fault_proxy.hold_reply(script="lease_acquire", seconds=None)
    submitting = asyncio.ensure_future(late.submit(req("s1", "late", idempotency_key="k")))
    await held.wait_fired()
    epoch = late.renewer.epoch
    assert await direct.liveness.retire(late.node_id)
    await wait_until(lambda: late.renewer.epoch > epoch and bool(late.renewer.incarnation))
    # When the reply comes in
    held.release()
    disposition = await submitting
    # Then the node does not run the turn on that lease: the turn goes through the inbox like
    # any forward, runs once and is answered
    assert disposition.kind is SubmitKind.FORWARDED
    assert (await asyncio.wait_for(disposition.result, 10.0)).text == "echo:late"
    assert journal.texts("s1") == ["late"]


async def test_a_delivery_whose_outcome_is_unknown_is_not_refused_if_it_may_run(
    start: Start, fault_proxy: FaultProxy, redis_url: str, journal: Journal
) -> None:
    holder = await start(redis_url)
    submitter = await start(fault_proxy.url())
    await (await holder.submit(req("s1", "warm up"))).result
    # Given the submitter's reserve (which queues the message for the holder) runs on the
    # server, and both its reply and redis-py's retry are cut (the submitter cannot tell
    # whether the message is queued), and so is every attempt at deleting its reservation
    first = fault_proxy.cut_after(script="idem_put", times=2)
    fault_proxy.cut_before(script="idem_discard", times=1000)
    disposition_or_error: object
    try:
        disposition_or_error = await submitter.submit(req("s1", "maybe", idempotency_key="k"))
    except BackendUnavailableError as exc:
        disposition_or_error = exc
    await first.wait_fired()
    # Then the submit is refused only if the message can no longer run; otherwise its caller
    # follows it and gets its answer
    for text in ("after", "after again"):  # (turns run in order: anything queued ran by then)
        await (await holder.submit(req("s1", text))).result
    if isinstance(disposition_or_error, BackendUnavailableError):
        assert "maybe" not in journal.texts("s1")
    else:
        assert isinstance(disposition_or_error, SubmitDisposition)
        assert (await disposition_or_error.result).text == "echo:maybe"


async def test_a_submit_whose_withdrawal_ran_although_its_reply_was_lost_is_refused(
    start: Start, fault_proxy: FaultProxy, redis_url: str, journal: Journal
) -> None:
    holder = await start(redis_url)
    submitter = await start(fault_proxy.url())
    gate = journal.gate("busy")
    busy = await holder.submit(req("s1", "busy"))
    await journal.entered["busy"].wait()
    # Given a submit whose reserve queues the message for the busy holder, with the reply and
    # redis-py's resend both cut, and whose withdrawal of it (the server runs it: the message is
    # withdrawn) loses its replies the same way
    fault_proxy.cut_after(script="idem_put", times=2)
    withdrawal = fault_proxy.cut_after(script="idem_reset", times=2)
    # Then the submit is refused, as a withdrawn one is, not followed as if a holder took it...
    with pytest.raises(BackendUnavailableError):
        await submitter.submit(req("s1", "maybe", idempotency_key="k"))
    assert withdrawal.count == 2
    # ...and the message never runs
    gate.set()
    await busy.result
    for text in ("after", "after again"):  # (turns run in order: anything queued ran by then)
        await (await holder.submit(req("s1", text))).result
    assert journal.texts("s1") == ["busy", "after", "after again"]


async def test_a_collect_retried_after_a_lost_reply_loses_nothing(
    start: Start, fault_proxy: FaultProxy, redis_url: str, journal: Journal
) -> None:
    holder = await start(fault_proxy.url())
    submitter = await start(redis_url)
    await (await holder.submit(req("s1", "warm up"))).result
    journal.gate("busy")
    busy = await holder.submit(req("s1", "busy"))
    await journal.entered["busy"].wait()
    queued = [await submitter.submit(req("s1", f"queued {n}")) for n in range(3)]
    # Given the holder's connection is cut right after the server ran its collect (redis-py
    # sends it again on a new connection)
    cut = fault_proxy.cut_after(script="inbox_take")
    journal.gates["busy"].set()
    await busy.result
    # Then the batch the first run took is the one the rerun answers: every message runs once
    for disposition in queued:
        assert (await asyncio.wait_for(disposition.result, 10.0)).text.startswith("echo:queued")
    assert cut.count == 1
    assert [t for t in journal.texts("s1") if t.startswith("queued")] == [
        f"queued {n}" for n in range(3)
    ]


async def test_a_same_key_retry_whose_reserve_reply_comes_after_the_answer_gets_it(
    start: Start, fault_proxy: FaultProxy, journal: Journal
) -> None:
    node = await start(fault_proxy.url())
    gate = journal.gate("long")
    first = await node.submit(req("s1", "long", idempotency_key="k"))
    await journal.entered["long"].wait()
    # Given a same-key retry on the turn's holder whose reserve runs on the server while the
    # turn is in flight, and whose reply (saying so) is held back
    held = fault_proxy.hold_reply(script="idem_put", seconds=None)
    retrying = asyncio.ensure_future(node.submit(req("s1", "long", idempotency_key="k")))
    await held.wait_fired()
    # When the turn is answered before that reply comes in
    gate.set()
    assert (await first.result).text == "echo:long"
    held.release()
    retry = await retrying
    # Then the retry follows that turn and gets its answer too (hang guard only)
    assert retry.attached and retry.turn_id == first.turn_id
    assert (await asyncio.wait_for(retry.result, 10.0)).text == "echo:long"
