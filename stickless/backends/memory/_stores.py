"""In-memory leases, records and reservations, all stored as wire bytes."""

from __future__ import annotations

from collections.abc import Sequence

from ..._types import CommittedEntry
from ...wire import (
    Outcome,
    pack,
    unpack,
)
from ..base import (
    FencedOut,
    HeldElsewhere,
    HolderTakeover,
    Lease,
    RecordView,
    Reservation,
    ReservationRef,
    ReservationState,
    StagedCommit,
)
from ._shared import LeaseRow, Link, RecordRow, ReservationRow, State

#: How far before "now" `expire_holder` puts a staleness deadline: staleness means strictly past
#: the deadline, and one microsecond is the finest time the Redis store keeps.
STALE_NOW_MARGIN = 1e-6


# --------------------------------------------------------------------------- leases


def live_lease(state: State, session_id: str, now: float) -> LeaseRow | None:
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
            row = live_lease(state, session_id, now)
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
                row = live_lease(state, lease.session_id, now)
                if row is None or row.holder != lease.holder or row.token != lease.token:
                    renewed.append(None)
                    continue
                row.expires_at = now + ttl
                renewed.append(Lease(lease.session_id, lease.holder, lease.token, row.expires_at))
            return renewed

    async def release(self, lease: Lease) -> bool:
        """Drop the lease if still held under this holder and token."""
        with self._link.open() as state:
            row = live_lease(state, lease.session_id, state.clock())
            if row is None or row.holder != lease.holder or row.token != lease.token:
                return False
            del state.leases[lease.session_id]
            return True

    async def current(self, session_id: str) -> Lease | None:
        """The unexpired lease, if any."""
        with self._link.open() as state:
            row = live_lease(state, session_id, state.clock())
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
                if (row := live_lease(state, session_id, now)) is not None and row.holder == holder
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
