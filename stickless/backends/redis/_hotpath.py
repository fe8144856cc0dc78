"""The Redis hot path: each fused call of a turn is one script on the session's slot, with the
cluster-wide index upkeep (which no slot script may touch) in the same pipeline."""

from __future__ import annotations

from ...wire import EVENT_CHANNEL_KINDS, Outcome, Signal, pack
from ..base import (
    DeadLetter,
    FencedOut,
    Finished,
    ReservationState,
    StagedCommit,
    check_letter,
    pack_letter,
)
from ._idempotency import _reservation
from ._keys import reservation_member
from ._role import _num, _Role, _text
from ._scripts import Call, run_batch


class RedisHotPath(_Role):
    """`HotPath` over Redis: a turn's finish is one round trip (`turn_finish.lua`)."""

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
    ) -> Finished:
        """Record, acknowledge and announce in one script (see `HotPath.finish`).

        One round trip: the stale- and holder-index removals (and a new letter's index entry)
        ride in the script's pipeline; when the script refuses (the instance is someone else's
        or already finished) the stale-index entry is put back as due, for the scan to verify.
        The announcement is published by the script itself (PUBLISH runs inside a script), as
        the very bytes the signal bus sends, so subscribers cannot tell the difference.
        """
        state = ReservationState.DONE if outcome.final else ReservationState.FAILED
        keys = self._keys
        member = reservation_member(session_id, key, outcome.turn_id)
        staged: list[str | bytes] = [""]
        if commit is not None:
            entries = commit.committed(outcome.turn_id)
            staged = [str(commit.token), *(pack(e.model_dump(mode="python")) for e in entries)]
        letter: list[str | bytes] = ["", ""]
        calls = [
            Call(None, ["ZREM", keys.stale_index, member]),
            Call(None, ["SREM", keys.holder_reservations(holder), member]),
        ]
        if dead_letter is not None:
            check_letter(dead_letter)
            letter = [dead_letter.letter_id, pack_letter(dead_letter)]
            # (an index member at 0 is settled by the next listing: see RedisDeadLetterStore)
            calls.append(Call(None, ["ZADD", keys.dead_index, "NX", "0", dead_letter.letter_id]))
        ack: list[str | bytes] = ["", ""] if pending is None else [str(pending[0]), pending[1]]
        publish: list[str | bytes] = ["", ""]
        if announce is not None:
            if announce.kind in EVENT_CHANNEL_KINDS:
                raise ValueError(f"{announce.kind} signals do not go on the control channel")
            publish = [keys.control_channel, announce.encode()]
        reply, *_ = await run_batch(
            self._client,
            [
                Call(
                    self._scripts.turn_finish,
                    [
                        keys.reservation(session_id, key),
                        keys.record(session_id),
                        keys.transcript(session_id),
                        keys.dead_letters(session_id),
                        *keys.pending(session_id),
                    ],
                    [
                        holder,
                        outcome.turn_id,
                        state.value,
                        outcome.encode(),
                        _num(primary_ttl),
                        "" if attempt is None else attempt,
                        *letter,
                        *ack,
                        *publish,
                        *staged,
                    ],
                ),
                *calls,
            ],
        )
        result = int(reply[0])
        if result == 1:
            return Finished(recorded=True)
        await self._client.zadd(keys.stale_index, {member: 0})
        if result == 2:
            fence = _text(reply[1])
            if not fence:
                raise FencedOut(f"session {session_id} has no record")
            raise FencedOut(f"token {commit and commit.token} is older than fence {fence}")
        found = _reservation(session_id, key, reply[1]) if len(reply) > 1 else None
        return Finished(recorded=False, found=found)
