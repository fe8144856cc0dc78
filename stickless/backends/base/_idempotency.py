"""Idempotency reservations: holder, staleness bound and outcome per key."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from ..._trace import TraceContext
from ...wire import Outcome


class ReservationState(enum.StrEnum):
    IN_FLIGHT = "IN_FLIGHT"
    DONE = "DONE"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class Reservation:
    """An idempotency reservation, scoped to (session_id, key)."""

    session_id: str
    key: str
    turn_id: str
    input_hash: str
    holder: str | None
    state: ReservationState
    touched_at: float
    #: True when an IN_FLIGHT reservation is abandoned: held by a holder whose incarnation is
    #: dead (see `Liveness`), or holderless past its staleness bound (store clock).
    stale: bool = False
    outcome: Outcome | None = None
    #: The attempt started last (0: none recorded; a turn run by its submitter is attempt 1
    #: without a write, so a held reservation at 0 runs attempt 1).
    attempt: int = 0
    #: Earlier attempts that did not answer (lost with their holder, or failed and retried).
    history: tuple[AttemptRecord, ...] = ()
    #: True when the message has a durable copy in the session's pending set, so a successor
    #: can run it again.
    durable: bool = False
    #: The W3C traceparent of the submit that made it ('' for none): a node that ends the turn
    #: for a lost holder names the turn's trace in its frames.
    traceparent: str = ""

    @property
    def trace(self) -> TraceContext | None:
        """The submit's trace context, or None (none recorded, or unreadable)."""
        return TraceContext.lenient(self.traceparent)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt of a turn that did not answer: lost with its holder, or failed and retried."""

    attempt: int
    node: str
    error: str
    #: Store clock seconds when the attempt was given up.
    at: float


@dataclass(frozen=True, slots=True)
class Takeover:
    """The answer of `acquire_holder`: won (the attempt this holder runs), come back later, or
    rejected (neither)."""

    #: The attempt this holder now runs (0: not won).
    attempt: int = 0
    #: Not won yet: ask again after this many seconds (a retry's backoff is not over, or the
    #: holder of the running attempt may still answer).
    wait: float = 0.0
    #: The wait is for a holder's running attempt (not a retry's backoff).
    held: bool = False
    #: Won from a holder that stopped answering: the attempt that holder lost (0: none), and
    #: that holder.
    lost: int = 0
    lost_by: str = ""

    @property
    def won(self) -> bool:
        return self.attempt > 0


#: The take-over that neither won nor may be asked again.
REJECTED = Takeover()


class IdempotencyStore(Protocol):
    """Per-session idempotency reservations with a holder, a staleness rule and an outcome.

    A held IN_FLIGHT reservation lives as long as its holder's incarnation (taken when the
    holder reserved or took it over; see `Liveness`), with no touch; a holderless one goes stale
    past its bound (`secondary_ttl`, `forward_ttl`)."""

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
        """Reserve the key (IN_FLIGHT, held by `holder`); None when created, else the existing
        reservation. A FAILED one of another turn, or one past the primary TTL, counts as absent
        and is replaced. The same call made again (same turn and holder) finds its own
        reservation: None while IN_FLIGHT, the reservation once it was answered (a FAILED turn is
        never reserved again)."""
        ...

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
        """Take over a holderless IN_FLIGHT reservation made for `turn_id` as its next attempt
        (REJECTED otherwise, e.g. when a newer turn with the same key owns it); raising means
        the answer is unknown. One `holder` already holding it wins the same attempt again, so
        the call may be retried. A retry whose backoff is not over answers `wait`.

        `message_id` names the message's durable copy in the pending set (recorded, so a later
        holder may run it again). With `steal_below` > 0, a reservation of this turn held by
        another node whose attempt is below it and which has a durable copy is taken from that
        holder once it is stale (`lost` names the attempt it lost), and answers `wait` until
        then."""
        ...

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
        """Give a lost attempt's turn back for a next attempt: if IN_FLIGHT for `turn_id`, held
        by `holder`, with a durable copy and its attempt below `max_attempts`, make it
        holderless (stale after `forward_ttl`, with the attempt in its history) and return the
        attempt lost; 0 otherwise. The same call made again returns the same attempt."""
        ...

    async def hold(
        self, session_id: str, key: str, turn_id: str, holder: str, token: int, envelope: bytes
    ) -> str | None:
        """Keep a durable copy of a turn its submitter runs (IN_FLIGHT for `turn_id`, held by
        `holder`) in the session's pending set under lease `token`, so a successor can run it
        again; its message id, or None when the reservation is not so held."""
        ...

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
        """Schedule the next attempt of a failed one as one step: if IN_FLIGHT for `turn_id`,
        held by `holder` at `attempt`, record the attempt in the history, make the reservation
        holderless and not to be taken over for `delay` seconds (stale `forward_ttl` after
        that), and keep the message in the pending set under `token`; its message id, or None
        when refused. The same call made again returns the same id."""
        ...

    async def release_holder(
        self, session_id: str, key: str, holder: str, forward_ttl: float
    ) -> bool:
        """Make a reservation held by `holder` holderless; stale only after `forward_ttl`."""
        ...

    async def compare_and_reset(
        self,
        session_id: str,
        key: str,
        expected_holder: str | None,
        outcome: Outcome,
        *,
        unstarted_only: bool = False,
    ) -> bool:
        """If IN_FLIGHT for `outcome.turn_id` and held by `expected_holder` (with
        `unstarted_only`, and no attempt of it started: a "not run" answer), mark it FAILED with
        `outcome`; exactly one of several concurrent callers wins, and a newer attempt under the
        same key is never reset by a decision about an older one."""
        ...

    async def discard_reservation(self, session_id: str, key: str, turn_id: str) -> bool:
        """Remove an IN_FLIGHT reservation made for `turn_id` that no holder has taken over (no
        attempt and no history: a refused submit, an unreadable entry); one a holder took is
        kept, since a retry of the refused submit would otherwise run its turn again."""
        ...

    async def find_stale_in_flight(self, limit: int) -> list[Reservation]:
        """Stale IN_FLIGHT reservations: held by a dead incarnation, or holderless past their
        bound (store clock); a held one is found at once only after `expire_holder`."""
        ...

    async def expire_holder(self, holder: str) -> int:
        """Make every IN_FLIGHT reservation held by a dead incarnation of `holder` due for
        `find_stale_in_flight` now; count them (a live incarnation's are left alone)."""
        ...

    async def find(self, session_id: str, key: str) -> Reservation | None: ...

    async def find_turn(self, session_id: str, turn_id: str) -> Reservation | None:
        """The reservation made for `turn_id` (whichever key it is under), found through the
        session's turn index written with it; None when the turn was never reserved, its
        reservation expired or was discarded, or a newer turn took its key."""
        ...
