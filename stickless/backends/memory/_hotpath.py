"""The in-memory hot path: each fused call of a turn under one hold of the shared lock."""

from __future__ import annotations

from dataclasses import replace

from ..._types import Priority
from ...wire import (
    EVENT_CHANNEL_KINDS,
    Envelope,
    Outcome,
    Signal,
    SignalKind,
    WireError,
    encode_event,
    pack,
)
from ..base import (
    CollectedBatch,
    DeadLetter,
    FencedOut,
    Finished,
    Forwarded,
    Forwarding,
    ReservationState,
    Reserved,
    StagedCommit,
    TurnFrames,
    check_batch_id,
)
from ._dead_letters import keep_letter
from ._eventlog import known_batch, relay_batch_locked
from ._idempotency import _held_by, _live_reservation, _view, put_locked
from ._inbox import _append_locked, ack_locked, collect_locked, decode_rows
from ._shared import Link, ReservationRow, State, incarnation_of
from ._signals import fan_out_locked
from ._stores import live_lease


def _quiet(state: State, session_id: str, now: float) -> bool:
    """Whether nothing waits in the session's inbox and nothing is pending under a lease older
    than the current one (what the Redis reserve checks)."""
    if any(state.inbox.get(session_id, {}).values()):
        return False
    lease = live_lease(state, session_id, now)
    current = lease.token if lease is not None else None
    pending = state.pending.get(session_id, {})
    return not any(rows and (current is None or token < current) for token, rows in pending.items())


class MemoryHotPath:
    """`HotPath` in memory: what the Redis scripts do, as one step under the state lock."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def reserve(
        self,
        session_id: str,
        key: str,
        turn_id: str,
        input_hash: str,
        holder: str,
        agent_ref: str,
        secondary_ttl: float,
        primary_ttl: float,
        forward: Forwarding | None = None,
        traceparent: str = "",
    ) -> Reserved:
        """The binding check and the reservation under one lock hold, and with `forward` the
        queueing and the doorbell too (see `HotPath.reserve`; a call here either does it all or
        raises before writing anything, so the delivery id has nothing to guard)."""
        with self._link.open() as state:
            record = state.records.get(session_id)
            bound = None if record is None else record.agent_ref
            if bound is not None and bound != agent_ref:
                return Reserved(bound=bound)
            now = state.clock()
            again = _queued_before(state, session_id, key, turn_id, forward, now)
            if again is not None:
                return Reserved(forwarded=again)
            existing = put_locked(
                state,
                session_id,
                key,
                turn_id,
                input_hash,
                holder,
                secondary_ttl,
                primary_ttl,
                traceparent,
            )
            if existing is not None:
                return Reserved(existing=existing)
            lease = live_lease(state, session_id, now) if forward is not None else None
            if forward is None or lease is None or lease.holder == holder:
                return Reserved(quiet=_quiet(state, session_id, now))
            row = state.reservations[(session_id, key)]
            row.holder, row.incarnation, row.stale_at = None, "", now + forward.staleness
            envelope = forward.envelope
            if envelope.enqueued_at == 0:
                envelope = envelope.model_copy(update={"enqueued_at": now})
            message_id = _append_locked(
                state, session_id, envelope.priority, envelope.encode(), now
            )
            row.queued_as = (forward.delivery_id, message_id)
            doorbell = Signal(
                kind=SignalKind.MESSAGE_ENQUEUED,
                session_id=session_id,
                origin=holder,
                payload={"held_by": lease.holder},
            )
            fan_out_locked(state, doorbell.encode(), None)
            return Reserved(forwarded=Forwarded(message_id, lease.holder, lease.token))

    async def take(
        self,
        session_id: str,
        max_priority: Priority,
        token: int,
        taker: str,
        secondary_ttl: float,
        *,
        reclaim_own: bool = False,
    ) -> CollectedBatch:
        """The collect and a lone fresh message's take-over under one lock hold (see
        `HotPath.take`)."""
        with self._link.open() as state:
            taken = collect_locked(state, session_id, max_priority, token, reclaim_own)
            attempt = 0
            if len(taken.rows) == 1 and taken.fresh == 1:
                row = taken.rows[0]
                attempt = _take_over_locked(
                    state, session_id, row.data, row.message_id, taker, secondary_ttl
                )
        batch = decode_rows(session_id, taken.rows, taken.redelivered, taken.reclaimed)
        return replace(batch, taken_attempt=attempt) if attempt else batch

    async def finish(
        self,
        session_id: str,
        key: str,
        holder: str,
        outcome: Outcome,
        primary_ttl: float,
        commit: StagedCommit | None = None,
        attempt: int | None = None,
        dead_letter: DeadLetter | None = None,
        *,
        pending: tuple[int, str] | None = None,
        announce: Signal | None = None,
        frames: TurnFrames | None = None,
    ) -> Finished:
        """Record, acknowledge, log the last frames and announce under one lock hold (see
        `HotPath.finish`)."""
        data = outcome.encode()
        packed = (
            [pack(e.model_dump(mode="python")) for e in commit.committed(outcome.turn_id)]
            if commit is not None
            else []
        )
        if announce is not None and announce.kind in EVENT_CHANNEL_KINDS:
            raise ValueError(f"{announce.kind} signals do not go on the control channel")
        message = None if announce is None else announce.encode()
        batch_id, encoded = "", []
        if frames is not None and frames.frames:
            check_batch_id(frames.batch_id)
            batch_id = frames.batch_id
            encoded = [encode_event(frame) for frame in frames.frames]
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is not None and row.turn_id == outcome.turn_id and row.outcome == data:
                _ack(state, session_id, pending)
                # the same call made again: already recorded
                known = known_batch(state, session_id, batch_id) if encoded else None
                return Finished(
                    recorded=True, event_ids=tuple(known or ()), version=row.committed_version
                )
            record = state.records.get(session_id)
            if commit is not None:  # a fenced-out holder must learn it has lost the session
                if record is None:
                    raise FencedOut(f"session {session_id} has no record")
                if commit.token < record.fence:
                    raise FencedOut(f"token {commit.token} is older than fence {record.fence}")
            if row is None or not _answers(row, outcome.turn_id, holder, attempt):
                # The message leaves the pending set unless its turn goes on: run by another
                # attempt, or given back to run again from this very copy.
                if not (row is not None and row.turn_id == outcome.turn_id and not row.outcome):
                    _ack(state, session_id, pending)
                found = None if row is None else _view(state, session_id, key, row, now)
                return Finished(recorded=False, found=found)
            if record is not None and commit is not None:
                record.entries.extend(packed)
                row.committed_version = len(record.entries)
            row.state = ReservationState.DONE if outcome.final else ReservationState.FAILED
            row.outcome = data
            row.touched_at = now
            row.expires_at = now + primary_ttl
            if dead_letter is not None:
                keep_letter(state, dead_letter, now)
            _ack(state, session_id, pending)
            ids: list[str] = []
            if encoded:
                ids = relay_batch_locked(state, session_id, holder, batch_id, encoded)
            if message is not None:
                fan_out_locked(state, message, None)
            return Finished(recorded=True, event_ids=tuple(ids), version=row.committed_version)


def _take_over_locked(
    state: State,
    session_id: str,
    data: bytes,
    message_id: str,
    taker: str,
    secondary_ttl: float,
) -> int:
    """The plain take-over of a queued message's reservation (IN_FLIGHT for its turn,
    holderless, due) by `taker`: the attempt taken, 0 when not taken."""
    try:
        envelope = Envelope.decode(data)
    except WireError:
        return 0  # unreadable: answered as such by the collector, nothing is taken over
    now = state.clock()
    row = _live_reservation(state, session_id, envelope.key or "", now)
    if (
        row is None
        or row.state is not ReservationState.IN_FLIGHT
        or row.turn_id != envelope.turn_id
        or row.holder is not None
        or row.due_at > now
    ):
        return 0
    row.attempt += 1
    row.holder, row.incarnation = taker, incarnation_of(state, taker, now)
    row.pending, row.due_at = message_id, 0.0
    row.touched_at, row.stale_at = now, now + secondary_ttl
    return row.attempt


def _queued_before(
    state: State,
    session_id: str,
    key: str,
    turn_id: str,
    forward: Forwarding | None,
    now: float,
) -> Forwarded | None:
    """What the same reserve answered when it queued the message before (None: it did not)."""
    row = _live_reservation(state, session_id, key, now)
    if forward is None or row is None or row.turn_id != turn_id or row.queued_as is None:
        return None
    delivery_id, message_id = row.queued_as
    if delivery_id != forward.delivery_id:
        return None
    lease = live_lease(state, session_id, now)
    return Forwarded(message_id, lease.holder if lease else "", lease.token if lease else 0)


def _answers(row: ReservationRow, turn_id: str, holder: str, attempt: int | None) -> bool:
    """True when `holder` may record the answer of `turn_id` (at `attempt`, when given): the
    reservation is IN_FLIGHT for it, held by `holder` or by nobody."""
    if row.turn_id != turn_id or not (_held_by(row, holder) or _held_by(row, None)):
        return False
    return attempt is None or (row.holder is not None and max(row.attempt, 1) == attempt)


def _ack(state: State, session_id: str, pending: tuple[int, str] | None) -> None:
    """Acknowledge the message's pending entry, if any (caller holds the state lock)."""
    if pending is not None:
        ack_locked(state, session_id, pending[0], [pending[1]])
