"""In-memory leases, records and reservations, all stored as wire bytes."""

from __future__ import annotations

from ..._types import CommittedEntry
from ...wire import (
    unpack,
)
from ..base import (
    FencedOut,
    HeldElsewhere,
    Lease,
    NotLive,
    RecordView,
    check_version,
)
from ._shared import LeaseRow, Link, RecordRow, State, holder_alive, incarnation_of, live_until

# --------------------------------------------------------------------------- leases


def live_lease(state: State, session_id: str, now: float) -> LeaseRow | None:
    """The session's valid lease row (its holder's incarnation alive), or None."""
    row = state.leases.get(session_id)
    if row is not None and not holder_alive(state, row.holder, row.incarnation, now):
        return None
    return row


def _lease(state: State, session_id: str, row: LeaseRow, now: float) -> Lease:
    return Lease(session_id, row.holder, row.token, live_until(state, row.holder, now))


class MemoryLeaseStore:
    """Leases with a per-session token counter that outlives release and record deletion."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def acquire(self, session_id: str, holder: str) -> Lease | HeldElsewhere:
        """Take a free lease or a dead incarnation's (new token); the holder's own comes back.

        Raises:
            NotLive: the holder has no live incarnation.
        """
        with self._link.open() as state:
            now = state.clock()
            incarnation = incarnation_of(state, holder, now)
            if not incarnation:
                raise NotLive(f"{holder} has no live incarnation: it may not take {session_id}")
            row = live_lease(state, session_id, now)
            if row is not None and row.holder != holder:
                lease = _lease(state, session_id, row, now)
                return HeldElsewhere(session_id, row.holder, row.token, lease.expires_at)
            if row is None:
                token = state.lease_counters.get(session_id, 0) + 1
                state.lease_counters[session_id] = token
                row = state.leases[session_id] = LeaseRow(holder, token, incarnation)
            return _lease(state, session_id, row, now)

    async def release(self, lease: Lease) -> bool:
        """Drop the lease if still held under this holder and token."""
        with self._link.open() as state:
            row = live_lease(state, lease.session_id, state.clock())
            if row is None or row.holder != lease.holder or row.token != lease.token:
                return False
            del state.leases[lease.session_id]
            return True

    async def current(self, session_id: str) -> Lease | None:
        """The valid lease, if any."""
        with self._link.open() as state:
            now = state.clock()
            row = live_lease(state, session_id, now)
            return None if row is None else _lease(state, session_id, row, now)

    async def revoke_holder(self, holder: str) -> list[str]:
        """Drop every lease a dead incarnation of `holder` left (token counters kept); their
        session ids."""
        with self._link.open() as state:
            now = state.clock()
            revoked = [
                session_id
                for session_id, row in state.leases.items()
                if row.holder == holder and not holder_alive(state, holder, row.incarnation, now)
            ]
            for session_id in revoked:
                del state.leases[session_id]
        return sorted(revoked)


# --------------------------------------------------------------------------- records


class MemoryRecordStore:
    """Session records with an agent binding, a fence, and packed committed entries."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def load(self, session_id: str, after: int = 0) -> RecordView | None:
        """The record with the entries after `after` decoded, or None."""
        check_version(after)
        with self._link.open() as state:
            row = state.records.get(session_id)
            if row is None:
                return None
            agent_ref, fence, packed = row.agent_ref, row.fence, row.entries[after:]
            version = len(row.entries)
        entries = tuple(CommittedEntry.model_validate(unpack(data)) for data in packed)
        return RecordView(session_id, agent_ref, fence, entries, version)

    async def binding(self, session_id: str) -> str | None:
        """The bound agent, or None without a record or while unbound."""
        with self._link.open() as state:
            row = state.records.get(session_id)
            return None if row is None else row.agent_ref

    async def provision(self, session_id: str, agent_ref: str | None, token: int) -> str | None:
        """Create the record if missing, raise its fence to `token`, bind `agent_ref` if given
        and unbound; the bound agent (see `RecordStore.provision`)."""
        with self._link.open() as state:
            row = state.records.get(session_id)
            if row is None:
                row = state.records[session_id] = RecordRow(None, token)
            elif token < row.fence:
                raise FencedOut(f"token {token} is older than fence {row.fence} of {session_id}")
            row.fence = max(row.fence, token)
            if row.agent_ref is None:
                row.agent_ref = agent_ref
            return row.agent_ref

    async def delete(self, session_id: str) -> None:
        """Drop the record and transcript; the lease token counter is kept."""
        with self._link.open() as state:
            state.records.pop(session_id, None)


# --------------------------------------------------------------------------- owners


class MemorySessionOwners:
    """Session owner stamps (see `SessionOwners`)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def claim(self, session_id: str, principal_id: str) -> str:
        with self._link.open() as state:
            return state.owners.setdefault(session_id, principal_id)

    async def owner(self, session_id: str) -> str | None:
        with self._link.open() as state:
            return state.owners.get(session_id)

    async def forget(self, session_id: str) -> None:
        with self._link.open() as state:
            state.owners.pop(session_id, None)


# --------------------------------------------------------------------------- chat streams


class MemoryChatStreams:
    """The turn each chat last started (see `ChatStreams`); forgotten only with the data set,
    as a finished turn's pointer means nothing to resume."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def started(self, session_id: str, turn_id: str) -> None:
        with self._link.open() as state:
            state.chat_streams[session_id] = turn_id

    async def current(self, session_id: str) -> str | None:
        with self._link.open() as state:
            return state.chat_streams.get(session_id)


# --------------------------------------------------------------------------- inbox
