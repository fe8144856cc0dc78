"""The error hierarchy and failure codes; every error pickles (Ray ships them across processes)."""

from __future__ import annotations

import enum
from typing import Any


class FailureCode(enum.StrEnum):
    """Why a turn did not succeed."""

    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"
    HOLDER_LOST = "HOLDER_LOST"
    LEASE_LOST = "LEASE_LOST"
    NOT_HOLDER = "NOT_HOLDER"
    UNREADABLE = "UNREADABLE"
    CONFLICTING_AGENT = "CONFLICTING_AGENT"
    EVICTED = "EVICTED"
    FORWARD_TIMEOUT = "FORWARD_TIMEOUT"
    #: The shared store could not serve a call the turn needed (out of reach, out of memory).
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    #: The node running the turn shut down gracefully before the turn ended.
    SHUTDOWN = "SHUTDOWN"

    @property
    def final(self) -> bool:
        """Whether this answer stays the idempotency key's answer (a retry gets it again).

        Only what the user or the agent binding decided is final; an answer caused by the
        infrastructure (a lost holder or lease, shutdown, eviction, a timeout, an unreadable
        entry, a failed run) leaves the key free, so a retry runs fresh.
        """
        return self in (FailureCode.INTERRUPTED, FailureCode.CONFLICTING_AGENT)

    @classmethod
    def parse(cls, value: str) -> FailureCode:
        """Decode a code from the wire; codes this node does not know become FAILED."""
        try:
            return cls(value)
        except ValueError:
            return cls.FAILED


class SticklessError(Exception):
    """Base of every error stickless raises."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,))

    def __str__(self) -> str:
        return self.message


class ConflictingAgentError(SticklessError):
    """The session is bound to a different agent (HTTP 409)."""


class IdempotencyConflictError(SticklessError):
    """The idempotency key was used before with a different input (HTTP 409)."""


class SessionBusyError(SticklessError):
    """Delete could not take the session from its holder in time (HTTP 409)."""


class BackendUnavailableError(SticklessError):
    """A shared backend could not be reached (HTTP 503); nothing was reserved."""


class StoreMisconfiguredError(SticklessError):
    """The store is set up so that stickless's guarantees would not hold (the message names the
    setting and the fix); the router refuses to start on it."""


class InternalError(SticklessError):
    """A backend refused a call the same way it would every time (a bug or a misconfiguration,
    not an outage: HTTP 500, no retry); the message quotes the backend's error."""


class RouterClosedError(SticklessError):
    """The router is closed or was killed; it accepts no more work."""


class InvalidRequestError(SticklessError, ValueError):
    """The request failed validation (HTTP 400); the message names the field and the rule."""


class InputTooLargeError(InvalidRequestError):
    """The input's encoded size is over `max_input_bytes` (HTTP 413); nothing was reserved."""


class FrameTooLargeError(SticklessError, ValueError):
    """An emitted frame is over the frame bound (`max_relay_batch_bytes` less the batch's
    envelope) and is not a text or reasoning delta, the frames that are cut to fit; the
    message names the bound. Nothing of the frame was sent."""


class DeadLetterNotFoundError(SticklessError, LookupError):
    """No dead letter has this id (HTTP 404): it never existed, or was replayed or removed."""


class UnknownTurnError(SticklessError, LookupError):
    """The session has no turn with this id (HTTP 404): never submitted, its reservation
    expired or was discarded, or a newer turn took its idempotency key."""


class ReplayRefusedError(SticklessError):
    """A dead letter cannot be replayed (HTTP 409), and is kept: it holds no readable message,
    or its idempotency key is answered or in flight under another turn (the message says)."""


class TurnFailedError(SticklessError):
    """A turn did not succeed; `.code` says why."""

    def __init__(
        self,
        code: FailureCode,
        message: str = "",
        *,
        session_id: str = "",
        turn_id: str = "",
        executed_by: str = "",
    ) -> None:
        super().__init__(f"{code.value}: {message}" if message else code.value)
        self.code = code
        self.detail = message
        self.session_id = session_id
        self.turn_id = turn_id
        #: The node that ended the turn (ran it, or decided its answer); "" when unknown.
        self.executed_by = executed_by

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_turn_failure,
            (
                type(self),
                self.code.value,
                self.detail,
                self.session_id,
                self.turn_id,
                self.executed_by,
            ),
        )

    @staticmethod
    def of(
        code: FailureCode,
        message: str = "",
        *,
        session_id: str = "",
        turn_id: str = "",
        executed_by: str = "",
    ) -> TurnFailedError:
        """Build the subclass for `code` (CONFLICTING_AGENT is also a ConflictingAgentError)."""
        cls = (
            TurnConflictingAgentError if code is FailureCode.CONFLICTING_AGENT else TurnFailedError
        )
        return cls(code, message, session_id=session_id, turn_id=turn_id, executed_by=executed_by)


class TurnConflictingAgentError(TurnFailedError, ConflictingAgentError):
    """A queued message was rejected because the session is bound to another agent."""


def _rebuild_turn_failure(
    cls: type[TurnFailedError],
    code: str,
    message: str,
    session_id: str,
    turn_id: str,
    executed_by: str = "",
) -> TurnFailedError:
    return cls(
        FailureCode.parse(code),
        message,
        session_id=session_id,
        turn_id=turn_id,
        executed_by=executed_by,
    )


class EventCursorError(SticklessError):
    """A resume cursor (`after=`) the session's event log cannot serve without a silent gap.

    `oldest_id` is the oldest event id still retained and `last_id` the newest id the log ever
    gave, each None when the log holds none. Subclasses say which way the cursor is off.
    """

    def __init__(
        self,
        message: str = "",
        *,
        session_id: str = "",
        cursor: str = "",
        oldest_id: str | None = None,
        last_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.cursor = cursor
        self.oldest_id = oldest_id
        self.last_id = last_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_cursor_error,
            (type(self), self.message, self.session_id, self.cursor, self.oldest_id, self.last_id),
        )


class EventCursorTrimmedError(EventCursorError):
    """Events after the cursor were dropped: trimmed by the log's length bound, deleted with the
    session, or expired with the whole log (then `oldest_id` and `last_id` are None). Replay
    cannot be gap-free; resynchronise from the session record, then follow the live stream."""


class EventCursorAheadError(EventCursorError):
    """The cursor is later than the newest id the log ever gave (`last_id`): it was not issued by
    this log (another session, namespace or store)."""


def _rebuild_cursor_error(
    cls: type[EventCursorError],
    message: str,
    session_id: str,
    cursor: str,
    oldest_id: str | None,
    last_id: str | None,
) -> EventCursorError:
    return cls(message, session_id=session_id, cursor=cursor, oldest_id=oldest_id, last_id=last_id)
