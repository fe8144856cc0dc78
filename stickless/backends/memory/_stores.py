"""In-memory leases, records and reservations, all stored as wire bytes."""

from __future__ import annotations

from collections.abc import Sequence

from ..._types import CommittedEntry
from ...wire import (
    unpack,
)
from ..base import (
    FencedOut,
    HeldElsewhere,
    Lease,
    RecordView,
)
from ._shared import LeaseRow, Link, RecordRow, State

#: How far before "now" `expire_holder` puts a staleness deadline: staleness means strictly past
#: the deadline, and one microsecond is the finest time the Redis store keeps.


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
