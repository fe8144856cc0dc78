"""The Redis lease store, record store and inbox (see `_idempotency` and `_eventlog`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..._types import CommittedEntry, Priority
from ...wire import (
    Envelope,
    unpack,
)
from ..base import (
    CollectedBatch,
    FencedOut,
    HeldElsewhere,
    Lease,
    RecordView,
    decode_entries,
)
from ._keys import TIERS, Keys
from ._role import _SCAN_BATCH, _SCAN_ROUNDS, _keep_index, _ms, _num, _Role, _text
from ._scripts import Call, Scripts, run_batch

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- leases


def _lease(session_id: str, reply: Sequence[Any]) -> Lease:
    """A lease from a {holder, token, expiry} reply."""
    return Lease(session_id, _text(reply[0]), int(reply[1]), float(reply[2]))


class RedisLeaseStore(_Role):
    """Lease hashes with a per-session INCR counter as the fencing token, plus a per-holder index.

    The counter expires `token_ttl` after the last lease it issued or renewed would expire; a
    missing counter restarts from the server clock (see `next_token` in the Lua prelude), so a
    token never goes back, whether the counter expired or was lost.

    The holder index (`Keys.holder_leases`) lists the sessions a holder may hold, for
    `revoke_holder`. It lives outside the sessions' slots, so separate commands keep it: a grant
    adds the session after the script (one more round trip, on grants only), a release removes
    it in the same pipeline as the script (no extra trip). It is a superset kept honest by
    `revoke_holder`, which checks each member against the lease hash and drops dead ones; a
    member lost to a crash between script and index write only loses the shortcut (that lease
    then expires by its TTL). It expires twice the lease TTL after the holder's last grant or
    renewal: by then every lease it lists has expired, so a dead holder leaves nothing behind.
    """

    def __init__(self, client: Redis, scripts: Scripts, keys: Keys, token_ttl: float) -> None:
        super().__init__(client, scripts, keys)
        self._token_ttl = token_ttl

    async def acquire(self, session_id: str, holder: str, ttl: float) -> Lease | HeldElsewhere:
        """Take a free or expired lease (new token); refresh the holder's own (same token)."""
        keys = self._keys
        reply = await self._scripts.lease_acquire(
            keys=[keys.lease(session_id), keys.token_counter(session_id)],
            args=[holder, _num(ttl), _num(self._token_ttl)],
        )
        lease = _lease(session_id, reply[1:])
        if not int(reply[0]):
            return HeldElsewhere(session_id, lease.holder, lease.token, lease.expires_at)
        # A refresh adds it again too, which heals a member lost to a crash. The lease is won
        # either way: a failed index write only costs the revoke shortcut, so it is not raised.
        index = keys.holder_leases(holder)
        try:
            await run_batch(
                self._client, [Call(None, ["SADD", index, session_id]), *_keep_index(index, ttl)]
            )
        except RedisError as exc:
            logger.warning("holder index of %s missed session %s: %s", holder, session_id, exc)
        return lease

    async def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[Lease | None]:
        """Extend each lease still held under its token, in one round trip; None for lost ones.

        The same trip pushes the expiry of each holder's index (see the class docstring)."""
        keys = self._keys
        calls = [
            Call(
                self._scripts.lease_renew,
                [keys.lease(lease.session_id), keys.token_counter(lease.session_id)],
                [lease.holder, str(lease.token), _num(ttl), _num(self._token_ttl)],
            )
            for lease in leases
        ]
        for holder in dict.fromkeys(lease.holder for lease in leases):
            calls.extend(_keep_index(keys.holder_leases(holder), ttl))
        replies = (await run_batch(self._client, calls))[: len(leases)]
        return [
            None
            if reply is None
            else Lease(lease.session_id, lease.holder, lease.token, float(reply))
            for lease, reply in zip(leases, replies, strict=True)
        ]

    async def release(self, lease: Lease) -> bool:
        """Drop the lease if still held under this holder and token (one round trip: the
        holder-index member goes in the same pipeline, re-added in the rare case the holder
        still holds the session under another token)."""
        keys = self._keys
        index = keys.holder_leases(lease.holder)
        reply, _ = await run_batch(
            self._client,
            [
                Call(
                    self._scripts.lease_release,
                    [keys.lease(lease.session_id)],
                    [lease.holder, str(lease.token)],
                ),
                Call(None, ["SREM", index, lease.session_id]),
            ],
        )
        if int(reply[0]) == 2:
            # The SREM may have emptied (so deleted) the index: put the member back with an
            # expiry covering the lease that is still held.
            try:
                await run_batch(
                    self._client,
                    [
                        Call(None, ["SADD", index, lease.session_id]),
                        *_keep_index(index, int(reply[1]) / 1000),
                    ],
                )
            except RedisError as exc:
                logger.warning(
                    "holder index of %s missed session %s: %s", lease.holder, lease.session_id, exc
                )
        return int(reply[0]) == 1

    async def current(self, session_id: str) -> Lease | None:
        """The unexpired lease, if any."""
        reply = await self._scripts.lease_current(keys=[self._keys.lease(session_id)])
        return None if reply is None else _lease(session_id, reply)

    async def revoke_holder(self, holder: str) -> list[str]:
        """Drop every unexpired lease of `holder` (token counters kept); their session ids.

        Round trips: one to read the holder index, then one per `_SCAN_BATCH` members, each
        pipelining a verifying script per member with the removal of those members (revoked
        or dead) from the index.
        """
        keys, scripts = self._keys, self._scripts
        index = keys.holder_leases(holder)
        members = sorted(_text(member) for member in await self._client.smembers(index))
        revoked: list[str] = []
        for start in range(0, len(members), _SCAN_BATCH):
            chunk = members[start : start + _SCAN_BATCH]
            checked: list[tuple[str, str]] = []
            for session_id in chunk:
                try:
                    checked.append((session_id, keys.lease(session_id)))
                except ValueError:  # not a session id this store could have indexed
                    continue
            replies = await run_batch(
                self._client,
                [
                    *(
                        Call(scripts.lease_revoke, [lease_key], [holder])
                        for _, lease_key in checked
                    ),
                    Call(None, ["SREM", index, *chunk]),
                ],
            )
            revoked.extend(
                session_id
                for (session_id, _), reply in zip(checked, replies[:-1], strict=True)
                if int(reply)
            )
        return revoked


# --------------------------------------------------------------------------- records


class RedisRecordStore(_Role):
    """Record hash {agent, fence} plus a list of packed committed entries."""

    async def load(self, session_id: str) -> RecordView | None:
        """The record with its entries decoded (one consistent MULTI snapshot), or None."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hmget(self._keys.record(session_id), ["agent", "fence"])
        pipe.lrange(self._keys.transcript(session_id), 0, -1)
        (agent, fence), packed = await pipe.execute()
        if agent is None:
            return None
        entries = tuple(CommittedEntry.model_validate(unpack(data)) for data in packed)
        return RecordView(session_id, _text(agent), int(fence), entries)

    async def binding(self, session_id: str) -> str | None:
        """The bound agent, or None without a record (one HGET, no transcript)."""
        agent = await self._client.hget(self._keys.record(session_id), "agent")
        return None if agent is None else _text(agent)

    async def provision(self, session_id: str, agent_ref: str, token: int) -> str:
        """Create the record if missing, raise its fence to `token`, return the bound agent."""
        reply = await self._scripts.record_provision(
            keys=[self._keys.record(session_id)], args=[agent_ref, str(token)]
        )
        if not int(reply[0]):
            raise FencedOut(f"token {token} is older than fence {_text(reply[1])} of {session_id}")
        return _text(reply[1])

    async def delete(self, session_id: str) -> None:
        """Drop the record and transcript; the lease token counter is kept."""
        await self._client.delete(self._keys.record(session_id), self._keys.transcript(session_id))


# --------------------------------------------------------------------------- inbox

#: Seconds a delivery id is remembered: far longer than any retry of one call takes.
_DELIVERY_MEMORY = 3600


def _decode_entries(session_id: str, flat: Sequence[Any]) -> CollectedBatch:
    """Decode removed entries one by one (see `base.decode_entries`); `flat` repeats (tier,
    stream id, encoded envelope or None, arrival time as stored or None). The stored fields
    are handed over raw: parsing them is part of the per-entry decode, never of the batch."""
    return decode_entries(
        session_id,
        (
            (f"{int(flat[i])}:{_text(flat[i + 1])}", flat[i + 2], flat[i + 3])
            for i in range(0, len(flat), 4)
        ),
    )


class RedisInbox(_Role):
    """One stream per priority tier per session, plus the cluster-wide pending-sessions index.

    A tier is deleted whole when collected; one nobody collects expires `ttl` after its last
    delivery (a safety net: past `forward_ttl` every caller waiting on it was answered).

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
            envelope.session_id, envelope.priority, envelope.encode(), delivery_id
        )

    async def deliver_raw(self, session_id: str, priority: Priority, data: bytes) -> str:
        """Test hook: append arbitrary bytes (to plant corrupt entries)."""
        return await self._append(session_id, priority, data, None)

    async def _append(
        self, session_id: str, priority: Priority, data: bytes, delivery_id: str | None
    ) -> str:
        # One id per delivery: redis-py sends the very same call again after a lost reply (and
        # a caller may, with the same id), and the script appends a delivery id only once.
        delivery_id = delivery_id or uuid.uuid4().hex
        stream_id, arrived, was_empty = await self._scripts.inbox_deliver(
            keys=[*self._keys.inbox(session_id), self._keys.delivery(session_id, delivery_id)],
            args=[TIERS.index(priority), data, _DELIVERY_MEMORY, _ms(self._ttl)],
        )
        # First message: the exact arrival time. Otherwise only fill a missing entry (a crash
        # between script and index write); a present one already scores an older arrival.
        # The message is queued by now: an index failure must not report the delivery failed
        # (the index only serves the orphan scan, and the next delivery refills it).
        try:
            await self._client.zadd(
                self._keys.pending_index, {session_id: float(arrived)}, nx=not int(was_empty)
            )
        except Exception as exc:
            logger.warning("pending index update for %s failed: %s", session_id, exc)
        return f"{int(priority)}:{_text(stream_id)}"

    async def collect(self, session_id: str, max_priority: Priority) -> CollectedBatch:
        """Remove every entry of tiers <= `max_priority` at once, then decode per entry."""
        return await self._take(session_id, TIERS.index(max_priority))

    async def purge(self, session_id: str) -> CollectedBatch:
        """Remove every tier and return what was removed."""
        return await self._take(session_id, len(TIERS) - 1)

    async def _take(self, session_id: str, last_tier: int) -> CollectedBatch:
        # One id per take: redis-py sends the very same call again after a lost reply, and the
        # rerun answers the batch the first run took (instead of nothing: a lost batch).
        take_id = uuid.uuid4().hex
        taken_at, remaining, flat = await self._scripts.inbox_take(
            keys=[*self._keys.inbox(session_id), self._keys.take(session_id, take_id)],
            args=[last_tier, _DELIVERY_MEMORY],
        )
        if flat and not int(remaining):
            # The entries are out of the stream by now: an index failure must not lose them
            # (a stale index entry is dropped by the next pending_sessions scan).
            try:
                await self._scripts.index_drop(
                    keys=[self._keys.pending_index], args=[session_id, _text(taken_at)]
                )
            except Exception as exc:
                logger.warning("pending index cleanup for %s failed: %s", session_id, exc)
        return _decode_entries(session_id, flat)

    async def is_empty(self, session_id: str) -> bool:
        """True when nothing is queued for the session."""
        return await self._client.exists(*self._keys.inbox(session_id)) == 0

    async def pending_sessions(self, older_than: float) -> list[str]:
        """Sessions whose oldest queued entry arrived more than `older_than` seconds ago.

        Candidates come from the index; each is checked against its streams: an empty inbox
        drops its entry (unless a delivery rescored it meanwhile), a younger one is rescored.
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
                [Call(scripts.inbox_oldest, keys.inbox(session)) for session, _ in candidates],
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
