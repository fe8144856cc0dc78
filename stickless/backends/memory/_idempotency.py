"""In-memory idempotency reservations: holder, staleness, attempts and outcome per key."""

from __future__ import annotations

from ...wire import Outcome
from ..base import (
    REJECTED,
    AttemptRecord,
    Reservation,
    ReservationState,
    Takeover,
)
from ._shared import InboxRow, Link, ReservationRow, State, holder_alive, incarnation_of, live_until


def _live_reservation(state: State, session_id: str, key: str, now: float) -> ReservationRow | None:
    """The reservation unless past its primary TTL (then dropped, as a key TTL would)."""
    row = state.reservations.get((session_id, key))
    if row is not None and row.expires_at <= now:
        del state.reservations[(session_id, key)]
        return None
    return row


def _held_by(row: ReservationRow, holder: str | None) -> bool:
    """True when the reservation is IN_FLIGHT and held by `holder` (None: holderless)."""
    return row.state is ReservationState.IN_FLIGHT and row.holder == holder


def _is_stale(state: State, row: ReservationRow, now: float) -> bool:
    """True when an IN_FLIGHT reservation is abandoned: held by a dead incarnation, or
    holderless past its bound."""
    if row.state is not ReservationState.IN_FLIGHT:
        return False
    if row.holder is not None:
        return not holder_alive(state, row.holder, row.incarnation, now)
    return now > row.stale_at


def _view(
    state: State, session_id: str, key: str, row: ReservationRow, now: float
) -> Reservation:
    """The public value of a stored reservation, outcome decoded, staleness by the store clock."""
    return Reservation(
        session_id=session_id,
        key=key,
        turn_id=row.turn_id,
        input_hash=row.input_hash,
        holder=row.holder,
        state=row.state,
        touched_at=row.touched_at,
        stale=_is_stale(state, row, now),
        outcome=None if row.outcome is None else Outcome.decode(row.outcome),
        attempt=row.attempt,
        history=tuple(row.history),
        durable=row.pending is not None,
        traceparent=row.traceparent,
    )


def _may_steal(state: State, session_id: str, row: ReservationRow, below: int) -> bool:
    """True when a held attempt below `below` may be run again: its message is still pending."""
    if max(row.attempt, 1) >= below or row.pending is None:
        return False
    return any(row.pending in rows for rows in state.pending.get(session_id, {}).values())


def _give_up_attempt(row: ReservationRow, reason: str, now: float, how: str) -> int:
    """Record the held attempt in the history as given up, and how ("lost" or "retry": a rerun
    of one call must not take the other's write for its own); its number."""
    row.attempt = max(row.attempt, 1)
    row.history.append(AttemptRecord(row.attempt, row.holder or "", reason, now))
    row.given = how
    return row.attempt


def _keep_pending(
    state: State,
    session_id: str,
    row: ReservationRow,
    token: int,
    envelope: bytes,
    now: float,
    turn_id: str,
) -> str:
    """Put the message under `token` in the pending set (its recorded copy, else a new one)."""
    by_token = state.pending.setdefault(session_id, {})
    message_id = row.pending or f"held:{turn_id}"
    for rows in by_token.values():
        rows.pop(message_id, None)
    by_token.setdefault(token, {})[message_id] = InboxRow(message_id, now, envelope, now)
    for older in [t for t, rows in by_token.items() if not rows]:
        del by_token[older]
    return message_id


def put_locked(
    state: State,
    session_id: str,
    key: str,
    turn_id: str,
    input_hash: str,
    holder: str,
    secondary_ttl: float,
    primary_ttl: float,
    traceparent: str = "",
) -> Reservation | None:
    """`put_if_absent` with the state lock held (the hot path's reserve shares it)."""
    now = state.clock()
    row = _live_reservation(state, session_id, key, now)
    if row is not None and row.turn_id == turn_id and _held_by(row, holder):
        return None
    # FAILED is free for a new turn, never for its own (a rerun after it was declared
    # lost must not bring it back).
    if row is not None and (
        row.state is not ReservationState.FAILED or row.turn_id == turn_id
    ):
        return _view(state, session_id, key, row, now)
    state.reservations[(session_id, key)] = ReservationRow(
        turn_id=turn_id,
        input_hash=input_hash,
        holder=holder,
        incarnation=incarnation_of(state, holder, now),
        state=ReservationState.IN_FLIGHT,
        touched_at=now,
        stale_at=now + secondary_ttl,
        expires_at=now + primary_ttl,
        traceparent=traceparent,
    )
    state.turn_keys[(session_id, turn_id)] = (key, now + primary_ttl)
    return None


class MemoryIdempotencyStore:
    """Reservations per (session, key) with holder, staleness deadline and encoded outcome."""

    def __init__(self, link: Link) -> None:
        self._link = link

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
        """Reserve the key unless an IN_FLIGHT or DONE reservation exists (then return it); the
        same call made again finds its own reservation and succeeds."""
        with self._link.open() as state:
            return put_locked(
                state, session_id, key, turn_id, input_hash, holder, secondary_ttl, primary_ttl
            )

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
        """The next attempt when the reservation is IN_FLIGHT for `turn_id` and holderless (the
        current one when already held by `holder`: the same call made again), a stale holder's
        under `steal_below`, `wait` while a retry's backoff or a live holder's attempt lasts."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or row.turn_id != turn_id:
                return REJECTED
            lost, lost_by = 0, ""
            if _held_by(row, holder) and not _is_stale(state, row, now):
                return Takeover(attempt=max(row.attempt, 1))
            if _held_by(row, None):
                if row.due_at > now:
                    return Takeover(wait=row.due_at - now)
            elif row.state is ReservationState.IN_FLIGHT and _may_steal(
                state, session_id, row, steal_below
            ):
                if not _is_stale(state, row, now):
                    wait = max(live_until(state, row.holder or "", now) - now, 0.001)
                    return Takeover(wait=wait, held=True)
                lost = _give_up_attempt(row, "holder stopped answering", now, "lost")
                lost_by = row.holder or ""
            else:
                return REJECTED
            row.attempt += 1
            row.holder = holder
            row.incarnation = incarnation_of(state, holder, now)
            row.pending = message_id or row.pending
            row.due_at = 0.0
            row.touched_at = now
            row.stale_at = now + secondary_ttl
            return Takeover(attempt=row.attempt, lost=lost, lost_by=lost_by)

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
        """Make a lost attempt's reservation holderless for a next attempt (see the protocol)."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or row.turn_id != turn_id:
                return 0
            last = row.history[-1] if row.history else None
            rerun = last is not None and (last.node, row.given) == (holder, "lost")
            if _held_by(row, None) and last is not None and rerun:
                return last.attempt  # the same call made again
            if not (_held_by(row, holder) and _may_steal(state, session_id, row, max_attempts)):
                return 0
            lost = _give_up_attempt(row, reason, now, "lost")
            row.holder = None
            row.incarnation = ""
            row.touched_at = now
            row.stale_at = now + forward_ttl
            return lost

    async def hold(
        self, session_id: str, key: str, turn_id: str, holder: str, token: int, envelope: bytes
    ) -> str | None:
        """Keep the turn's message pending under `token` (see the protocol)."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or row.turn_id != turn_id or not _held_by(row, holder):
                return None
            row.pending = _keep_pending(state, session_id, row, token, envelope, now, turn_id)
            return row.pending

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
        """Record the failed attempt, make the reservation holderless until `delay` has passed
        and keep the message pending under `token` (see the protocol)."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or row.turn_id != turn_id:
                return None
            last = row.history[-1] if row.history else None
            if (
                _held_by(row, None)
                and last is not None
                and (last.attempt, last.node, row.given) == (attempt, holder, "retry")
            ):
                return row.pending  # the same call made again
            if not _held_by(row, holder) or max(row.attempt, 1) != attempt:
                return None
            row.pending = _keep_pending(state, session_id, row, token, envelope, now, turn_id)
            _give_up_attempt(row, reason, now, "retry")
            row.holder = None
            row.incarnation = ""
            row.due_at = now + delay
            row.touched_at = now
            row.stale_at = row.due_at + forward_ttl
            return row.pending

    async def release_holder(
        self, session_id: str, key: str, holder: str, forward_ttl: float
    ) -> bool:
        """Make an IN_FLIGHT reservation held by `holder` holderless, stale after `forward_ttl`."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or not _held_by(row, holder):
                return False
            row.holder = None
            row.incarnation = ""
            row.touched_at = now
            row.stale_at = now + forward_ttl
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
        data = outcome.encode()
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            if row is None or row.turn_id != outcome.turn_id:
                return False
            if row.state is not ReservationState.IN_FLIGHT:
                return row.outcome == data  # the same call made again: it still won
            if not _held_by(row, expected_holder):
                return False
            if unstarted_only and (row.attempt or row.history):
                return False
            row.state = ReservationState.DONE if outcome.final else ReservationState.FAILED
            row.outcome = data
            row.touched_at = now
            return True

    async def discard_reservation(self, session_id: str, key: str, turn_id: str) -> bool:
        """Delete an IN_FLIGHT reservation made for `turn_id` that no holder took over."""
        with self._link.open() as state:
            row = _live_reservation(state, session_id, key, state.clock())
            if row is None or row.state is not ReservationState.IN_FLIGHT or row.turn_id != turn_id:
                return False
            if row.attempt > 0 or row.history:
                return False  # a holder may be running it: a retry must follow it, not rerun it
            del state.reservations[(session_id, key)]
            return True

    async def find_stale_in_flight(self, limit: int) -> list[Reservation]:
        """Up to `limit` stale IN_FLIGHT reservations, oldest staleness bound first."""
        with self._link.open() as state:
            now = state.clock()
            stale: list[tuple[float, Reservation]] = []
            for (session_id, key), row in list(state.reservations.items()):
                if not _is_stale(state, row, now):
                    continue
                if _live_reservation(state, session_id, key, now) is not None:
                    stale.append((row.stale_at, _view(state, session_id, key, row, now)))
        stale.sort(key=lambda item: item[0])
        return [reservation for _, reservation in stale[: max(limit, 0)]]

    async def expire_holder(self, holder: str) -> int:
        """Count the IN_FLIGHT reservations held by a dead incarnation of `holder` (here every
        stale one is found at once: there is no index to make them due in)."""
        with self._link.open() as state:
            now = state.clock()
            return sum(
                1
                for session_id, key in list(state.reservations)
                if (row := _live_reservation(state, session_id, key, now)) is not None
                and _held_by(row, holder)
                and _is_stale(state, row, now)
            )

    async def find(self, session_id: str, key: str) -> Reservation | None:
        """The reservation, or None when missing or past its primary TTL."""
        with self._link.open() as state:
            now = state.clock()
            row = _live_reservation(state, session_id, key, now)
            return None if row is None else _view(state, session_id, key, row, now)

    async def find_turn(self, session_id: str, turn_id: str) -> Reservation | None:
        """The reservation made for `turn_id`, through the turn index (an expired entry is
        dropped, as a key TTL would)."""
        with self._link.open() as state:
            now = state.clock()
            entry = state.turn_keys.get((session_id, turn_id))
            if entry is None:
                return None
            key, expires_at = entry
            if expires_at <= now:
                del state.turn_keys[(session_id, turn_id)]
                return None
            row = _live_reservation(state, session_id, key, now)
            if row is None or row.turn_id != turn_id:
                return None
            return _view(state, session_id, key, row, now)


# --------------------------------------------------------------------------- event log
