"""Dead letters as the router offers them (`router.dead_letters`), and their replay: the
letter's message submitted again under its original idempotency key.

Two ways in: `DeadLetters.replay` goes through the router's own submit path; `deliver_replay`
is for a process that is no cluster node (the `stickless dlq replay` command), and queues the
message the way a non-holder forwards it.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from .._config import RouterConfig
from .._errors import (
    BackendUnavailableError,
    ConflictingAgentError,
    DeadLetterNotFoundError,
    IdempotencyConflictError,
    InternalError,
    InvalidRequestError,
    ReplayRefusedError,
)
from .._types import SubmitRequest, TurnResult, is_session_id
from ..actors import TurnWork
from ..backends.base import Backends, DeadLetter, DeadLetterStore, letter_session
from ..wire import Signal, SignalKind, client_key
from ._api import SubmitDisposition, SubmitKind
from ._background import io, quiet
from ._keys import in_flight_ttl, queued_staleness, reservation_key
from ._submit import Verdict, classify

#: Most letters one listing returns.
MAX_LIST_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay started: a new turn of the letter's session under its original key.

    `idempotency_key` is the client's key it ran under (None when the original turn had none,
    so the replay has none either). `disposition` is the router's handle on the new turn
    (`await result.disposition.result`); None for a replay queued by a process that is no
    node. `removed` is False when the turn was accepted but the letter could not be removed
    (remove it by hand: a second replay would be refused, as its key is taken).
    """

    letter_id: str
    session_id: str
    turn_id: str
    idempotency_key: str | None
    disposition: SubmitDisposition | None
    removed: bool


def check_letter_id(letter_id: object) -> str:
    """Raises: InvalidRequestError when it is not a dead-letter id."""
    if not isinstance(letter_id, str) or letter_session(letter_id) is None:
        raise InvalidRequestError(f"letter_id: {letter_id!r} is not a dead-letter id")
    return letter_id


def check_listing(limit: object, session_id: object, before: object) -> None:
    """Raises: InvalidRequestError naming the listing argument that breaks its rule."""
    if type(limit) is not int or not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidRequestError(f"limit: must be an int from 1 to {MAX_LIST_LIMIT}")
    check_session(session_id)
    if before is not None and (
        isinstance(before, bool) or not isinstance(before, int | float) or not math.isfinite(before)
    ):
        raise InvalidRequestError("before: must be a finite time in seconds, or None")


def check_session(session_id: object) -> None:
    """Raises: InvalidRequestError when it is neither None nor a valid session id."""
    if session_id is not None and not is_session_id(session_id):
        raise InvalidRequestError(f"session_id: {session_id!r} is not a session id")


def replay_request(letter: DeadLetter) -> SubmitRequest:
    """The submit a replay makes: the letter's message, under its original client key.

    Raises:
        ReplayRefusedError: the letter holds no readable message (an unreadable entry).
    """
    env = letter.envelope
    if env is None:
        raise ReplayRefusedError(
            f"dead letter {letter.letter_id} has no readable message to replay "
            f"({letter.reason}); inspect its raw bytes, then remove or purge it"
        )
    return SubmitRequest(
        session_id=env.session_id,
        agent_ref=env.agent_ref,
        input=env.input,
        context_discriminator=env.context_discriminator,
        options=dict(env.options),
        submit_options=dict(env.submit_options),
        open_attributes=dict(env.open_attributes),
        idempotency_key=client_key(env.key),
        priority=env.priority,
        initiator=env.initiator,
    )


def _consume(future: asyncio.Future[TurnResult]) -> None:
    """Mark a settled future's exception as seen (no 'never retrieved' warning)."""
    if not future.cancelled():
        future.exception()


def _refuse(letter: DeadLetter, key: str | None, why: str) -> ReplayRefusedError:
    return ReplayRefusedError(
        f"dead letter {letter.letter_id} was not replayed: its idempotency key {key!r} {why}; "
        "the letter is kept"
    )


class DeadLetters:
    """The namespace's dead letters: look, replay under the original key, or clear."""

    def __init__(
        self,
        store: DeadLetterStore,
        submit: Callable[[SubmitRequest], Awaitable[SubmitDisposition]],
        check_open: Callable[[], None],
    ) -> None:
        self._store = store
        self._submit = submit
        self._check_open = check_open

    async def list(
        self, limit: int = 50, session_id: str | None = None, before: float | None = None
    ) -> list[DeadLetter]:
        """Up to `limit` letters, newest first (of one session when given); pass the last
        one's `dead_at` as `before` for the next page.

        Raises:
            InvalidRequestError: a bad limit, session id or time (the message names it).
            BackendUnavailableError: the store could not be reached.
        """
        check_listing(limit, session_id, before)
        return await io(self._store.list(limit, session_id, before))

    async def get(self, letter_id: str) -> DeadLetter | None:
        """The letter, or None.

        Raises:
            InvalidRequestError: not a dead-letter id.
        """
        return await io(self._store.get(check_letter_id(letter_id)))

    async def replay(self, letter_id: str) -> ReplayResult:
        """Submit the letter's message again through this router, under its original
        idempotency key (whose FAILED reservation counts as free), and remove the letter once
        the submit was accepted.

        Raises:
            DeadLetterNotFoundError: no letter has this id.
            ReplayRefusedError: the letter holds no readable message, or its key is answered
                or in flight under another turn (nothing submitted; the letter is kept).
            IdempotencyConflictError: the key was used since with another input.
            RouterClosedError: this router is closed.
        """
        self._check_open()
        letter = await self.get(letter_id)
        if letter is None:
            raise DeadLetterNotFoundError(f"no dead letter {letter_id}")
        request = replay_request(letter)
        disposition = await self._submit(request)
        key = request.idempotency_key
        if disposition.kind is SubmitKind.CACHED or disposition.attached:
            # Nobody will await this caller's future: its answer is not the replay's.
            disposition.result.add_done_callback(_consume)
            how = (
                "is answered by" if disposition.kind is SubmitKind.CACHED else "is in flight under"
            )
            raise _refuse(letter, key, f"{how} turn {disposition.turn_id}")
        removed = await quiet(self._store.remove([letter.letter_id]))
        return ReplayResult(
            letter.letter_id,
            letter.session_id,
            disposition.turn_id,
            key,
            disposition,
            removed is not None,
        )

    async def remove(self, letter_ids: Sequence[str]) -> int:
        """Drop these letters; how many there were.

        Raises:
            InvalidRequestError: one is not a dead-letter id.
        """
        return await io(self._store.remove([check_letter_id(i) for i in letter_ids]))

    async def purge(self, session_id: str | None = None) -> int:
        """Drop every letter of the session (of the namespace when None); how many.

        Raises:
            InvalidRequestError: not a session id.
        """
        check_session(session_id)
        return await io(self._store.purge(session_id))

    async def bury(self, letter: DeadLetter) -> bool:
        """Keep a message that will not run again (its last attempt failed, or it could not be
        read); False when this letter was kept already (burying is safe to repeat). Build it
        with `backends.base.letter_for_envelope` / `letter_for_unreadable`.

        Raises:
            BackendUnavailableError: the store could not be reached (the letter may be kept).
        """
        return await io(self._store.add(letter))


async def deliver_replay(
    backends: Backends, config: RouterConfig, letter_id: str, origin: str
) -> ReplayResult:
    """Replay a letter from a process that is no cluster node (it runs no turns): reserve the
    key as `origin`, queue the message in the session's inbox, make the reservation holderless
    (stale after the forward TTL, as a forward's), ring the session's doorbell, then remove
    the letter. Nobody here waits for the turn: its answer is recorded under the key.

    Raises:
        DeadLetterNotFoundError: no letter has this id.
        ReplayRefusedError: no readable message, or the key is answered or in flight.
        ConflictingAgentError: the session is bound to another agent now.
        IdempotencyConflictError: the key was used since with another input.
        BackendUnavailableError: a store could not be reached (nothing queued).
    """
    letter = await io(backends.dead_letters.get(check_letter_id(letter_id)))
    if letter is None:
        raise DeadLetterNotFoundError(f"no dead letter {letter_id}")
    req = replay_request(letter)
    session_id, key_name = req.session_id, req.idempotency_key
    bound = await io(backends.records.binding(session_id))
    if bound is not None and bound != req.agent_ref:
        raise ConflictingAgentError(
            f"session {session_id} is bound to agent {bound!r}, not {req.agent_ref!r}"
        )
    turn_id = uuid.uuid4().hex
    key = reservation_key(req, turn_id)
    idem = backends.idempotency
    existing = await io(
        idem.put_if_absent(
            session_id,
            key,
            turn_id,
            req.input_hash(),
            origin,
            config.idempotency_secondary_ttl,
            in_flight_ttl(config),
        )
    )
    verdict = classify(existing, req.input_hash(), None)
    if verdict is Verdict.CONFLICT:
        raise IdempotencyConflictError(
            f"idempotency_key {key_name!r} was used with a different input"
        )
    if existing is not None:
        how = "is answered by" if verdict is Verdict.CACHED else "is in flight under"
        raise _refuse(letter, key_name, f"{how} turn {existing.turn_id}")
    try:
        await io(idem.release_holder(session_id, key, origin, queued_staleness(config)))
        work = TurnWork.from_request(req, turn_id, key, origin)
        await io(backends.inbox.deliver(work.to_envelope()))
    except (BackendUnavailableError, InternalError):
        await quiet(idem.discard_reservation(session_id, key, turn_id))
        raise
    lease = await quiet(backends.leases.current(session_id))
    payload = {"held_by": lease.holder} if lease is not None else {}
    await quiet(
        backends.signals.publish(
            Signal(
                kind=SignalKind.MESSAGE_ENQUEUED.value,
                session_id=session_id,
                origin=origin,
                payload=payload,
            )
        )
    )
    removed = await quiet(backends.dead_letters.remove([letter.letter_id]))
    return ReplayResult(letter.letter_id, session_id, turn_id, key_name, None, removed is not None)
