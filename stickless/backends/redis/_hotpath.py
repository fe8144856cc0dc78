"""The Redis hot path: each fused call of a turn is one script, its index upkeep included (the
bundle needs one Redis server, not a Redis Cluster: see `_keys`)."""

from __future__ import annotations

from ..._types import Priority
from ...wire import EVENT_CHANNEL_KINDS, Outcome, Signal, encode_event, event_batch_parts, pack
from ..base import (
    CollectedBatch,
    DeadLetter,
    FencedOut,
    Finished,
    Forwarded,
    Forwarding,
    ReservationState,
    Reserved,
    StagedCommit,
    TurnFrames,
    check_batch_id,
    check_letter,
    pack_letter,
)
from ._eventlog import RedisEventLog
from ._idempotency import RedisIdempotencyStore, _reservation
from ._inbox import DELIVERY_MEMORY, RedisInbox
from ._keys import TIERS, reservation_member
from ._role import _ms, _num, _Role, _text


class RedisHotPath(_Role):
    """`HotPath` over Redis: a submit's reserve (`idem_put.lua`) and a turn's finish
    (`turn_finish.lua`) are one command each."""

    def __init__(
        self, idempotency: RedisIdempotencyStore, events: RedisEventLog, inbox: RedisInbox
    ) -> None:
        super().__init__(idempotency._client, idempotency._scripts, idempotency._keys)
        self._idempotency = idempotency
        self._events = events
        self._inbox = inbox

    async def reserve(
        self,
        session_id: str,
        key: str,
        turn_id: str,
        input_hash: str,
        holder: str,
        agent_ref: str,
        secondary_ttl: float,
        primary_ttl: float,
        forward: Forwarding | None = None,
        traceparent: str = "",
    ) -> Reserved:
        """The binding check and the reservation in one script, and with `forward` the queueing
        and the doorbell too (see `HotPath.reserve`)."""
        queued: list[str | bytes] = []
        priority = 0
        if forward is not None:
            envelope = forward.envelope
            priority = int(envelope.priority)
            queued = [
                self._keys.delivery(session_id, forward.delivery_id),
                envelope.encode(),
                str(TIERS.index(envelope.priority)),
                str(DELIVERY_MEMORY),
                str(_ms(self._inbox.ttl)),
                _num(forward.staleness),
                self._keys.control_channel,
                session_id,
            ]
        reply = await self._idempotency.put(
            session_id,
            key,
            turn_id,
            input_hash,
            holder,
            secondary_ttl,
            primary_ttl,
            agent_ref,
            queued,
            traceparent,
        )
        verdict = int(reply[0])
        if verdict == 4:
            message_id = f"{priority}:{_text(reply[1])}"
            return Reserved(forwarded=Forwarded(message_id, _text(reply[2]), int(reply[3])))
        if verdict == 3:
            return Reserved(bound=_text(reply[1]))
        if verdict == 1:
            return Reserved(quiet=bool(int(reply[2])))
        return Reserved(existing=_reservation(session_id, key, reply[1]))

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
        """The collect and a lone fresh message's take-over in one script (`inbox_take.lua`;
        see `HotPath.take`)."""
        return await self._inbox.take(
            session_id, max_priority, token, taker, secondary_ttl, reclaim_own=reclaim_own
        )

    async def finish(
        self,
        session_id: str,
        key: str,
        holder: str,
        outcome: Outcome,
        primary_ttl: float,
        commit: StagedCommit | None = None,
        attempt: int | None = None,
        dead_letter: DeadLetter | None = None,
        *,
        pending: tuple[int, str] | None = None,
        announce: Signal | None = None,
        frames: TurnFrames | None = None,
    ) -> Finished:
        """Record, acknowledge, log the last frames and announce in one script (see
        `HotPath.finish`).

        One round trip, one command: the script also drops the instance from the stale and
        holder indexes (and adds a new letter's id to the dead-letter index); when it refuses
        (the instance is someone else's or already finished) it makes the stale-index entry due
        instead, for the scan to verify. The announcement is published by the script itself
        (PUBLISH runs inside a script), as the very bytes the signal bus sends, so subscribers
        cannot tell the difference.
        """
        state = ReservationState.DONE if outcome.final else ReservationState.FAILED
        keys = self._keys
        member = reservation_member(session_id, key, outcome.turn_id)
        staged: list[str | bytes] = ["", "0"]
        if commit is not None:
            entries = [pack(e.model_dump(mode="python")) for e in commit.committed(outcome.turn_id)]
            staged = [str(commit.token), str(len(entries)), *entries]
        relayed: list[str | bytes | int] = ["0"]
        if frames is not None and frames.frames:
            check_batch_id(frames.batch_id)
            head, middle = event_batch_parts(session_id, holder, len(frames.frames))
            relayed = [
                str(len(frames.frames)),
                *self._events.relay_args(session_id, frames.batch_id),
                head,
                middle,
                *(encode_event(frame) for frame in frames.frames),
            ]
        letter: list[str | bytes] = ["", ""]
        if dead_letter is not None:
            check_letter(dead_letter)
            # (its index member at 0 is settled by the next listing: see RedisDeadLetterStore)
            letter = [dead_letter.letter_id, pack_letter(dead_letter)]
        ack: list[str | bytes] = ["", ""] if pending is None else [str(pending[0]), pending[1]]
        publish: list[str | bytes] = ["", ""]
        if announce is not None:
            if announce.kind in EVENT_CHANNEL_KINDS:
                raise ValueError(f"{announce.kind} signals do not go on the control channel")
            publish = [keys.control_channel, announce.encode()]
        reply = await self._scripts.turn_finish(
            keys=[
                keys.reservation(session_id, key),
                keys.record(session_id),
                keys.transcript(session_id),
                keys.dead_letters(session_id),
                *keys.pending(session_id),
                keys.stale_index,
                keys.holder_reservations(holder),
                keys.dead_index,
                keys.event_log(session_id),
                keys.relay_batches(session_id),
            ],
            args=[
                holder,
                outcome.turn_id,
                state.value,
                outcome.encode(),
                _num(primary_ttl),
                "" if attempt is None else attempt,
                *letter,
                *ack,
                *publish,
                member,
                *staged,
                *relayed,
            ],
        )
        result = int(reply[0])
        if result == 1:
            version = _text(reply[1])
            return Finished(
                recorded=True,
                event_ids=tuple(_text(i) for i in reply[2:]),
                version=int(version) if version else None,
            )
        if result == 2:
            fence = _text(reply[1])
            if not fence:
                raise FencedOut(f"session {session_id} has no record")
            raise FencedOut(f"token {commit and commit.token} is older than fence {fence}")
        found = _reservation(session_id, key, reply[1]) if len(reply) > 1 else None
        return Finished(recorded=False, found=found)
