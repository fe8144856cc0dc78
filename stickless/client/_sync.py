"""`Client`: the HTTP gateway from blocking code (scripts, workers, sync web frameworks)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Iterator, Mapping
from typing import Any

import httpx

from .._errors import BackendUnavailableError, SticklessError
from ._core import (
    MAX_WAIT,
    Accepted,
    Backoff,
    Call,
    Priority,
    SseParser,
    StreamBroken,
    StreamItem,
    StreamState,
    TurnOutput,
    TurnView,
    accepted_of,
    auth_headers,
    error_of,
    gave_up,
    header_seconds,
    interrupt_call,
    new_key,
    retry_after,
    retryable,
    session_path,
    submit_call,
    transcript_call,
    turn_call,
)


class EventStream:
    """A stream of one turn's (or one session's) events that resumes by itself: after a dropped
    connection, an `error` frame or a 502/503/504, it reconnects (with backoff) past the last
    event id it received, through any node, and skips frames it already gave. A turn's stream
    ends after the turn's terminal frame; a session's goes on until closed."""

    def __init__(self, client: Client, state: StreamState, submit: Call | None = None) -> None:
        self._state = state
        self._items = client._stream(state, submit)

    def __iter__(self) -> Iterator[StreamItem]:
        return self._items

    def __next__(self) -> StreamItem:
        return next(self._items)

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading (the turn goes on: a client that leaves never interrupts it)."""
        self._items.close()

    @property
    def turn_id(self) -> str | None:
        """The turn (known once a submit's stream is answered)."""
        return self._state.turn_id

    @property
    def origin(self) -> str:
        return self._state.origin

    @property
    def last_event_id(self) -> str | None:
        """The resume cursor: the id of the last event given."""
        return self._state.last_id

    @property
    def nodes(self) -> list[str]:
        """The node that served each connection of the stream, in order."""
        return list(self._state.nodes)


class Client:
    """The `/v1` API of a `stickless serve` cluster (or any app mounting `api_router`).

    Every call is retried with `backoff` when the gateway or a balancer says a retry can fix
    it (502/503/504) or the connection failed; a submit always carries an idempotency key (one
    is made when the caller gives none), so its retries are one turn. Errors are the stickless
    exceptions of their HTTP error code (`UnknownTurnError`, `IdempotencyConflictError`, ...).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        stream_idle_timeout: float = 60.0,
        backoff: Backoff | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        """`stream_idle_timeout`: seconds of silence (the gateway sends a heartbeat every 15 s)
        after which a stream is taken as broken and resumed. `http`: a client of your own (its
        base URL is ignored; requests go to `base_url`)."""
        self.base_url = base_url.rstrip("/")
        self.backoff = backoff or Backoff()
        self._timeout = timeout
        self._stream_timeout = httpx.Timeout(timeout, read=stream_idle_timeout)
        self._headers = auth_headers(token, headers)
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ requests

    def _send(self, call: Call, read_timeout: float | None = None) -> httpx.Response:
        """Raises: SticklessError (by the answer's code), BackendUnavailableError (no
        connection after every try)."""
        failures = 0
        while True:
            try:
                response = self._http.request(
                    call.method, self.base_url + call.path, params=call.params, json=call.json,
                    headers={**self._headers, **call.headers},
                    timeout=read_timeout or self._timeout,
                )  # fmt: skip
            except httpx.TransportError as exc:
                if not (call.repeatable or isinstance(exc, httpx.ConnectError)):
                    raise BackendUnavailableError(f"{call.method} {call.path}: {exc!r}") from exc
                error: BaseException = exc
            else:
                if response.status_code < 400:
                    return response
                error = error_of(
                    response.status_code, response.content, header_seconds(response.headers)
                )
                if not (call.repeatable and retryable(error)):
                    raise error
            failures += 1
            if failures >= self.backoff.attempts:
                raise gave_up(call, failures, error)
            time.sleep(self.backoff.delay(failures, retry_after(error)))

    def _stream(self, state: StreamState, submit: Call | None) -> Generator[StreamItem, None, None]:
        failures = 0
        while not state.done:
            call = state.next_call(submit)
            try:
                with contextlib.closing(self._connection(state, call)) as items:
                    for item in items:
                        failures = 0
                        yield item
            except (httpx.TransportError, StreamBroken) as exc:
                error: BaseException = exc
            except SticklessError as exc:
                if not retryable(exc):
                    raise
                error = exc
            else:
                if state.done:
                    return
                error = StreamBroken("the stream ended before it should")
            failures += 1
            if failures >= self.backoff.attempts:
                raise gave_up(call, failures, error)
            time.sleep(self.backoff.delay(failures, retry_after(error)))

    def _connection(self, state: StreamState, call: Call) -> Generator[StreamItem, None, None]:
        """The new items of one connection (it returns at the turn's end or a 204)."""
        with self._http.stream(
            call.method, self.base_url + call.path, params=call.params, json=call.json,
            headers={**self._headers, **call.headers}, timeout=self._stream_timeout,
        ) as response:  # fmt: skip
            if response.status_code == 204:  # everything after the cursor was sent
                state.done = True
                return
            if response.status_code >= 400:
                raise error_of(
                    response.status_code, response.read(), header_seconds(response.headers)
                )
            state.opened(response.headers)
            parser = SseParser()
            for line in response.iter_lines():
                frame = parser.line(line)
                item = None if frame is None else state.accept(frame)
                if item is not None:
                    yield item
                if state.done:
                    return

    # ------------------------------------------------------------ turns

    def submit(
        self,
        session_id: str,
        input: str | list[dict[str, Any]],
        *,
        agent_ref: str,
        idempotency_key: str | None = None,
        priority: Priority | None = None,
        submit_options: Mapping[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> Accepted:
        """Submit one message; the turn it got (new, or the key's running / answered one).

        Raises:
            IdempotencyConflictError: the key was used with a different input.
            ConflictingAgentError: the session is bound to another agent.
            InvalidRequestError, InputTooLargeError: the request breaks a rule.
        """
        key = idempotency_key or new_key()
        call = submit_call(
            session_id, input, agent_ref=agent_ref, idempotency_key=key, priority=priority,
            submit_options=submit_options, traceparent=traceparent, stream=False,
        )  # fmt: skip
        response = self._send(call)
        return accepted_of(response.json(), response.headers.get("x-node-id", ""), key)

    def attach(
        self,
        session_id: str,
        idempotency_key: str,
        input: str | list[dict[str, Any]],
        *,
        agent_ref: str,
    ) -> Accepted:
        """The turn of `idempotency_key` (sent again with the same input): the running one
        (`attached`), its answer (`cached`), or a new one when the key has none (never used,
        or its turn failed in a way a retry may fix)."""
        return self.submit(session_id, input, agent_ref=agent_ref, idempotency_key=idempotency_key)

    def stream(
        self,
        session_id: str,
        input: str | list[dict[str, Any]],
        *,
        agent_ref: str,
        idempotency_key: str | None = None,
        priority: Priority | None = None,
        submit_options: Mapping[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> EventStream:
        """Submit and stream the turn's events (`EventStream.turn_id` once answered); a POST
        that got no answer is sent again with the same key, so it attaches to its turn."""
        call = submit_call(
            session_id, input, agent_ref=agent_ref, idempotency_key=idempotency_key or new_key(),
            priority=priority, submit_options=submit_options, traceparent=traceparent,
            stream=True,
        )  # fmt: skip
        return EventStream(self, StreamState(session_id), call)

    def follow_turn(
        self, session_id: str, turn_id: str, *, after: str | None = None
    ) -> EventStream:
        """The turn's events from its first (or past the event id `after`) to its end."""
        return EventStream(self, StreamState(session_id, turn_id, last_id=after))

    def follow_session(self, session_id: str, *, after: str | None = None) -> EventStream:
        """Every turn's events of the session, live (after replaying past `after`, if given)."""
        return EventStream(self, StreamState(session_id, last_id=after, of_turn=False))

    def turn(self, session_id: str, turn_id: str, *, wait: float = 0.0) -> TurnView:
        """The turn's state and answer, waiting up to `wait` seconds (at most 300) for its end.

        Raises:
            UnknownTurnError: no such turn (never submitted, or expired).
        """
        wait = min(wait, MAX_WAIT)
        response = self._send(turn_call(session_id, turn_id, wait), self._timeout + wait)
        return TurnView.model_validate(response.json())

    def result(self, session_id: str, turn_id: str, *, timeout: float | None = None) -> TurnOutput:
        """The turn's answer once it ends.

        Raises:
            TurnFailedError: the turn failed (`.code` says why).
            TimeoutError: it did not end within `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = MAX_WAIT if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"turn {turn_id} did not end within {timeout}s")
            view = self.turn(session_id, turn_id, wait=min(left, MAX_WAIT))
            if view.finished:
                return view.output()

    def interrupt(
        self, session_id: str, *, turn_id: str | None = None, reason: str = "USER"
    ) -> bool:
        """Interrupt the running turn (or `turn_id`, running or queued); whether one was."""
        response = self._send(interrupt_call(session_id, turn_id, reason))
        return bool(response.json()["interrupted"])

    # ------------------------------------------------------------ sessions

    def transcript(self, session_id: str, *, after: int = 0) -> list[dict[str, Any]]:
        """The committed transcript (past version `after`): `{"role", "content", "data"}`."""
        entries: list[dict[str, Any]] = self._send(transcript_call(session_id, after)).json()[
            "entries"
        ]
        return entries

    def status(self, session_id: str) -> dict[str, Any]:
        """Best-effort status of the session across the cluster."""
        answer: dict[str, Any] = self._send(Call("GET", session_path(session_id))).json()
        return answer

    def release(self, session_id: str) -> None:
        """Drop the session's live handle and lease (its history stays)."""
        self._send(Call("POST", session_path(session_id, "release")))

    def delete_session(self, session_id: str) -> None:
        """Delete the session's history."""
        self._send(Call("DELETE", session_path(session_id)))
