"""The Redis inbox: tier streams per session, a pending set of collected entries, and the
cluster-wide pending-sessions index."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from redis.asyncio import Redis

from ..._types import Priority
from ...wire import Envelope
from ..base import HOLDER_INDEX_TTL, CollectedBatch, PendingStats, decode_entries
from ._keys import TIERS, Keys
from ._role import _SCAN_BATCH, _SCAN_ROUNDS, _ms, _num, _Role, _text
from ._scripts import Call, Scripts, run_batch

#: Seconds a delivery id (and a take's reply) is remembered: far longer than any retry of one
#: call takes.
DELIVERY_MEMORY = 3600


def _decode_entries(
    session_id: str, flat: Sequence[Any], redelivered: int, reclaimed: int
) -> CollectedBatch:
    """Decode taken entries one by one (see `base.decode_entries`); `flat` repeats (message id,
    encoded envelope or None, arrival time as stored or None). The stored fields are handed over
    raw: parsing them is part of the per-entry decode, never of the batch."""
    return decode_entries(
        session_id,
        ((_text(flat[i]), flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)),
        redelivered=redelivered,
        reclaimed=reclaimed,
    )


def _stats(reply: Sequence[Any]) -> PendingStats:
    """One session's `inbox_stats` reply as counts and the oldest pending entry's idle time."""
    now, queued, pending, oldest = reply
    idle = max(0.0, float(now) - float(oldest)) if _text(oldest) else None
    return PendingStats(int(queued), int(pending), idle)


class RedisInbox(_Role):
    """One stream per priority tier per session, the session's pending set, and the
    cluster-wide pending-sessions index.

    A collect moves the tiers' entries into the pending set under the collecting lease's token
    (the streams are deleted whole); an entry leaves it when its holder acknowledges it after
    recording its answer, and a later lease takes over what an earlier one left. Streams and
    pending set expire `ttl` after their last write (a safety net: past `forward_ttl` every
    caller waiting on them was answered).

    The index holds, per session with queued messages, a lower bound of its oldest arrival time.
    It is written after the session's scripts by separate commands (a session and the index live
    in different slots) and healed by `pending_sessions`, which checks every candidate against
    the session's own streams.
    """

    def __init__(self, client: Redis, scripts: Scripts, keys: Keys, ttl: float) -> None:
        super().__init__(client, scripts, keys)
        self._ttl = ttl

    async def deliver(self, envelope: Envelope, delivery_id: str | None = None) -> str:
        """Append the envelope to its tier, once per `delivery_id`; collect stamps
        `enqueued_at` when it is 0."""
        return await self._append(
            envelope.session_id,
            envelope.priority,
            envelope.encode(),
            delivery_id,
            (envelope.key or "", envelope.turn_id),
        )

    async def deliver_raw(self, session_id: str, priority: Priority, data: bytes) -> str:
        """Test hook: append arbitrary bytes (to plant corrupt entries)."""
        return await self._append(session_id, priority, data, None)

    async def _append(
        self,
        session_id: str,
        priority: Priority,
        data: bytes,
        delivery_id: str | None,
        names: tuple[str, str] = ("", ""),
    ) -> str:
        # One id per delivery: redis-py sends the very same call again after a lost reply (and
        # a caller may, with the same id), and the script appends a delivery id only once.
        delivery_id = delivery_id or uuid.uuid4().hex
        stream_id, _, _ = await self._scripts.inbox_deliver(
            keys=[
                *self._keys.inbox(session_id),
                self._keys.delivery(session_id, delivery_id),
                self._keys.pending_index,
            ],
            args=[
                TIERS.index(priority),
                data,
                DELIVERY_MEMORY,
                _ms(self._ttl),
                session_id,
                *names,
            ],
        )
        return f"{int(priority)}:{_text(stream_id)}"

    async def collect(
        self, session_id: str, max_priority: Priority, token: int, *, reclaim_own: bool = False
    ) -> CollectedBatch:
        """Move every entry of tiers <= `max_priority` into the pending set under `token` (a
        full collect also takes over older leases' pending entries, and this lease's with
        `reclaim_own`), then decode per entry."""
        return await self._collect(session_id, max_priority, token, reclaim_own, None)

    async def ack(self, session_id: str, token: int, message_ids: Sequence[str]) -> None:
        """Drop answered entries from the pending set (one script, safe to run again)."""
        if message_ids:
            await self._scripts.inbox_ack(
                keys=self._keys.pending(session_id), args=[token, *message_ids]
            )

    async def purge(self, session_id: str) -> CollectedBatch:
        """Remove every tier and the pending set, and return what was removed."""
        return await self._take(session_id, len(TIERS) - 1, 0, -1, purge=True)

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
        """`collect`, taking the reservation of a lone fresh message over for `taker` in the
        same script (see `HotPath.take`)."""
        return await self._collect(
            session_id, max_priority, token, reclaim_own, (taker, secondary_ttl)
        )

    async def _collect(
        self,
        session_id: str,
        max_priority: Priority,
        token: int,
        reclaim_own: bool,
        taker: tuple[str, float] | None,
    ) -> CollectedBatch:
        """A collect's take: a full one reclaims older leases' pending entries (and this
        lease's own with `reclaim_own`)."""
        reclaim = -1
        if max_priority is Priority.LATER:
            reclaim = token if reclaim_own else token - 1
        last_tier = TIERS.index(max_priority)
        return await self._take(session_id, last_tier, token, reclaim, purge=False, taker=taker)

    async def _take(
        self,
        session_id: str,
        last_tier: int,
        token: int,
        reclaim: int,
        *,
        purge: bool,
        taker: tuple[str, float] | None = None,
    ) -> CollectedBatch:
        # One id per take: redis-py sends the very same call again after a lost reply, and the
        # rerun answers the batch the first run took (instead of nothing).
        keys = self._keys
        take_id = uuid.uuid4().hex
        holder, secondary_ttl = taker or ("", 0.0)
        _, _, flat, redelivered, reclaimed, attempt = await self._scripts.inbox_take(
            keys=[
                *keys.inbox(session_id),
                keys.take(session_id, take_id),
                *keys.pending(session_id),
                keys.pending_index,
                keys.stale_index,
                keys.holder_reservations(holder or "-"),
            ],
            args=[
                last_tier,
                DELIVERY_MEMORY,
                token,
                reclaim,
                _ms(self._ttl),
                int(purge),
                session_id,
                holder,
                _num(secondary_ttl),
                keys.reservation(session_id, ""),
                f"{len(session_id)}:{session_id}",
                _ms(HOLDER_INDEX_TTL),
            ],
        )
        batch = _decode_entries(session_id, flat, int(redelivered), int(reclaimed))
        return replace(batch, taken_attempt=int(attempt)) if int(attempt) else batch

    @property
    def ttl(self) -> float:
        """Seconds a tier or the pending set lives after its last write."""
        return self._ttl

    async def is_empty(self, session_id: str) -> bool:
        """True when nothing is queued or pending for the session."""
        keys = self._keys
        return await self._client.exists(*keys.inbox(session_id), keys.pending(session_id)[0]) == 0

    async def pending_stats(self, session_ids: Sequence[str]) -> dict[str, PendingStats]:
        """Each session's backlog: one `inbox_stats` script per session (each in its own slot),
        all in one pipelined round trip."""
        keys, wanted = self._keys, list(dict.fromkeys(session_ids))
        replies = await run_batch(
            self._client,
            [Call(self._scripts.inbox_stats, [*keys.inbox(s), *keys.pending(s)]) for s in wanted],
        )
        return {s: _stats(reply) for s, reply in zip(wanted, replies, strict=True)}

    async def pending_sessions(self, older_than: float) -> list[str]:
        """Sessions whose oldest queued entry arrived more than `older_than` seconds ago, or
        whose pending entries were left by a holder whose lease is gone.

        Candidates come from the index; each is checked against its streams, pending set and
        lease: an empty inbox drops its entry (unless a delivery rescored it meanwhile), a
        younger one (or one pending under a live lease) is rescored.
        """
        keys, scripts = self._keys, self._scripts
        listed: list[str] = []
        offset = 0
        for _ in range(_SCAN_ROUNDS):
            _, cutoff_text, hits = await scripts.index_due(
                keys=[keys.pending_index], args=[_num(older_than), offset, _SCAN_BATCH]
            )
            candidates = [(_text(hits[i]), _text(hits[i + 1])) for i in range(0, len(hits), 2)]
            cutoff = float(cutoff_text)
            oldest = await run_batch(
                self._client,
                [
                    Call(
                        scripts.inbox_oldest,
                        [*keys.inbox(session), keys.pending(session)[0], keys.lease(session)],
                    )
                    for session, _ in candidates
                ],
            )
            repairs: list[Call] = []
            for (session, score), (checked_at, first) in zip(candidates, oldest, strict=True):
                if not first:
                    repairs.append(
                        Call(scripts.index_drop, [keys.pending_index], [session, checked_at])
                    )
                elif float(first) < cutoff:
                    listed.append(session)
                else:
                    repairs.append(
                        Call(scripts.index_rescore, [keys.pending_index], [session, score, first])
                    )
            # Entries a repair could not move are still in range: skip them next round.
            offset = len(listed) + sum(not done for done in await run_batch(self._client, repairs))
            if len(candidates) < _SCAN_BATCH:
                break
        return list(dict.fromkeys(listed))
