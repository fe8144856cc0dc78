"""What the sync and the async client share, without I/O: the requests of every route, the
answers as models, errors by their code, SSE parsing and the resume state of a stream (see the
README, "Serve over HTTP")."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel

from .._errors import (
    BackendUnavailableError,
    ConflictingAgentError,
    EventCursorAheadError,
    FailureCode,
    IdempotencyConflictError,
    InputTooLargeError,
    InternalError,
    InvalidRequestError,
    RouterClosedError,
    SessionBusyError,
    SticklessError,
    TurnFailedError,
    UnknownTurnError,
)

#: Statuses a retry can fix: the gateway's 503 (with Retry-After), a balancer's 502 / 504.
RETRYABLE_STATUSES = frozenset({502, 503, 504})
#: Event types that end a turn (unless the frame says `retrying`: then only an attempt ended).
TERMINAL_TYPES = frozenset({"turn_completed", "turn_failed", "interrupted", "rejected"})
#: Longest `?wait=` the gateway honours on a turn lookup (seconds).
MAX_WAIT = 300.0

Priority = Literal["NOW", "NEXT", "LATER"]


# ---------------------------------------------------------------- errors


class UnauthenticatedError(SticklessError):
    """The gateway wants a valid bearer token (HTTP 401 `UNAUTHENTICATED`)."""


class UnknownSessionError(SticklessError, LookupError):
    """No such session, or the caller may not see it (HTTP 404 `UNKNOWN_SESSION`)."""


class HttpStatusError(SticklessError):
    """An HTTP answer with no stickless error code (a balancer's error page, an unknown code)."""


_BY_CODE: dict[str, type[SticklessError]] = {
    "INVALID_REQUEST": InvalidRequestError,
    "INVALID_CURSOR": EventCursorAheadError,
    "UNAUTHENTICATED": UnauthenticatedError,
    "UNKNOWN_TURN": UnknownTurnError,
    "UNKNOWN_SESSION": UnknownSessionError,
    "CONFLICTING_AGENT": ConflictingAgentError,
    "IDEMPOTENCY_CONFLICT": IdempotencyConflictError,
    "SESSION_BUSY": SessionBusyError,
    "INPUT_TOO_LARGE": InputTooLargeError,
    "INTERNAL_ERROR": InternalError,
    "BACKEND_UNAVAILABLE": BackendUnavailableError,
    "ROUTER_CLOSED": RouterClosedError,
}


def error_of(status: int, body: bytes, retry_after: float = 0.0) -> SticklessError:
    """The exception of an error answer, by its body's code (`{"error": {"code", "message"}}`);
    it carries `.status`, `.code` and `.retry_after` (seconds). A 502/503/504 without a code (a
    balancer's page) is a BackendUnavailableError: a retry can fix it."""
    code, message = "", ""
    try:
        detail = json.loads(body)["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace").strip()
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = BackendUnavailableError if status in RETRYABLE_STATUSES else HttpStatusError
    error = cls(message or f"HTTP {status}")
    error.status = status  # type: ignore[attr-defined]
    error.code = code or f"HTTP_{status}"  # type: ignore[attr-defined]
    error.retry_after = retry_after  # type: ignore[attr-defined]
    return error


def retryable(error: SticklessError) -> bool:
    """Whether the same request may succeed later (an outage, a closing node, a balancer)."""
    return getattr(error, "status", 0) in RETRYABLE_STATUSES


def retry_after(error: BaseException) -> float:
    """The seconds an error answer asked to wait before a retry (0 when it did not say)."""
    value = getattr(error, "retry_after", 0.0)
    return float(value) if isinstance(value, (int, float)) else 0.0


# ---------------------------------------------------------------- answers


class Accepted(BaseModel):
    """A submit's answer: the turn, and how the submit got it (`new`, `attached` to the running
    turn of its idempotency key, or `cached`: that turn's answer)."""

    turn_id: str
    session_id: str
    status: Literal["queued", "running", "completed", "failed"]
    origin: Literal["new", "attached", "cached"]
    trace_id: str | None = None
    #: The node that answered (`X-Node-Id`).
    node_id: str = ""
    #: The idempotency key the submit was sent with (the caller's, or one made for it).
    idempotency_key: str = ""


class TurnOutput(BaseModel):
    text: str
    data: dict[str, Any]


class ErrorDetail(BaseModel):
    code: str
    message: str


class TurnView(BaseModel):
    """A turn's state and, once it ended, its answer or error."""

    turn_id: str
    session_id: str
    state: Literal["queued", "running", "completed", "failed"]
    executed_by: str | None
    attempt: int
    result: TurnOutput | None = None
    error: ErrorDetail | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "failed")

    def output(self) -> TurnOutput:
        """The answer of a completed turn.

        Raises:
            TurnFailedError: the turn failed (`.code` says why).
        """
        if self.result is not None:
            return self.result
        error = self.error or ErrorDetail(code="FAILED", message=f"turn is {self.state}")
        raise TurnFailedError.of(
            FailureCode.parse(error.code),
            error.message,
            session_id=self.session_id,
            turn_id=self.turn_id,
            executed_by=self.executed_by or "",
        )


@dataclass(frozen=True)
class StreamEvent:
    """One turn event of a stream: its log id (None for a frame made from a stored answer), its
    type (`turn_started`, `text_delta`, ..., `turn_completed`) and its fields."""

    id: str | None
    type: str
    data: dict[str, Any]

    @property
    def turn_id(self) -> str:
        return str(self.data.get("turn_id", ""))

    @property
    def terminal(self) -> bool:
        """Whether the frame ends its turn (not only one attempt of it)."""
        return self.type in TERMINAL_TYPES and not self.data.get("retrying", False)


@dataclass(frozen=True)
class Gap:
    """Frames after `cursor` were dropped from the log (trimmed or expired) before the stream
    could resume: the stream goes on from the oldest one retained; resynchronise from
    `history()`."""

    cursor: str
    oldest_id: str | None


StreamItem = StreamEvent | Gap


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class Call:
    """One HTTP request, relative to the client's base URL."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Whether sending it twice does what sending it once does (then any failure is retried;
    #: otherwise only a connection that was never made).
    repeatable: bool = True


def session_path(session_id: str, *rest: str) -> str:
    parts = [quote(session_id, safe=""), *(quote(r, safe="") for r in rest)]
    return "/v1/sessions/" + "/".join(parts)


def new_key() -> str:
    """An idempotency key for a submit the caller gave none: retrying it is then safe."""
    return f"py-{uuid.uuid4().hex}"


def submit_call(
    session_id: str,
    input: str | list[dict[str, Any]],
    *,
    agent_ref: str,
    idempotency_key: str,
    priority: Priority | None,
    submit_options: Mapping[str, Any] | None,
    traceparent: str | None,
    stream: bool,
) -> Call:
    body: dict[str, Any] = {"agent_ref": agent_ref, "input": input}
    if priority is not None:
        body["priority"] = priority
    if submit_options:
        body["submit_options"] = dict(submit_options)
    headers = {"Idempotency-Key": idempotency_key}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    if stream:
        headers["Accept"] = "text/event-stream"
    return Call("POST", session_path(session_id, "turns"), json=body, headers=headers)


def accepted_of(body: Any, node_id: str, idempotency_key: str) -> Accepted:
    return Accepted.model_validate(
        {**body, "node_id": node_id, "idempotency_key": idempotency_key}
    )


def turn_call(session_id: str, turn_id: str, wait: float) -> Call:
    params = {"wait": wait} if wait > 0 else {}
    return Call("GET", session_path(session_id, "turns", turn_id), params=params)


def interrupt_call(session_id: str, turn_id: str | None, reason: str) -> Call:
    body: dict[str, Any] = {"reason": reason}
    if turn_id is not None:
        body["turn_id"] = turn_id
    # "The running turn" may be another one by the time a retry lands: only a named turn's
    # interrupt is repeated after the request may have reached the gateway.
    return Call("POST", session_path(session_id, "interrupt"), json=body,
                repeatable=turn_id is not None)  # fmt: skip


def transcript_call(session_id: str, after: int) -> Call:
    return Call("GET", session_path(session_id, "transcript"), params={"after": after})


# ---------------------------------------------------------------- retries


@dataclass(frozen=True)
class Backoff:
    """Waits between the tries of a request or the reconnects of a stream: `first` seconds,
    times `factor` each failure in a row, at most `cap`, jittered down by up to half (so
    clients of a dead node do not come back in step); after `attempts` failures in a row the
    last error is raised."""

    first: float = 0.2
    factor: float = 2.0
    cap: float = 5.0
    attempts: int = 10

    def delay(self, failures: int, retry_after: float = 0.0) -> float:
        base = min(self.cap, self.first * self.factor ** max(failures - 1, 0))
        return min(self.cap, max(base * random.uniform(0.5, 1.0), retry_after))


def header_seconds(headers: Mapping[str, str]) -> float:
    """`Retry-After` in seconds (0 when absent or not a number of seconds)."""
    try:
        return max(float(headers.get("retry-after", "0")), 0.0)
    except ValueError:
        return 0.0


# ---------------------------------------------------------------- SSE


@dataclass
class SseParser:
    """Server-sent events, line by line: `line()` returns a frame when a blank line ends one."""

    _id: str | None = None
    _event: str = "message"
    _data: list[str] = field(default_factory=list)

    def line(self, line: str) -> tuple[str | None, str, str] | None:
        """(id, event, data) of a finished frame, or None (a field, a comment, a heartbeat)."""
        if line == "":
            frame = (self._id, self._event, "\n".join(self._data)) if self._data else None
            self._id, self._event, self._data = None, "message", []
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


class StreamBroken(Exception):
    """The stream ended without finishing (a dropped connection, an `error` frame, an end
    before the terminal frame): resume it."""


def _id_key(event_id: str) -> tuple[int, int] | None:
    ms, _, n = event_id.partition("-")
    if ms.isdigit() and n.isdigit():
        return int(ms), int(n)
    return None


@dataclass
class StreamState:
    """Where a stream is: the last event id received (the resume cursor), dedupe by that id,
    and whether its turn has ended. `turn_id` is None for a session's stream (it never ends)
    until a submit's stream learns its turn from the first answer."""

    session_id: str
    turn_id: str | None = None
    last_id: str | None = None
    done: bool = False
    #: Whether this is a turn's stream (it ends with the turn).
    of_turn: bool = True
    #: How a submit's stream got its turn (`new`, `attached`, `cached`; "" for the others).
    origin: str = ""
    #: The nodes that served each connection, in order (`X-Node-Id`).
    nodes: list[str] = field(default_factory=list)

    def opened(self, headers: Mapping[str, str]) -> None:
        """A connection answered 200: note its node and, on a submit's, its turn."""
        if self.turn_id is None:
            self.turn_id = headers.get("x-turn-id") or None
            self.origin = headers.get("x-origin", "")
        self.nodes.append(headers.get("x-node-id", ""))

    def next_call(self, submit: Call | None) -> Call:
        """The request of the next connection: the submit again (same idempotency key, so it
        attaches) while no answer named the turn, else a resume past the cursor."""
        if submit is not None and self.turn_id is None:
            return submit
        return self.resume_call()

    def resume_call(self) -> Call:
        """The request that goes on from the cursor."""
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        if self.of_turn:
            assert self.turn_id is not None
            return Call("GET", session_path(self.session_id, "turns", self.turn_id, "events"),
                        headers=headers)  # fmt: skip
        return Call("GET", session_path(self.session_id, "events"), headers=headers)

    def accept(self, frame: tuple[str | None, str, str]) -> StreamItem | None:
        """The item a frame gives the caller, or None for a duplicate.

        Raises:
            StreamBroken: an `error` frame (the node failed the stream after its 200).
        """
        event_id, event, data = frame
        if event == "error":
            raise StreamBroken(data)
        payload = json.loads(data)
        if event == "gap":
            return Gap(cursor=str(payload.get("cursor", "")), oldest_id=payload.get("oldest_id"))
        if event_id is not None:
            if not self._newer(event_id):
                return None
            self.last_id = event_id
        item = StreamEvent(id=event_id, type=event, data=payload)
        if self.of_turn and item.terminal and item.turn_id in ("", self.turn_id):
            self.done = True
        return item

    def _newer(self, event_id: str) -> bool:
        if self.last_id is None:
            return True
        new, last = _id_key(event_id), _id_key(self.last_id)
        if new is None or last is None:
            return event_id != self.last_id
        return new > last


def auth_headers(token: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The headers of every request: `extra`, and `Authorization: Bearer <token>` given one."""
    headers = dict(extra or {})
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def gave_up(call: Call, failures: int, error: BaseException) -> SticklessError:
    """The error raised once every try failed: the last error answer, or a
    BackendUnavailableError naming the last transport failure."""
    if isinstance(error, SticklessError):
        return error
    failed = BackendUnavailableError(
        f"{call.method} {call.path}: failed {failures} times in a row (last: {error!r})"
    )
    failed.__cause__ = error
    return failed
