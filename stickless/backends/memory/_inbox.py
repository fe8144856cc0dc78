"""The in-memory inbox: per-tier FIFOs of encoded envelopes and per-lease pending sets."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..._types import Priority
from ...wire import (
    Envelope,
)
from ..base import (
    CollectedBatch,
    PendingStats,
    decode_entries,
)
from ._shared import InboxRow, Link, State
from ._stores import live_lease


def decode_rows(
    session_id: str, rows: list[InboxRow], redelivered: int = 0, reclaimed: int = 0
) -> CollectedBatch:
    """Decode removed rows one by one (see `base.decode_entries`)."""
    return decode_entries(
        session_id,
        ((row.message_id, row.data, row.arrived_at) for row in rows),
        redelivered=redelivered,
        reclaimed=reclaimed,
    )


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
            taken = collect_locked(state, session_id, max_priority, token, reclaim_own)
        return decode_rows(session_id, taken.rows, taken.redelivered, taken.reclaimed)

    async def ack(self, session_id: str, token: int, message_ids: Sequence[str]) -> None:
        """Drop answered entries from the pending set."""
        with self._link.open() as state:
            ack_locked(state, session_id, token, message_ids)

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
        return decode_rows(session_id, rows)

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
                if session_id not in state.inbox and live_lease(state, session_id, now) is None
            ]
            return queued + left

    async def pending_stats(self, session_ids: Sequence[str]) -> dict[str, PendingStats]:
        """Count each session's queued and pending rows and age its oldest pending one."""
        with self._link.open() as state:
            now = state.clock()
            stats: dict[str, PendingStats] = {}
            for session_id in session_ids:
                queued = sum(len(q) for q in state.inbox.get(session_id, {}).values())
                pending = [
                    row
                    for rows in state.pending.get(session_id, {}).values()
                    for row in rows.values()
                ]
                oldest = min((row.taken_at for row in pending), default=None)
                idle = None if oldest is None else max(0.0, now - oldest)
                stats[session_id] = PendingStats(queued, len(pending), idle)
            return stats


def ack_locked(state: State, session_id: str, token: int, message_ids: Sequence[str]) -> None:
    """Drop answered entries pending under lease `token` (caller holds the state lock)."""
    mine = state.pending.get(session_id, {}).get(token)
    if mine is None:
        return
    for message_id in message_ids:
        mine.pop(message_id, None)
    _forget_empty_pending(state, session_id, token)


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


@dataclass(frozen=True, slots=True)
class Taken:
    """The rows one collect moved under its token: `fresh` of them came from the queue, the
    rest from the pending set (`redelivered` from older leases, `reclaimed` from its own)."""

    rows: list[InboxRow]
    fresh: int
    redelivered: int
    reclaimed: int


def collect_locked(
    state: State, session_id: str, max_priority: Priority, token: int, reclaim_own: bool
) -> Taken:
    """`MemoryInbox.collect` with the state lock held (the hot path's take shares it)."""
    now = state.clock()
    tiers = state.inbox.get(session_id, {})
    rows: list[InboxRow] = []
    for priority in sorted(tiers):
        if priority <= max_priority:
            rows.extend(tiers.pop(priority))
    fresh = len(rows)
    if not tiers:
        state.inbox.pop(session_id, None)
    by_token = state.pending.setdefault(session_id, {})
    redelivered = reclaimed = 0
    if max_priority is Priority.LATER:
        limit = token if reclaim_own else token - 1
        for older in sorted(t for t in by_token if t <= limit):
            left = by_token.pop(older)
            rows.extend(left.values())
            if older == token:
                reclaimed = len(left)
            else:
                redelivered += len(left)
    mine = by_token.setdefault(token, {})
    mine.update((row.message_id, replace(row, taken_at=now)) for row in rows)
    _forget_empty_pending(state, session_id, token)
    return Taken(rows, fresh, redelivered, reclaimed)
