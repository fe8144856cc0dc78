"""The hot path: the fused calls of a turn's phases, each one atomic store step (one script on
the session's slot over Redis), beside the one-Protocol-per-role stores they write."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..._events import Event
from ..._types import Priority
from ...wire import Envelope, Outcome, Signal
from ._dead_letters import DeadLetter
from ._idempotency import Reservation
from ._inbox import CollectedBatch
from ._records import StagedCommit


@dataclass(frozen=True, slots=True)
class Finished:
    """What a finish did: the outcome `recorded` (by this call, or by an earlier run of the very
    same call), or refused with the reservation the store holds (`found`, None when missing)."""

    recorded: bool
    found: Reservation | None = None
    #: The event ids of the finish's frames, in order (when recorded with frames).
    event_ids: tuple[str, ...] = ()
    #: The transcript's version once the commit was appended (None: nothing was committed).
    version: int | None = None


@dataclass(frozen=True, slots=True)
class TurnFrames:
    """A turn's last frames (its terminal one last), for its finish to log and publish as one
    relay batch (`batch_id`: see `EventRelayPath.append_and_publish`)."""

    batch_id: str
    frames: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class Forwarding:
    """What a reserve queues for the holder when another live node holds the session: the
    envelope (once per `delivery_id`), its reservation left holderless for `staleness`."""

    envelope: Envelope
    delivery_id: str
    staleness: float


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A reserve that queued its message for `holder` (lease `token`) and rang its doorbell."""

    message_id: str
    holder: str
    token: int


@dataclass(frozen=True, slots=True)
class Reserved:
    """What a reserve did: refused because the session is bound to another agent (`bound`,
    nothing written), or the reservation made (`existing` None) or found (`existing`); made
    and queued for another holder when `forwarded`."""

    bound: str | None = None
    existing: Reservation | None = None
    #: Made while the session's inbox held nothing and nothing was pending under a lease
    #: older than the current one (no collect needs to go before this turn on its holder).
    quiet: bool = False
    forwarded: Forwarded | None = None


class HotPath(Protocol):
    """Fused operations of a turn: what its phases write in several roles, as one step."""

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
        """Start a submit in one atomic step: refuse it when the session is bound to another
        agent than `agent_ref` (nothing written), else `IdempotencyStore.put_if_absent` (the
        reservation keeping `traceparent`, see `Reservation.traceparent`), telling whether
        anything waited in the session's inbox then (`Reserved.quiet`).

        With `forward`, when another live holder's lease is on the session, the new reservation
        is left holderless (stale after `forward.staleness`), the envelope is queued in the
        inbox and a MESSAGE_ENQUEUED doorbell naming the holder goes on the control channel,
        all in the same step (`Reserved.forwarded`). Running the same call again (a retry after
        a lost reply) queues nothing twice and answers the message id queued first."""
        ...

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
        """`Inbox.collect`, and in the same atomic step, when that brings exactly one message
        fresh from the queue, the take-over of its reservation by `taker` if it is IN_FLIGHT
        for that turn, holderless and due (`IdempotencyStore.acquire_holder`'s plain case,
        stale after `secondary_ttl`, the message its pending copy): `taken_attempt` is then the
        attempt taken. The taker calls this when it runs that message next (nothing queued
        before it). Running the same call again answers the same batch."""
        ...

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
        """End a turn in one atomic step: record the outcome (DONE when final, else FAILED)
        and append `commit`'s entries to the session's transcript if the reservation is
        IN_FLIGHT for `outcome.turn_id` and held by `holder` or by nobody (by `holder` at
        `attempt` when given: a stale attempt's answer is refused), keep `dead_letter` (once
        per letter id), acknowledge the message's pending entry (`pending`: lease token and
        message id; dropped only while pending under that token), log and publish `frames` as
        one relay batch from `holder` (their ids in `Finished.event_ids`) and then publish
        `announce` (a control-channel signal) on the control channel.

        So a turn's entries are committed if and only if its outcome is the reservation's.
        Refused (nothing written, nothing published): `pending` is acknowledged unless the
        reservation is still this turn's and unanswered (the turn goes on: another attempt
        runs it, or it was given back to run again from this very copy), and the reservation
        found is returned. Running the same call again (a retry after a lost reply) finds its
        own outcome: recorded, with the frames' ids, nothing written twice and nothing published
        again (the first run did).

        Raises:
            FencedOut: `commit.token` is older than the record's fence, or there is no record
                (nothing written, acknowledged or published).
        """
        ...
