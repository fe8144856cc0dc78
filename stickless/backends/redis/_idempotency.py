"""The Redis idempotency store: reservations, their outcomes and the cluster-wide indexes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from ...wire import (
    Outcome,
    unpack,
)
from ..base import (
    HOLDER_INDEX_TTL,
    REJECTED,
    AttemptRecord,
    Reservation,
    ReservationState,
    Takeover,
)
from ._keys import Keys, parse_reservation_member, reservation_member
from ._role import _SCAN_BATCH, _SCAN_ROUNDS, _ms, _num, _Role, _text
from ._scripts import Call, Scripts, run_batch

#: Seconds until the stale index checks a live holder's reservation again (a backstop: the
#: dead-holder sweep finds a dead incarnation's reservations through the holder index).
_HELD_RECHECK = 60.0
#: Arguments of the `idem_put` script's forward (ARGV 10 to 16; the traceparent is ARGV 17).
_FORWARD_ARGS = 7

# --------------------------------------------------------------------------- idempotency


def _reservation(session_id: str, key: str, reply: Sequence[Any]) -> Reservation:
    """The public value of a reservation reply (see `reservation_reply` in the Lua prelude)."""
    turn, input_hash, has_holder, holder, state, touched, stale, outcome = reply[:8]
    attempt, history, pending = reply[9:12]
    traceparent = _text(reply[12]) if len(reply) > 12 else ""
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
        attempt=int(attempt),
        history=_history(history),
        durable=bool(pending),
        traceparent=traceparent,
    )


def _history(packed: Any) -> tuple[AttemptRecord, ...]:
    """The attempt history of a reservation reply (packed [attempt, node, reason, at] lists)."""
    if not packed:
        return ()
    return tuple(
        AttemptRecord(int(attempt), _text(node), _text(reason), float(_text(at)))
        for attempt, node, reason, at in unpack(bytes(packed))
    )


class RedisIdempotencyStore(_Role):
    """One hash per (session, key) with a primary-TTL expiry, plus the stale IN_FLIGHT index and
    a per-holder index.

    A held reservation records its holder's incarnation and is stale once that incarnation is
    dead (see `RedisLiveness`): nothing touches it while its holder lives.

    The stale index member names one reservation instance (session, key, turn) and scores a
    lower bound of when it may be stale: creation writes it, whatever moves that earlier
    lowers it, and `find_stale_in_flight` rescores what it verifies (a live holder's instance
    to `_HELD_RECHECK` later: for a held one the index is only the backstop of the holder
    index below).

    The holder index (`Keys.holder_reservations`, same members) lists the instances a holder
    may hold IN_FLIGHT, for `expire_holder`, which the dead-holder sweep runs on a dead
    incarnation's holder. Its writes ride in the pipeline of the stale-index command each
    operation already sends after its script, so no round trip is added: creation and
    `acquire_holder` add, `release_holder`, `HotPath.finish`, `compare_and_reset` and
    `discard_reservation` remove. It is a superset kept honest by `expire_holder`, which checks
    each member against its hash and drops dead ones. The holder's liveness renewals keep it
    alive; it expires `HOLDER_INDEX_TTL` after the last one.

    A message that may run again has a durable copy in the session's pending set (same slot),
    written by `hold` or `schedule_retry` under the inbox's pending TTL.
    """

    def __init__(self, client: Redis, scripts: Scripts, keys: Keys, pending_ttl: float) -> None:
        super().__init__(client, scripts, keys)
        self._pending_ttl = pending_ttl

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
        """Reserve the key unless an IN_FLIGHT or DONE reservation exists (then return it);
        one script, its index entries included (see `put`)."""
        reply = await self.put(
            session_id, key, turn_id, input_hash, holder, secondary_ttl, primary_ttl, None
        )
        return None if int(reply[0]) == 1 else _reservation(session_id, key, reply[1])

    async def put(
        self,
        session_id: str,
        key: str,
        turn_id: str,
        input_hash: str,
        holder: str,
        secondary_ttl: float,
        primary_ttl: float,
        agent_ref: str | None,
        forward: Sequence[str | bytes] = (),
        traceparent: str = "",
    ) -> list[Any]:
        """The `idem_put` script's reply: the reservation made (and whether the inbox was quiet),
        or the one found, or (with `agent_ref`) the other agent the session is bound to; one
        command. The index entries are written in it when the reservation is this call's (the
        stale index's due at once: the first scan verifies and rescores it). `forward`: the
        delivery key, then the script's forward arguments (see `RedisHotPath.reserve`)."""
        keys = self._keys
        delivery = str(forward[0]) if forward else keys.delivery(session_id, "-")
        # The forward's seven arguments ('' when there is none), then the traceparent.
        forward_args = list(forward[1:]) if forward else [""] * _FORWARD_ARGS
        reply: list[Any] = await self._scripts.idem_put(
            keys=[
                keys.reservation(session_id, key),
                keys.record(session_id),
                keys.stale_index,
                keys.holder_reservations(holder),
                *keys.inbox(session_id),
                keys.pending(session_id)[0],
                keys.lease(session_id),
                delivery,
                keys.pending_index,
                keys.turn_index(session_id, turn_id),
            ],
            args=[
                turn_id,
                input_hash,
                holder,
                _num(secondary_ttl),
                _num(primary_ttl),
                reservation_member(session_id, key, turn_id),
                _ms(HOLDER_INDEX_TTL),
                agent_ref or "",
                key,
                *forward_args,
                traceparent,
            ],
        )
        return reply

    async def acquire_holder(
        self,
        session_id: str,
        key: str,
        turn_id: str,
        holder: str,
        secondary_ttl: float,
        *,
        message_id: str | None = None,
        steal_below: int = 0,
    ) -> Takeover:
        """The next attempt when the reservation was IN_FLIGHT, holderless and for `turn_id` (or
        a stale holder's under `steal_below`); `wait` while it may be taken later; else
        REJECTED.

        One command: the script also makes the index entry due at once and adds it to the
        taker's index (see `idem_acquire.lua`).
        """
        keys = self._keys
        reply = await self._scripts.idem_acquire(
            keys=[
                keys.reservation(session_id, key),
                keys.pending(session_id)[0],
                keys.stale_index,
                keys.holder_reservations(holder),
            ],
            args=[
                holder,
                _num(secondary_ttl),
                turn_id,
                message_id or "",
                steal_below,
                reservation_member(session_id, key, turn_id),
                _ms(HOLDER_INDEX_TTL),
            ],
        )
        if int(reply[0]):
            return Takeover(attempt=int(reply[0]), lost=int(reply[3]), lost_by=_text(reply[4]))
        if len(reply) > 1:
            return Takeover(wait=float(reply[1]), held=len(reply) > 2)
        return REJECTED

    async def requeue_lost(
        self,
        session_id: str,
        key: str,
        turn_id: str,
        holder: str,
        reason: str,
        max_attempts: int,
        forward_ttl: float,
    ) -> int:
        """Make a lost attempt's reservation holderless for a next attempt (one script; the
        holder-index removal follows only when it happened)."""
        reply = await self._scripts.idem_requeue(
            keys=[self._keys.reservation(session_id, key), self._keys.pending(session_id)[0]],
            args=[turn_id, holder, reason, max_attempts, _num(forward_ttl)],
        )
        if not int(reply[0]):
            return 0
        member = reservation_member(session_id, key, turn_id)
        await self._client.srem(self._keys.holder_reservations(holder), member)
        return int(reply[0])

    async def hold(
        self, session_id: str, key: str, turn_id: str, holder: str, token: int, envelope: bytes
    ) -> str | None:
        """Keep the turn's message pending under `token` (see `_park`)."""
        return await self._park("hold", session_id, key, turn_id, holder, token, envelope)

    async def schedule_retry(
        self,
        session_id: str,
        key: str,
        turn_id: str,
        holder: str,
        token: int,
        envelope: bytes,
        attempt: int,
        reason: str,
        delay: float,
        forward_ttl: float,
    ) -> str | None:
        """Record the failed attempt and keep the message pending for its next one, not taken
        over before `delay` (see `_park`)."""
        return await self._park(
            "retry",
            session_id,
            key,
            turn_id,
            holder,
            token,
            envelope,
            attempt,
            reason,
            delay,
            forward_ttl,
        )

    async def _park(
        self,
        mode: str,
        session_id: str,
        key: str,
        turn_id: str,
        holder: str,
        token: int,
        envelope: bytes,
        attempt: int = 0,
        reason: str = "",
        delay: float = 0.0,
        forward_ttl: float = 0.0,
    ) -> str | None:
        """One script writes the pending copy (and, for a retry, the reservation's new state);
        the pending-sessions index entry rides in its pipeline (NX: an older one is kept), so
        the orphan scan finds the message should this holder die. A retry's holder-index entry
        is dropped with it."""
        keys = self._keys
        member = reservation_member(session_id, key, turn_id)
        calls = [
            Call(
                self._scripts.idem_park,
                [keys.reservation(session_id, key), *keys.pending(session_id)],
                [
                    mode,
                    turn_id,
                    holder,
                    token,
                    envelope,
                    attempt,
                    reason,
                    _num(delay),
                    _num(forward_ttl),
                    _ms(self._pending_ttl),
                ],
            ),
            Call(None, ["ZADD", keys.pending_index, "NX", "0", session_id]),
        ]
        if mode == "retry":
            calls.append(Call(None, ["SREM", keys.holder_reservations(holder), member]))
        reply, *_ = await run_batch(self._client, calls)
        if reply[0] == 0:
            return None
        return _text(reply[0])

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

    async def compare_and_reset(
        self,
        session_id: str,
        key: str,
        expected_holder: str | None,
        outcome: Outcome,
        *,
        unstarted_only: bool = False,
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
                "1" if unstarted_only else "0",
            ],
        )
        if not int(reply[0]):
            return False
        await self._unindex(session_id, key, _text(reply[1]), expected_holder)
        return True

    async def discard_reservation(self, session_id: str, key: str, turn_id: str) -> bool:
        """Delete an IN_FLIGHT reservation made for `turn_id` that no holder took over."""
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
            server_now, _, hits = await scripts.index_due(
                keys=[keys.stale_index], args=["0", offset, _SCAN_BATCH]
            )
            recheck = _num(float(server_now) + _HELD_RECHECK)
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
                    later = reply[8] if view.holder is None else recheck
                    repairs.append(
                        Call(scripts.index_rescore, [keys.stale_index], [member, score, later])
                    )
            # Entries a repair could not move are still in range: skip them next round.
            offset = len(found) + sum(not done for done in await run_batch(self._client, repairs))
            if len(found) >= limit or len(candidates) < _SCAN_BATCH:
                break
        ordered = sorted(found.values(), key=lambda item: item[0])
        return [reservation for _, reservation in ordered[:limit]]

    async def expire_holder(self, holder: str) -> int:
        """Make the stale-index entry of each IN_FLIGHT reservation held by a dead incarnation
        of `holder` due now (server clock); return how many.

        Round trips: one to read the holder index, then two per `_SCAN_BATCH` members: the
        verifying scripts, then one pipeline lowering the stale-index scores (so the sweep sees
        them at once) and dropping dead members from the holder index.
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
                elif int(reply[0]) == 1:
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

    async def find_turn(self, session_id: str, turn_id: str) -> Reservation | None:
        """The reservation made for `turn_id`, through the turn's index string (two commands:
        a turn's key never changes, so nothing can come between them that matters)."""
        key = await self._client.get(self._keys.turn_index(session_id, turn_id))
        if key is None:
            return None
        found = await self.find(session_id, _text(key))
        return found if found is not None and found.turn_id == turn_id else None
