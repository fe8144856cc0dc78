"""HotPath contract: a turn's finish records, acknowledges and announces as one step, and
refuses (or is fenced out) without announcing, acknowledging only a message whose turn ends."""

from __future__ import annotations

import pytest

from stickless._types import Priority, TranscriptEntry
from stickless.backends.base import (
    Backends,
    FencedOut,
    Finished,
    Lease,
    ReservationState,
    Reserved,
    StagedCommit,
)
from stickless.wire import Outcome, Signal, SignalKind, TurnResultPayload

from .test_idempotency import DAY, LONG, _find, _ok, _reserve
from .test_inbox import _envelope, _turns
from .test_signals import Recorder

TOKEN = 3


def _result(outcome: Outcome, origin: str = "node-a") -> Signal:
    """The TURN_RESULT a holder sends for `outcome` (key k1 of s1)."""
    payload = TurnResultPayload(key="k1", outcome=outcome).model_dump(mode="python")
    return Signal(kind=SignalKind.TURN_RESULT, session_id="s1", origin=origin, payload=payload)


async def _collected(backends: Backends, turn_id: str = "t1") -> tuple[int, str]:
    """Deliver a message and collect it under TOKEN: its pending entry."""
    await backends.inbox.deliver(_envelope(turn_id))
    batch = await backends.inbox.collect("s1", Priority.LATER, TOKEN)
    (message,) = batch.messages
    return TOKEN, message.message_id


async def _still_pending(backends: Backends) -> list[str]:
    """Turns a later lease would take over: what is still pending (unacknowledged)."""
    return _turns(await backends.inbox.collect("s1", Priority.LATER, TOKEN + 1))


async def _announced(recorder: Recorder, backends: Backends) -> list[Signal]:
    """What the control channel carried up to a marker published after the finish."""
    marker = Signal(kind=SignalKind.STATUS, session_id="marker", origin="test")
    await backends.signals.publish(marker)
    return [s for s in await recorder.until(marker) if s != marker]


async def _listening(backends: Backends) -> Recorder:
    recorder = Recorder()
    await backends.signals.subscribe(recorder)
    return recorder


async def test_a_finish_records_acknowledges_and_announces_in_one_call(
    backends: Backends,
) -> None:
    recorder = await _listening(backends)
    # Given a provisioned session and a collected message whose reservation node-a holds
    await backends.records.provision("s1", "agent-a", TOKEN)
    pending = await _collected(backends)
    await _reserve(backends)
    commit = StagedCommit(TOKEN, (TranscriptEntry(role="assistant", content="hi"),))
    # When node-a finishes the turn with its entries, pending entry and TURN_RESULT
    finished = await backends.hotpath.finish(
        "s1", "k1", "node-a", _ok(), DAY, commit, pending=pending, announce=_result(_ok())
    )
    # Then the outcome and the entries are recorded, the message acknowledged, and the
    # TURN_RESULT went out (once, decoding to the very signal the bus would have sent)
    assert finished.recorded and finished.found is None
    found = await _find(backends)
    assert (found.state, found.outcome) == (ReservationState.DONE, _ok())
    record = await backends.records.load("s1")
    assert record is not None and [e.content for e in record.entries] == ["hi"]
    assert await _still_pending(backends) == []
    assert await _announced(recorder, backends) == [_result(_ok())]


async def test_a_finish_run_twice_commits_acknowledges_and_announces_once(
    backends: Backends,
) -> None:
    recorder = await _listening(backends)
    # Given a finish that ran (its reply lost), then a second message collected under the
    # same token
    await backends.records.provision("s1", "agent-a", TOKEN)
    pending = await _collected(backends)
    await _reserve(backends)
    commit = StagedCommit(TOKEN, (TranscriptEntry(role="assistant", content="hi"),))

    async def finish() -> Finished:
        return await backends.hotpath.finish(
            "s1", "k1", "node-a", _ok(), DAY, commit, pending=pending, announce=_result(_ok())
        )

    assert (await finish()).recorded
    await backends.inbox.deliver(_envelope("t2"))
    await backends.inbox.collect("s1", Priority.LATER, TOKEN)
    # When the very same call is sent again
    again = await finish()
    # Then it counts as recorded, yet nothing was written, acknowledged or announced twice
    assert again.recorded
    record = await backends.records.load("s1")
    assert record is not None and [e.content for e in record.entries] == ["hi"]
    assert (await _find(backends)).outcome == _ok()
    assert await _still_pending(backends) == ["t2"]
    assert await _announced(recorder, backends) == [_result(_ok())]


async def test_a_refused_finish_announces_nothing_and_acknowledges_an_answered_turn(
    backends: Backends,
) -> None:
    recorder = await _listening(backends)
    # Given a collected message whose turn another node already answered (a holder-loss reset)
    pending = await _collected(backends)
    await _reserve(backends)
    lost = Outcome(turn_id="t1", ok=False, code="HOLDER_LOST", message="gone")
    assert await backends.idempotency.compare_and_reset("s1", "k1", "node-a", lost)
    # When node-a finishes it
    finished = await backends.hotpath.finish(
        "s1", "k1", "node-a", _ok(), DAY, pending=pending, announce=_result(_ok())
    )
    # Then it is refused with the stored answer, nothing is announced, and the message is
    # acknowledged (its turn does not go on)
    assert not finished.recorded
    assert finished.found is not None and finished.found.outcome == lost
    assert (await _find(backends)).outcome == lost
    assert await _still_pending(backends) == []
    assert await _announced(recorder, backends) == []


async def test_a_refused_finish_keeps_the_message_of_a_turn_that_goes_on(
    backends: Backends,
) -> None:
    recorder = await _listening(backends)
    # Given a collected message whose turn node-b holds now (it runs another attempt)
    pending = await _collected(backends)
    await _reserve(backends, holder="node-b")
    # When node-a finishes it, and then finishes a key nobody reserved
    finished = await backends.hotpath.finish(
        "s1", "k1", "node-a", _ok(), DAY, pending=pending, announce=_result(_ok())
    )
    # Then it is refused with the reservation as it is, nothing is announced, and the
    # message stays pending for the turn's next run
    assert not finished.recorded
    assert finished.found is not None
    assert (finished.found.turn_id, finished.found.holder) == ("t1", "node-b")
    assert finished.found.state is ReservationState.IN_FLIGHT
    assert await _still_pending(backends) == ["t1"]
    missing = await backends.hotpath.finish("s1", "nope", "node-a", _ok(), DAY)
    assert (missing.recorded, missing.found) == (False, None)
    assert await _announced(recorder, backends) == []


async def test_a_fenced_out_finish_writes_acknowledges_and_announces_nothing(
    backends: Backends,
) -> None:
    recorder = await _listening(backends)
    # Given a turn of a holder whose token a newer holder's provisioning fenced out
    await backends.records.provision("s1", "agent-a", TOKEN + 1)
    pending = await _collected(backends)
    await _reserve(backends)
    commit = StagedCommit(TOKEN, (TranscriptEntry(role="assistant", content="late"),))
    # When it finishes with its entries
    with pytest.raises(FencedOut):
        await backends.hotpath.finish(
            "s1", "k1", "node-a", _ok(), DAY, commit, pending=pending, announce=_result(_ok())
        )
    # Then nothing was written, acknowledged or announced
    found = await _find(backends)
    assert (found.state, found.outcome) == (ReservationState.IN_FLIGHT, None)
    record = await backends.records.load("s1")
    assert record is not None and record.entries == ()
    assert await _still_pending(backends) == ["t1"]
    assert await _announced(recorder, backends) == []


async def test_a_finish_of_an_attempt_not_held_announces_nothing(backends: Backends) -> None:
    recorder = await _listening(backends)
    # Given a collected message whose reservation was made holderless (no attempt runs)
    pending = await _collected(backends)
    await _reserve(backends)
    assert await backends.idempotency.release_holder("s1", "k1", "node-a", LONG)
    # When node-a answers as attempt 1
    late = await backends.hotpath.finish(
        "s1", "k1", "node-a", _ok(), DAY, attempt=1, pending=pending, announce=_result(_ok())
    )
    # Then it is refused, announces nothing, and the message stays for the turn's next run
    assert not late.recorded
    assert (await _find(backends)).state is ReservationState.IN_FLIGHT
    assert await _still_pending(backends) == ["t1"]
    assert await _announced(recorder, backends) == []


# --------------------------------------------------------------------------- reserve


async def _reserve_as(backends: Backends, agent: str, turn_id: str = "t1") -> Reserved:
    return await backends.hotpath.reserve(
        "s1", "k1", turn_id, f"hash-{turn_id}", "node-a", agent, LONG, DAY
    )


async def test_reserve_refuses_a_session_bound_to_another_agent_writing_nothing(
    backends: Backends,
) -> None:
    # Given a session bound to agent-a
    await backends.records.provision("s1", "agent-a", TOKEN)
    # When a submit for agent-b reserves
    refused = await _reserve_as(backends, "agent-b")
    # Then it is refused with the binding, and no reservation was made
    assert refused == Reserved(bound="agent-a")
    assert await backends.idempotency.find("s1", "k1") is None
    # ...while one for the bound agent reserves, and a rerun of it finds its own reservation
    assert await _reserve_as(backends, "agent-a") == Reserved(quiet=True)
    assert await _reserve_as(backends, "agent-a") == Reserved(quiet=True)
    found = await _find(backends)
    assert (found.turn_id, found.holder) == ("t1", "node-a")
    assert found.state is ReservationState.IN_FLIGHT


async def test_reserve_of_a_provisioned_unbound_session_refuses_no_agent(
    backends: Backends,
) -> None:
    # Given a session whose record exists but no agent was bound yet
    await backends.records.provision("s1", None, TOKEN)
    # When submits for two agents reserve
    first = await _reserve_as(backends, "agent-a")
    second = await backends.hotpath.reserve(
        "s1", "k2", "t2", "hash-t2", "node-a", "agent-b", LONG, DAY
    )
    # Then neither is refused (the binding decides later which one runs)
    assert first == second == Reserved(quiet=True)
    # ...until an agent is bound
    await backends.records.provision("s1", "agent-a", TOKEN)
    assert await backends.hotpath.reserve(
        "s1", "k3", "t3", "hash-t3", "node-a", "agent-b", LONG, DAY
    ) == Reserved(bound="agent-a")


async def test_reserve_of_an_unbound_session_returns_what_exists(backends: Backends) -> None:
    # Given an unbound session whose key is reserved by another turn
    assert await _reserve_as(backends, "agent-a") == Reserved(quiet=True)
    # When another turn reserves the same key
    other = await _reserve_as(backends, "agent-a", turn_id="t2")
    # Then it gets the existing reservation back
    assert other.bound is None and other.existing is not None
    assert other.existing.turn_id == "t1"


async def test_reserve_tells_whether_anything_waits_in_the_inbox(backends: Backends) -> None:
    # Given a session with nothing queued: its reserve is quiet
    await backends.liveness.register("node-x", "inc-x", LONG)
    first = await backends.leases.acquire("s1", "node-x")
    assert (await _reserve_as(backends, "agent-a", turn_id="t1")).quiet
    # When a message waits in the inbox, the next reserve is not
    await backends.inbox.deliver(_envelope("t9"))
    found = await backends.hotpath.reserve(
        "s1", "k2", "t2", "hash-t2", "node-a", "agent-a", LONG, DAY
    )
    assert not found.quiet
    # When it was collected under the current lease, the reserve is quiet again...
    assert isinstance(first, Lease)
    await backends.inbox.collect("s1", Priority.LATER, first.token)
    again = await backends.hotpath.reserve(
        "s1", "k3", "t3", "hash-t3", "node-a", "agent-a", LONG, DAY
    )
    assert again.quiet
    # ...but not once the lease has changed hands (it is pending under an older one)
    await backends.liveness.retire("node-x")
    await backends.liveness.register("node-y", "inc-y", LONG)
    assert isinstance(await backends.leases.acquire("s1", "node-y"), Lease)
    later = await backends.hotpath.reserve(
        "s1", "k4", "t4", "hash-t4", "node-a", "agent-a", LONG, DAY
    )
    assert not later.quiet
