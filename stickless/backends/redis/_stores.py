"""The Redis lease store, record store and inbox (see `_idempotency` and `_eventlog`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

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
from ._keys import Keys
from ._role import _SCAN_BATCH, _keep_index, _num, _Role, _text
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
