"""Redis leases, records, inbox, reservations and event log; time decisions run in Lua."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

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
    resume_cursor,
)
from ._keys import TIERS, Keys, parse_reservation_member, reservation_member
from ._scripts import Call, Scripts, run_batch

logger = logging.getLogger(__name__)

#: Candidates one index scan round verifies, and the rounds one scan may take.
_SCAN_BATCH = 256
_SCAN_ROUNDS = 8


def _text(value: Any) -> str:
    """A reply value as text (replies are bytes: the client does not decode)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _num(value: float) -> str:
    """A number as a script argument Lua's tonumber reads back exactly."""
    return repr(float(value))


def _keep_index(index: str, ttl: float) -> list[Call]:
    """Commands keeping a per-holder index alive for twice `ttl` from now: set when it has no
    expiry, pushed later when it has an earlier one, never pulled earlier (NX, then GT)."""
    ms = _ms(2 * ttl)
    return [Call(None, ["PEXPIRE", index], [ms, "NX"]), Call(None, ["PEXPIRE", index], [ms, "GT"])]


def _ms(seconds: float) -> int:
    """A positive TTL in whole milliseconds (rounded up, at least 1)."""
    return max(1, math.ceil(seconds * 1000))


class _Role:
    """What every store shares: the client, its scripts and the namespace's keys."""

    def __init__(self, client: Redis, scripts: Scripts, keys: Keys) -> None:
        self._client = client
        self._scripts = scripts
        self._keys = keys


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

    async def deliver(self, envelope: Envelope) -> str:
        """Append the envelope to its tier; collect stamps `enqueued_at` when it is 0."""
        return await self._append(envelope.session_id, envelope.priority, envelope.encode())

    async def deliver_raw(self, session_id: str, priority: Priority, data: bytes) -> str:
        """Test hook: append arbitrary bytes (to plant corrupt entries)."""
        return await self._append(session_id, priority, data)

    async def _append(self, session_id: str, priority: Priority, data: bytes) -> str:
        # One id per delivery: redis-py sends the very same call again after a lost reply, and
        # the script appends a delivery id only once.
        delivery_id = uuid.uuid4().hex
        stream_id, arrived, was_empty = await self._scripts.inbox_deliver(
            keys=[*self._keys.inbox(session_id), self._keys.deliveries(session_id)],
            args=[TIERS.index(priority), data, delivery_id, _DELIVERY_MEMORY, _ms(self._ttl)],
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
        taken_at, remaining, flat = await self._scripts.inbox_take(
            keys=self._keys.inbox(session_id), args=[last_tier]
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


# --------------------------------------------------------------------------- idempotency


def _reservation(session_id: str, key: str, reply: Sequence[Any]) -> Reservation:
    """The public value of a reservation reply (see `reservation_reply` in the Lua prelude)."""
    turn, input_hash, has_holder, holder, state, touched, stale, outcome = reply[:8]
    return Reservation(
        session_id=session_id,
        key=key,
        turn_id=_text(turn),
        input_hash=_text(input_hash),
        holder=_text(holder) if int(has_holder) else None,
        state=ReservationState(_text(state)),
        touched_at=float(touched),
        stale=bool(int(stale)),
        outcome=Outcome.decode(outcome) if outcome else None,
    )


class RedisIdempotencyStore(_Role):
    """One hash per (session, key) with a primary-TTL expiry, plus the stale IN_FLIGHT index and
    a per-holder index.

    The stale index member names one reservation instance (session, key, turn) and scores a
    lower bound of its stale deadline: creation writes it, whatever moves the deadline earlier
    lowers it, a later deadline is left alone (so the renewal tick's touches stay one round
    trip), and `find_stale_in_flight` rescores what it verifies.

    The holder index (`Keys.holder_reservations`, same members) lists the instances a holder
    may hold IN_FLIGHT, for `expire_holder`. Its writes ride in the pipeline of the stale-index
    command each operation already sends after its script, so no round trip is added: creation
    and `acquire_holder` add, `release_holder`, `mark_done`, `compare_and_reset` and
    `discard_reservation` remove. It is a superset kept honest by `expire_holder`, which checks
    each member against its hash and drops dead ones. It expires twice the staleness TTL after
    the holder's last reservation, take-over or touch (same pipelines): by then every instance
    it lists is stale anyway, so a dead holder's index goes away by itself.
    """

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
        """Reserve the key unless an IN_FLIGHT or DONE reservation exists (then return it).

        One round trip: the index entries ride in the script's pipeline, written optimistically
        with score 0 (due at once; the first scan verifies and rescores it to its real deadline,
        and drops it when the script did not create this instance).
        """
        member = reservation_member(session_id, key, turn_id)
        index = self._keys.holder_reservations(holder)
        (created, detail), *_ = await run_batch(
            self._client,
            [
                Call(
                    self._scripts.idem_put,
                    [self._keys.reservation(session_id, key)],
                    [turn_id, input_hash, holder, _num(secondary_ttl), _num(primary_ttl)],
                ),
                Call(None, ["ZADD", self._keys.stale_index, "LT", "0", member]),
                Call(None, ["SADD", index, member]),
                *_keep_index(index, secondary_ttl),
            ],
        )
        if not int(created):
            return _reservation(session_id, key, detail)
        return None

    async def touch_many(self, refs: Sequence[ReservationRef], secondary_ttl: float) -> None:
        """Push the staleness deadline of each reservation still held by its ref (one trip; a
        second only for deadlines a shorter TTL moved earlier, which the index must follow)."""
        calls = [
            Call(
                self._scripts.idem_touch,
                [self._keys.reservation(ref.session_id, ref.key)],
                [ref.holder, _num(secondary_ttl)],
            )
            for ref in refs
        ]
        for holder in dict.fromkeys(ref.holder for ref in refs):
            calls.extend(_keep_index(self._keys.holder_reservations(holder), secondary_ttl))
        replies = (await run_batch(self._client, calls))[: len(refs)]
        lowered = {
            reservation_member(ref.session_id, ref.key, _text(reply[1])): float(reply[2])
            for ref, reply in zip(refs, replies, strict=True)
            if int(reply[0])
        }
        if lowered:
            await self._client.zadd(self._keys.stale_index, lowered, lt=True)

    async def acquire_holder(
        self, session_id: str, key: str, turn_id: str, holder: str, secondary_ttl: float
    ) -> HolderTakeover:
        """WON when the reservation was IN_FLIGHT, holderless and for `turn_id`; else REJECTED.

        One round trip: the take-over shortens the staleness deadline, so the index entry is
        lowered (optimistically to 0: the scan rescores it) in the script's pipeline, with the
        holder-index add (dropped by `expire_holder` when the take-over was refused).
        """
        member = reservation_member(session_id, key, turn_id)
        index = self._keys.holder_reservations(holder)
        reply, *_ = await run_batch(
            self._client,
            [
                Call(
                    self._scripts.idem_acquire,
                    [self._keys.reservation(session_id, key)],
                    [holder, _num(secondary_ttl), turn_id],
                ),
                Call(None, ["ZADD", self._keys.stale_index, "LT", "0", member]),
                Call(None, ["SADD", index, member]),
                *_keep_index(index, secondary_ttl),
            ],
        )
        return HolderTakeover.WON if int(reply[0]) else HolderTakeover.REJECTED

    async def release_holder(
        self, session_id: str, key: str, holder: str, forward_ttl: float
    ) -> bool:
        """Make an IN_FLIGHT reservation held by `holder` holderless, stale after `forward_ttl`.

        The later deadline is left to the scan (the index score stays a lower bound); the
        holder-index removal follows in a second command only when the release happened.
        """
        reply = await self._scripts.idem_release(
            keys=[self._keys.reservation(session_id, key)], args=[holder, _num(forward_ttl)]
        )
        if not int(reply[0]):
            return False
        member = reservation_member(session_id, key, _text(reply[1]))
        await self._client.srem(self._keys.holder_reservations(holder), member)
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
        the transcript in the same script, if IN_FLIGHT for its turn and held by `holder` or
        nobody (a rerun finding its own outcome succeeds without writing).

        One round trip: the index removals ride in the script's pipeline; when the script
        refuses (the instance is someone else's or already finished) the stale-index entry is
        put back as due, for the scan to verify.
        """
        state = ReservationState.DONE if outcome.final else ReservationState.FAILED
        member = reservation_member(session_id, key, outcome.turn_id)
        staged: list[str | bytes] = [""]
        if commit is not None:
            entries = commit.committed(outcome.turn_id)
            staged = [str(commit.token), *(pack(e.model_dump(mode="python")) for e in entries)]
        keys = self._keys
        reply, _, _ = await run_batch(
            self._client,
            [
                Call(
                    self._scripts.idem_mark_done,
                    [
                        keys.reservation(session_id, key),
                        keys.record(session_id),
                        keys.transcript(session_id),
                    ],
                    [
                        holder,
                        outcome.turn_id,
                        state.value,
                        outcome.encode(),
                        _num(primary_ttl),
                        *staged,
                    ],
                ),
                Call(None, ["ZREM", self._keys.stale_index, member]),
                Call(None, ["SREM", self._keys.holder_reservations(holder), member]),
            ],
        )
        result = int(reply[0])
        if result == 1:
            return True
        await self._client.zadd(self._keys.stale_index, {member: 0})
        if result == 2:
            fence = _text(reply[1])
            if not fence:
                raise FencedOut(f"session {session_id} has no record")
            raise FencedOut(f"token {commit and commit.token} is older than fence {fence}")
        return False

    async def compare_and_reset(
        self, session_id: str, key: str, expected_holder: str | None, outcome: Outcome
    ) -> bool:
        """Record `outcome` (DONE when final, else FAILED) if IN_FLIGHT for its turn and held
        by `expected_holder`."""
        reply = await self._scripts.idem_reset(
            keys=[self._keys.reservation(session_id, key)],
            args=[
                "0" if expected_holder is None else "1",
                expected_holder or "",
                outcome.encode(),
                outcome.turn_id,
                (ReservationState.DONE if outcome.final else ReservationState.FAILED).value,
            ],
        )
        if not int(reply[0]):
            return False
        await self._unindex(session_id, key, _text(reply[1]), expected_holder)
        return True

    async def discard_reservation(self, session_id: str, key: str, turn_id: str) -> bool:
        """Delete an IN_FLIGHT reservation made for `turn_id`."""
        reply = await self._scripts.idem_discard(
            keys=[self._keys.reservation(session_id, key)], args=[turn_id]
        )
        if not int(reply[0]):
            return False
        await self._unindex(session_id, key, turn_id, _text(reply[1]) or None)
        return True

    async def _unindex(self, session_id: str, key: str, turn_id: str, holder: str | None) -> None:
        """Drop a finished instance from the stale index and, in the same pipeline, from its
        holder's index (the scans drop it if this is lost)."""
        member = reservation_member(session_id, key, turn_id)
        calls = [Call(None, ["ZREM", self._keys.stale_index, member])]
        if holder is not None:
            calls.append(Call(None, ["SREM", self._keys.holder_reservations(holder), member]))
        await run_batch(self._client, calls)

    async def find_stale_in_flight(self, limit: int) -> list[Reservation]:
        """Up to `limit` IN_FLIGHT reservations past their staleness deadline, oldest first.

        Each index candidate is verified against its hash: a finished, replaced or expired
        instance is dropped, a live one not yet stale is rescored to its real deadline.
        """
        if limit <= 0:
            return []
        keys, scripts = self._keys, self._scripts
        found: dict[str, tuple[float, Reservation]] = {}
        offset = 0
        for _ in range(_SCAN_ROUNDS):
            _, _, hits = await scripts.index_due(
                keys=[keys.stale_index], args=["0", offset, _SCAN_BATCH]
            )
            candidates: list[tuple[str, str, tuple[str, str, str] | None]] = []
            for i in range(0, len(hits), 2):
                member = _text(hits[i])
                try:
                    address: tuple[str, str, str] | None = parse_reservation_member(member)
                except ValueError:
                    address = None
                candidates.append((member, _text(hits[i + 1]), address))
            views = await run_batch(
                self._client,
                [
                    Call(scripts.idem_find, [keys.reservation(a[0], a[1])])
                    for _, _, a in candidates
                    if a is not None
                ],
            )
            replies = iter(views)
            repairs: list[Call] = []
            for member, score, address in candidates:
                reply = None if address is None else next(replies)
                if address is None or reply is None or _text(reply[0]) != address[2]:
                    repairs.append(Call(None, ["ZREM", keys.stale_index, member]))
                    continue
                view = _reservation(address[0], address[1], reply)
                if view.state is not ReservationState.IN_FLIGHT:
                    repairs.append(Call(None, ["ZREM", keys.stale_index, member]))
                elif view.stale:
                    found[member] = (float(reply[8]), view)
                else:
                    repairs.append(
                        Call(scripts.index_rescore, [keys.stale_index], [member, score, reply[8]])
                    )
            # Entries a repair could not move are still in range: skip them next round.
            offset = len(found) + sum(not done for done in await run_batch(self._client, repairs))
            if len(found) >= limit or len(candidates) < _SCAN_BATCH:
                break
        ordered = sorted(found.values(), key=lambda item: item[0])
        return [reservation for _, reservation in ordered[:limit]]

    async def expire_holder(self, holder: str) -> int:
        """Move the staleness deadline of each IN_FLIGHT reservation of `holder` not yet stale to
        just before now (server clock); return how many moved.

        Round trips: one to read the holder index, then two per `_SCAN_BATCH` members: the
        verifying scripts, then one pipeline lowering the stale-index scores (so the sweep sees
        them at once; already stale ones are lowered too, which heals a lost write) and dropping
        dead members from the holder index.
        """
        keys, scripts = self._keys, self._scripts
        index = keys.holder_reservations(holder)
        members = sorted(_text(member) for member in await self._client.smembers(index))
        expired = 0
        for start in range(0, len(members), _SCAN_BATCH):
            dead: list[str] = []
            checked: list[tuple[str, Call]] = []
            for member in members[start : start + _SCAN_BATCH]:
                try:
                    session_id, key, turn_id = parse_reservation_member(member)
                    reservation_key = keys.reservation(session_id, key)
                except ValueError:
                    dead.append(member)
                    continue
                checked.append(
                    (member, Call(scripts.idem_expire, [reservation_key], [holder, turn_id]))
                )
            replies = await run_batch(self._client, [call for _, call in checked])
            lowered: list[Any] = []
            for (member, _), reply in zip(checked, replies, strict=True):
                if not int(reply[0]):
                    dead.append(member)
                    continue
                if int(reply[0]) == 1:
                    expired += 1
                lowered.extend((reply[1], member))
            repairs: list[Call] = []
            if lowered:
                repairs.append(Call(None, ["ZADD", keys.stale_index, "LT", *lowered]))
            if dead:
                repairs.append(Call(None, ["SREM", index, *dead]))
            await run_batch(self._client, repairs)
        return expired

    async def find(self, session_id: str, key: str) -> Reservation | None:
        """The reservation, or None when missing or past its primary TTL."""
        reply = await self._scripts.idem_find(keys=[self._keys.reservation(session_id, key)])
        return None if reply is None else _reservation(session_id, key, reply)


# --------------------------------------------------------------------------- event log


class RedisEventLog(_Role):
    """One stream per session, trimmed exactly to `max_len` by the append script, the newest
    dropped id kept as the stream's max-deleted-entry-id; the stream expires `ttl` seconds after
    its last append or delete. Ids are the stream ids (see `EventLog` for cursor rules)."""

    def __init__(
        self, client: Redis, scripts: Scripts, keys: Keys, max_len: int, ttl: float
    ) -> None:
        super().__init__(client, scripts, keys)
        self._max_len = max_len
        self._ttl_ms = _ms(ttl)

    async def append(self, session_id: str, events: Sequence[Event]) -> list[str]:
        """Append frames in order, in one script (trim and expiry included); their ids."""
        if not events:
            return []
        ids = await self._scripts.events_append(
            keys=[self._keys.event_log(session_id)],
            args=[self._max_len, self._ttl_ms, *(encode_event(event) for event in events)],
        )
        return [_text(event_id) for event_id in ids]

    async def read(self, session_id: str, after: str | None, limit: int) -> list[Event]:
        """Up to `limit` frames with ids strictly after `after` (all when None), ids set.

        Raises:
            EventCursorTrimmedError, EventCursorAheadError, InvalidRequestError: see `EventLog`.
        """
        floor = resume_cursor(after)
        cursor = "" if floor is None else f"{floor[0]}-{floor[1]}"
        if limit <= 0:
            return []
        reply = await self._scripts.events_read(
            keys=[self._keys.event_log(session_id)], args=[self._max_len, cursor, limit]
        )
        code = int(reply[0])
        if code == 1:
            raise cursor_trimmed(session_id, cursor, _text(reply[1]) or None, _text(reply[2]))
        if code == 2:
            raise cursor_ahead(session_id, cursor, _text(reply[1]))
        if code == 3:
            raise cursor_trimmed(session_id, cursor, None, None)
        return [
            decode_event(dict(_pairs(fields))[b"f"], _text(event_id))
            for event_id, fields in reply[1]
        ]

    async def delete(self, session_id: str) -> None:
        """Empty the session's stream, kept (with its last id, expiring `ttl` from now) so ids
        never go back and older cursors read as trimmed."""
        await self._scripts.events_delete(
            keys=[self._keys.event_log(session_id)], args=[self._ttl_ms]
        )


def _pairs(flat: Sequence[Any]) -> list[tuple[Any, Any]]:
    """[f1, v1, f2, v2, ...] as [(f1, v1), (f2, v2), ...]."""
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
