"""In-memory leases, records, inbox, reservations and event log, all stored as wire bytes."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence

from ..._events import Event
from ..._types import CommittedEntry, Priority
from ...wire import (
    Envelope,
    Outcome,
    decode_event,
    encode_event,
    pack,
    unpack,
)
from ..base import (
    CollectedBatch,
    FencedOut,
    HeldElsewhere,
    HolderTakeover,
    Lease,
    RecordView,
    Reservation,
    ReservationRef,
    ReservationState,
    StagedCommit,
    cursor_ahead,
    cursor_trimmed,
    decode_entries,
    event_id_key,
    resume_cursor,
)
from ._shared import InboxRow, LeaseRow, Link, RecordRow, ReservationRow, State

logger = logging.getLogger(__name__)

#: How far before "now" `expire_holder` puts a staleness deadline: staleness means strictly past
#: the deadline, and one microsecond is the finest time the Redis store keeps.
STALE_NOW_MARGIN = 1e-6


# --------------------------------------------------------------------------- leases


def _live_lease(state: State, session_id: str, now: float) -> LeaseRow | None:
    """The session's unexpired lease row; an expired one is dropped, as a key TTL would."""
    row = state.leases.get(session_id)
    if row is not None and row.expires_at <= now:
        del state.leases[session_id]
        return None
    return row


class MemoryLeaseStore:
    """Leases with a per-session token counter that outlives release and record deletion."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def acquire(self, session_id: str, holder: str, ttl: float) -> Lease | HeldElsewhere:
        """Take a free or expired lease (new token); refresh the holder's own (same token)."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_lease(state, session_id, now)
            if row is not None and row.holder != holder:
                return HeldElsewhere(session_id, row.holder, row.token, row.expires_at)
            if row is None:
                token = state.lease_counters.get(session_id, 0) + 1
                state.lease_counters[session_id] = token
                row = state.leases[session_id] = LeaseRow(holder, token, now + ttl)
            else:
                row.expires_at = now + ttl
            return Lease(session_id, holder, row.token, row.expires_at)

    async def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """Extend each lease still held under its token; None for the lost ones."""
        with self._link.open() as state:
            now = state.clock()
            renewed: list[Lease | None] = []
            for lease in leases:
                row = _live_lease(state, lease.session_id, now)
                if row is None or row.holder != lease.holder or row.token != lease.token:
                    renewed.append(None)
                    continue
                row.expires_at = now + ttl
                renewed.append(Lease(lease.session_id, lease.holder, lease.token, row.expires_at))
            return renewed

    async def release(self, lease: Lease) -> bool:
        """Drop the lease if still held under this holder and token."""
        with self._link.open() as state:
            row = _live_lease(state, lease.session_id, state.clock())
            if row is None or row.holder != lease.holder or row.token != lease.token:
                return False
            del state.leases[lease.session_id]
            return True

    async def current(self, session_id: str) -> Lease | None:
        """The unexpired lease, if any."""
        with self._link.open() as state:
            row = _live_lease(state, session_id, state.clock())
            if row is None:
                return None
            return Lease(session_id, row.holder, row.token, row.expires_at)

    async def revoke_holder(self, holder: str) -> list[str]:
        """Drop every unexpired lease of `holder` (token counters kept); their session ids."""
        with self._link.open() as state:
            now = state.clock()
            revoked = [
                session_id
                for session_id in list(state.leases)
                if (row := _live_lease(state, session_id, now)) is not None and row.holder == holder
            ]
            for session_id in revoked:
                del state.leases[session_id]
        return sorted(revoked)


# --------------------------------------------------------------------------- records


class MemoryRecordStore:
    """Session records with an agent binding, a fence, and packed committed entries."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def load(self, session_id: str) -> RecordView | None:
        """The record with its entries decoded, or None."""
        with self._link.open() as state:
            row = state.records.get(session_id)
            if row is None:
                return None
            agent_ref, fence, packed = row.agent_ref, row.fence, list(row.entries)
        entries = tuple(CommittedEntry.model_validate(unpack(data)) for data in packed)
        return RecordView(session_id, agent_ref, fence, entries)

    async def binding(self, session_id: str) -> str | None:
        """The bound agent, or None without a record."""
        with self._link.open() as state:
            row = state.records.get(session_id)
            return None if row is None else row.agent_ref

    async def provision(self, session_id: str, agent_ref: str, token: int) -> str:
        """Create the record if missing, raise its fence to `token`, return the bound agent."""
        with self._link.open() as state:
            row = state.records.get(session_id)
            if row is None:
                row = state.records[session_id] = RecordRow(agent_ref, token)
            elif token < row.fence:
                raise FencedOut(f"token {token} is older than fence {row.fence} of {session_id}")
            row.fence = max(row.fence, token)
            return row.agent_ref

    async def delete(self, session_id: str) -> None:
        """Drop the record and transcript; the lease token counter is kept."""
        with self._link.open() as state:
            state.records.pop(session_id, None)


# --------------------------------------------------------------------------- inbox


def _decode_rows(session_id: str, rows: list[InboxRow]) -> CollectedBatch:
    """Decode removed rows one by one (see `base.decode_entries`)."""
    return decode_entries(session_id, ((row.message_id, row.data, row.arrived_at) for row in rows))


class MemoryInbox:
    """One FIFO of encoded envelopes per priority tier per session."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def deliver(self, envelope: Envelope, delivery_id: str | None = None) -> str:
        """Append the envelope, stamping `enqueued_at` with the store clock when unset. A call
        here either appends or raises before writing anything, so `delivery_id` (what makes a
        repeated call safe over a network) has nothing to guard."""
        with self._link.open() as state:
            now = state.clock()
            if envelope.enqueued_at == 0:
                envelope = envelope.model_copy(update={"enqueued_at": now})
            return _append_locked(
                state, envelope.session_id, envelope.priority, envelope.encode(), now
            )

    async def deliver_raw(self, session_id: str, priority: Priority, data: bytes) -> str:
        """Test hook: append arbitrary bytes (to plant corrupt entries)."""
        with self._link.open() as state:
            return _append_locked(state, session_id, priority, data, state.clock())

    async def collect(
        self, session_id: str, max_priority: Priority, token: int, *, reclaim_own: bool = False
    ) -> CollectedBatch:
        """Move every entry of tiers <= `max_priority` into the pending set under `token`
        (a full collect also takes over older leases' pending entries, and this lease's with
        `reclaim_own`), then decode per entry."""
        with self._link.open() as state:
            tiers = state.inbox.get(session_id, {})
            rows: list[InboxRow] = []
            for priority in sorted(tiers):
                if priority <= max_priority:
                    rows.extend(tiers.pop(priority))
            if not tiers:
                state.inbox.pop(session_id, None)
            by_token = state.pending.setdefault(session_id, {})
            mine = by_token.setdefault(token, {})
            if max_priority is Priority.LATER:
                limit = token if reclaim_own else token - 1
                for older in sorted(t for t in by_token if t <= limit):
                    left = by_token[older] if older == token else by_token.pop(older)
                    rows.extend(left.values())
                    mine.update(left)
            mine.update((row.message_id, row) for row in rows)
            _forget_empty_pending(state, session_id, token)
        return _decode_rows(session_id, rows)

    async def ack(self, session_id: str, token: int, message_ids: Sequence[str]) -> None:
        """Drop answered entries from the pending set."""
        with self._link.open() as state:
            mine = state.pending.get(session_id, {}).get(token)
            if mine is None:
                return
            for message_id in message_ids:
                mine.pop(message_id, None)
            _forget_empty_pending(state, session_id, token)

    async def is_empty(self, session_id: str) -> bool:
        """True when nothing is queued or pending for the session."""
        with self._link.open() as state:
            return session_id not in state.inbox and session_id not in state.pending

    async def purge(self, session_id: str) -> CollectedBatch:
        """Remove every tier and every pending entry, and return what was removed."""
        with self._link.open() as state:
            tiers = state.inbox.pop(session_id, {})
            pending = state.pending.pop(session_id, {})
        rows = [row for priority in sorted(tiers) for row in tiers[priority]]
        rows += [row for token in sorted(pending) for row in pending[token].values()]
        return _decode_rows(session_id, rows)

    async def pending_sessions(self, older_than: float) -> list[str]:
        """Sessions whose oldest queued entry arrived more than `older_than` seconds ago, or
        whose pending entries were left by a holder whose lease is gone."""
        with self._link.open() as state:
            now = state.clock()
            cutoff = now - older_than
            queued = [
                session_id
                for session_id, tiers in state.inbox.items()
                if min(queue[0].arrived_at for queue in tiers.values()) < cutoff
            ]
            left = [
                session_id
                for session_id in state.pending
                if session_id not in state.inbox and _live_lease(state, session_id, now) is None
            ]
            return queued + left


def _forget_empty_pending(state: State, session_id: str, token: int) -> None:
    """Drop a lease's empty pending entries, and the session's when no lease has any left."""
    by_token = state.pending[session_id]
    if not by_token[token]:
        del by_token[token]
    if not by_token:
        del state.pending[session_id]


def _append_locked(
    state: State, session_id: str, priority: Priority, data: bytes, now: float
) -> str:
    """Queue encoded bytes at the tail of their tier under a fresh message id."""
    state.message_seq += 1
    message_id = f"m-{state.message_seq}"
    tiers = state.inbox.setdefault(session_id, {})
    tiers.setdefault(priority, deque()).append(InboxRow(message_id, now, data))
    return message_id


# --------------------------------------------------------------------------- idempotency


def _live_reservation(state: State, session_id: str, key: str, now: float) -> ReservationRow | None:
    """The reservation unless past its primary TTL (then dropped, as a key TTL would)."""
    row = state.reservations.get((session_id, key))
    if row is not None and row.expires_at <= now:
        del state.reservations[(session_id, key)]
        return None
    return row


def _held_by(row: ReservationRow, holder: str | None) -> bool:
    """True when the reservation is IN_FLIGHT and held by `holder` (None: holderless)."""
    return row.state is ReservationState.IN_FLIGHT and row.holder == holder


def _view(session_id: str, key: str, row: ReservationRow, now: float) -> Reservation:
    """The public value of a stored reservation, outcome decoded, staleness by the store clock."""
    return Reservation(
        session_id=session_id,
        key=key,
        turn_id=row.turn_id,
        input_hash=row.input_hash,
        holder=row.holder,
        state=row.state,
        touched_at=row.touched_at,
        stale=row.state is ReservationState.IN_FLIGHT and now > row.stale_at,
        outcome=None if row.outcome is None else Outcome.decode(row.outcome),
    )


class MemoryIdempotencyStore:
    """Reservations per (session, key) with holder, staleness deadline and encoded outcome."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def put_if_absent(
        self,
        session_id: str,
        key: str,
        turn_id: str,
        input_hash: str,
        holder: str,
        secondary_ttl: float,
        primary_ttl: float,
    ) -> Reservation | None:
        """Reserve the key unless an IN_FLIGHT or DONE reservation exists (then return it); the
        same call made again finds its own reservation and succeeds."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is not None and row.turn_id == turn_id and _held_by(row, holder):
                return None
            if row is not None and row.state is not ReservationState.FAILED:
                return _view(session_id, key, row, now)
            state.reservations[(session_id, key)] = ReservationRow(
                turn_id=turn_id,
                input_hash=input_hash,
                holder=holder,
                state=ReservationState.IN_FLIGHT,
                touched_at=now,
                stale_at=now + secondary_ttl,
                expires_at=now + primary_ttl,
            )
            return None

    async def touch_many(self, refs: Sequence[ReservationRef], secondary_ttl: float) -> None:
        """Push the staleness deadline of each IN_FLIGHT reservation still held by its ref."""
        with self._link.open() as state:
            now = state.clock()
            for ref in refs:
                row = _live_reservation(state, ref.session_id, ref.key, now)
                if row is not None and _held_by(row, ref.holder):
                    row.touched_at = now
                    row.stale_at = now + secondary_ttl

    async def acquire_holder(
        self, session_id: str, key: str, turn_id: str, holder: str, secondary_ttl: float
    ) -> HolderTakeover:
        """WON when the reservation was IN_FLIGHT for `turn_id` and holderless (or already held
        by `holder`: the same call made again); else REJECTED."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or row.turn_id != turn_id:
                return HolderTakeover.REJECTED
            if not (_held_by(row, None) or _held_by(row, holder)):
                return HolderTakeover.REJECTED
            row.holder = holder
            row.touched_at = now
            row.stale_at = now + secondary_ttl
            return HolderTakeover.WON

    async def release_holder(
        self, session_id: str, key: str, holder: str, forward_ttl: float
    ) -> bool:
        """Make an IN_FLIGHT reservation held by `holder` holderless, stale after `forward_ttl`."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or not _held_by(row, holder):
                return False
            row.holder = None
            row.touched_at = now
            row.stale_at = now + forward_ttl
            return True

    async def mark_done(
        self,
        session_id: str,
        key: str,
        holder: str,
        outcome: Outcome,
        primary_ttl: float,
        commit: StagedCommit | None = None,
    ) -> bool:
        """Store the outcome (DONE when final, else FAILED), with `commit`'s entries appended to
        the transcript under the same lock, if IN_FLIGHT for its turn and held by `holder` or
        nobody (a rerun finding its own outcome succeeds without writing)."""
        data = outcome.encode()
        packed = (
            [pack(e.model_dump(mode="python")) for e in commit.committed(outcome.turn_id)]
            if commit is not None
            else []
        )
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is not None and row.turn_id == outcome.turn_id and row.outcome == data:
                return True  # the same call made again: already recorded
            record = state.records.get(session_id)
            if commit is not None:  # a fenced-out holder must learn it has lost the session
                if record is None:
                    raise FencedOut(f"session {session_id} has no record")
                if commit.token < record.fence:
                    raise FencedOut(f"token {commit.token} is older than fence {record.fence}")
            if row is None or row.turn_id != outcome.turn_id:
                return False
            if row.state is not ReservationState.IN_FLIGHT:
                return False
            if not (_held_by(row, holder) or _held_by(row, None)):
                return False
            if record is not None:
                record.entries.extend(packed)
            row.state = ReservationState.DONE if outcome.final else ReservationState.FAILED
            row.outcome = data
            row.touched_at = now
            row.expires_at = now + primary_ttl
            return True

    async def compare_and_reset(
        self, session_id: str, key: str, expected_holder: str | None, outcome: Outcome
    ) -> bool:
        """Record `outcome` (DONE when final, else FAILED) if IN_FLIGHT for its turn and held
        by `expected_holder`."""
        data = outcome.encode()
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or row.turn_id != outcome.turn_id:
                return False
            if row.state is not ReservationState.IN_FLIGHT:
                return row.outcome == data  # the same call made again: it still won
            if not _held_by(row, expected_holder):
                return False
            row.state = ReservationState.DONE if outcome.final else ReservationState.FAILED
            row.outcome = data
            row.touched_at = now
            return True

    async def discard_reservation(self, session_id: str, key: str, turn_id: str) -> bool:
        """Delete an IN_FLIGHT reservation made for `turn_id`."""
        with self._link.open() as state:
            row = _live_reservation(state, session_id, key, state.clock())
            if row is None or row.state is not ReservationState.IN_FLIGHT or row.turn_id != turn_id:
                return False
            del state.reservations[(session_id, key)]
            return True

    async def find_stale_in_flight(self, limit: int) -> list[Reservation]:
        """Up to `limit` IN_FLIGHT reservations past their staleness deadline, oldest first."""
        with self._link.open() as state:
            now = state.clock()
            stale: list[tuple[float, Reservation]] = []
            for (session_id, key), row in list(state.reservations.items()):
                if row.state is not ReservationState.IN_FLIGHT or row.stale_at >= now:
                    continue
                if _live_reservation(state, session_id, key, now) is not None:
                    stale.append((row.stale_at, _view(session_id, key, row, now)))
        stale.sort(key=lambda item: item[0])
        return [reservation for _, reservation in stale[: max(limit, 0)]]

    async def expire_holder(self, holder: str) -> int:
        """Move the staleness deadline of each IN_FLIGHT reservation of `holder` not yet stale to
        just before now (one microsecond, the Redis store's resolution, so it is past at once);
        return how many moved. Already stale ones are left as they are and not counted."""
        with self._link.open() as state:
            now = state.clock()
            expired = 0
            for session_id, key in list(state.reservations):
                row = _live_reservation(state, session_id, key, now)
                if row is not None and _held_by(row, holder) and row.stale_at >= now:
                    row.stale_at = now - STALE_NOW_MARGIN
                    expired += 1
            return expired

    async def find(self, session_id: str, key: str) -> Reservation | None:
        """The reservation, or None when missing or past its primary TTL."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            return None if row is None else _view(session_id, key, row, now)


# --------------------------------------------------------------------------- event log


def _expire_logs(state: State, now: float) -> None:
    """Forget every event log past its expiry (they sit at the front of the expiry order)."""
    expiry = state.event_log_expiry
    while expiry:
        session_id, expires_at = next(iter(expiry.items()))
        if expires_at > now:
            return
        del expiry[session_id]
        state.event_streams.pop(session_id, None)
        state.last_event_ids.pop(session_id, None)
        state.dropped_event_ids.pop(session_id, None)


def _refresh_log(state: State, session_id: str, now: float) -> None:
    """Push the session's log expiry to `event_log_ttl` from now (moving it to the back)."""
    state.event_log_expiry.pop(session_id, None)
    state.event_log_expiry[session_id] = now + state.event_log_ttl


def _format_id(key: tuple[int, int]) -> str:
    return f"{key[0]}-{key[1]}"


class MemoryEventLog:
    """Per-session logs of encoded frames with '<ms>-<n>' ids, keeping the newest `max_len`,
    each forgotten whole `event_log_ttl` after its last append or delete (see `EventLog`)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def append(self, session_id: str, events: Sequence[Event]) -> list[str]:
        """Append frames in order and return their ids."""
        encoded = [encode_event(event) for event in events]
        if not encoded:
            return []
        with self._link.open() as state:
            now = state.clock()
            _expire_logs(state, now)
            stream = state.event_streams.get(session_id)
            if stream is None:
                stream = state.event_streams[session_id] = deque()
            ms = int(now * 1000)
            last_ms, last_n = state.last_event_ids.get(session_id, (-1, 0))
            ids: list[str] = []
            for data in encoded:
                last_ms, last_n = (ms, 0) if ms > last_ms else (last_ms, last_n + 1)
                if (last_ms, last_n) == (0, 0):  # '0-0' is the origin cursor, never an id
                    last_n = 1
                event_id = f"{last_ms}-{last_n}"
                stream.append((event_id, data))
                ids.append(event_id)
            while len(stream) > state.max_len:
                dropped, _ = stream.popleft()
                state.dropped_event_ids[session_id] = event_id_key(dropped)
            state.last_event_ids[session_id] = (last_ms, last_n)
            _refresh_log(state, session_id, now)
            return ids

    async def read(self, session_id: str, after: str | None, limit: int) -> list[Event]:
        """Up to `limit` frames with ids strictly after `after` (all when None), ids set.

        Raises:
            EventCursorTrimmedError, EventCursorAheadError, InvalidRequestError: see `EventLog`.
        """
        floor = resume_cursor(after)
        selected: list[tuple[str, bytes]] = []
        with self._link.open() as state:
            _expire_logs(state, state.clock())
            stream = state.event_streams.get(session_id, deque())
            if floor is not None:
                cursor = _format_id(floor)
                last = state.last_event_ids.get(session_id)
                if last is None:
                    raise cursor_trimmed(session_id, cursor, None, None)
                if floor > last:
                    raise cursor_ahead(session_id, cursor, _format_id(last))
                dropped = state.dropped_event_ids.get(session_id)
                if dropped is not None and floor < dropped:
                    oldest = stream[0][0] if stream else None
                    raise cursor_trimmed(session_id, cursor, oldest, _format_id(last))
            for event_id, data in stream:
                if len(selected) >= limit:
                    break
                if floor is None or event_id_key(event_id) > floor:
                    selected.append((event_id, data))
        return [decode_event(data, event_id) for event_id, data in selected]

    async def delete(self, session_id: str) -> None:
        """Drop the session's frames; its last id is kept (the log now expires as a whole
        `event_log_ttl` from now) so ids never go back and older cursors read as trimmed."""
        with self._link.open() as state:
            now = state.clock()
            _expire_logs(state, now)
            last = state.last_event_ids.get(session_id)
            state.event_streams.pop(session_id, None)
            if last is None:
                return
            state.dropped_event_ids[session_id] = last
            _refresh_log(state, session_id, now)
