"""The Redis lease store, record store and inbox (see `_idempotency` and `_eventlog`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..._logs import get_logger
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
from ._keys import Keys
from ._role import _SCAN_BATCH, _keep_index, _num, _Role, _text
from ._scripts import Call, Scripts, run_batch

logger = get_logger(__name__)

# --------------------------------------------------------------------------- leases


def _lease(session_id: str, reply: Sequence[Any]) -> Lease:
    """A lease from a {holder, token, expiry} reply."""
    return Lease(session_id, _text(reply[0]), int(reply[1]), float(reply[2]))


class RedisLeaseStore(_Role):
    """Lease hashes naming holder, token and the holder's incarnation, with a per-session INCR
    counter as the fencing token, plus a per-holder index.

    A lease has no expiry of its own: it is valid while its holder's incarnation lives (see
    `RedisLiveness`), so a node renews one key per tick however many sessions it holds. The
    counter expires `token_ttl` after the last lease it issued; a missing counter restarts
    from the server clock (see `next_token` in the Lua prelude), so a token never goes back.

    The holder index (`Keys.holder_leases`) lists the sessions a holder may hold, for
    `revoke_holder` (the dead-holder sweep drops a dead incarnation's lease hashes with it).
    It lives outside the sessions' slots, so separate commands keep it: a grant adds the
    session after the script (one more round trip, on grants only), a release removes it in
    the same pipeline as the script (no extra trip). It is a superset kept honest by
    `revoke_holder`, which checks each member against the lease hash and drops dead ones; a
    member lost to a crash between script and index write only leaves that lease hash until
    the session's next acquire replaces it. The holder's liveness renewals keep it alive.
    """

    def __init__(self, client: Redis, scripts: Scripts, keys: Keys, token_ttl: float) -> None:
        super().__init__(client, scripts, keys)
        self._token_ttl = token_ttl

    async def acquire(self, session_id: str, holder: str) -> Lease | HeldElsewhere:
        """Take a free lease or a dead incarnation's (new token); the holder's own comes back.

        Raises:
            NotLive: the holder has no live incarnation.
        """
        keys = self._keys
        reply = await self._scripts.lease_acquire(
            keys=[keys.lease(session_id), keys.token_counter(session_id)],
            args=[holder, _num(self._token_ttl)],
        )
        if int(reply[0]) == 2:
            raise NotLive(f"{holder} has no live incarnation: it may not take {session_id}")
        lease = _lease(session_id, reply[1:])
        if not int(reply[0]):
            return HeldElsewhere(session_id, lease.holder, lease.token, lease.expires_at)
        # A re-acquire adds it again too, which heals a member lost to a crash. The lease is won
        # either way: a failed index write only costs the revoke shortcut, so it is not raised.
        index = keys.holder_leases(holder)
        try:
            await run_batch(
                self._client,
                [
                    Call(None, ["SADD", index, session_id]),
                    *_keep_index(index),
                ],
            )
        except RedisError as exc:
            logger.warning("holder index of %s missed session %s: %s", holder, session_id, exc)
        return lease

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
            # The holder still holds the session under another token: put the member back (the
            # holder's liveness renewals keep the index alive).
            try:
                await self._client.sadd(index, lease.session_id)
            except RedisError as exc:
                logger.warning(
                    "holder index of %s missed session %s: %s", lease.holder, lease.session_id, exc
                )
        return int(reply[0]) == 1

    async def current(self, session_id: str) -> Lease | None:
        """The valid lease, if any."""
        reply = await self._scripts.lease_current(keys=[self._keys.lease(session_id)])
        return None if reply is None else _lease(session_id, reply)

    async def revoke_holder(self, holder: str) -> list[str]:
        """Drop every lease a dead incarnation of `holder` left (token counters kept); their
        session ids.

        Round trips: one to read the holder index, then two per `_SCAN_BATCH` members: a
        verifying script per member, then the removal of every member but a live
        incarnation's from the index.
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
                [Call(scripts.lease_revoke, [lease_key], [holder]) for _, lease_key in checked],
            )
            verdicts = {
                session_id: int(reply)
                for (session_id, _), reply in zip(checked, replies, strict=True)
            }
            revoked.extend(s for s, verdict in verdicts.items() if verdict == 1)
            gone = [member for member in chunk if verdicts.get(member) != 2]
            if gone:
                await self._client.srem(index, *gone)
        return revoked


# --------------------------------------------------------------------------- records


class RedisRecordStore(_Role):
    """Record hash {agent, fence} plus a list of packed committed entries."""

    async def load(self, session_id: str, after: int = 0) -> RecordView | None:
        """The record with the entries after `after` decoded (one MULTI snapshot), or None."""
        check_version(after)
        pipe = self._client.pipeline(transaction=True)
        pipe.hmget(self._keys.record(session_id), ["agent", "fence"])
        pipe.lrange(self._keys.transcript(session_id), after, -1)
        pipe.llen(self._keys.transcript(session_id))
        (agent, fence), packed, version = await pipe.execute()
        if fence is None:  # (every record has a fence; an unbound one has no agent yet)
            return None
        entries = tuple(CommittedEntry.model_validate(unpack(data)) for data in packed)
        bound = None if agent is None else _text(agent)
        return RecordView(session_id, bound, int(fence), entries, int(version))

    async def binding(self, session_id: str) -> str | None:
        """The bound agent, or None without a record or while unbound (one HGET)."""
        agent = await self._client.hget(self._keys.record(session_id), "agent")
        return None if agent is None else _text(agent)

    async def provision(self, session_id: str, agent_ref: str | None, token: int) -> str | None:
        """Create the record if missing, raise its fence to `token`, bind `agent_ref` if given
        and unbound, in one script; the bound agent (see `RecordStore.provision`)."""
        reply = await self._scripts.record_provision(
            keys=[self._keys.record(session_id)], args=[agent_ref or "", str(token)]
        )
        if not int(reply[0]):
            raise FencedOut(f"token {token} is older than fence {_text(reply[1])} of {session_id}")
        return _text(reply[1]) or None

    async def delete(self, session_id: str) -> None:
        """Drop the record and transcript; the lease token counter is kept."""
        await self._client.delete(self._keys.record(session_id), self._keys.transcript(session_id))


# --------------------------------------------------------------------------- owners


class RedisSessionOwners(_Role):
    """Session owner stamps, one string per session (see `SessionOwners`)."""

    async def claim(self, session_id: str, principal_id: str) -> str:
        # SET NX GET (Redis 7) stamps and reads in one command: nil when this call stamped.
        earlier = await self._client.set(
            self._keys.owner(session_id), principal_id, nx=True, get=True
        )
        return principal_id if earlier is None else _text(earlier)

    async def owner(self, session_id: str) -> str | None:
        value = await self._client.get(self._keys.owner(session_id))
        return None if value is None else _text(value)

    async def forget(self, session_id: str) -> None:
        await self._client.delete(self._keys.owner(session_id))


# --------------------------------------------------------------------------- chat streams


class RedisChatStreams(_Role):
    """The turn each chat last started, one string per session expiring with the event log it
    points into (see `ChatStreams`)."""

    def __init__(self, client: Redis, scripts: Scripts, keys: Keys, ttl: float) -> None:
        super().__init__(client, scripts, keys)
        self._ttl_ms = max(int(ttl * 1000), 1)

    async def started(self, session_id: str, turn_id: str) -> None:
        await self._client.set(self._keys.chat_stream(session_id), turn_id, px=self._ttl_ms)

    async def current(self, session_id: str) -> str | None:
        value = await self._client.get(self._keys.chat_stream(session_id))
        return None if value is None else _text(value)
