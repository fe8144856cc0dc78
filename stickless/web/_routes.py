"""The `/v1` routes: turns, their events, and session controls (see the README, "Serve over
HTTP", for the contract with curl examples)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from .._errors import EventCursorTrimmedError, IdempotencyConflictError, TurnFailedError
from .._events import Event
from .._trace import TraceContext
from .._types import Principal, SubmitRequest, TurnResult, field_errors, is_session_id
from ..backends.base import MAX_VERSION
from ..router import EventStream, SessionRouter, SubmitOrigin, TurnState, TurnStream
from ..router._background import io
from ..router._stream import check_cursor, logged_frames
from ._auth import ANONYMOUS, Action, Authenticator, Authorizer, OwnerOnly
from ._errors import HttpError, MappedErrorsRoute
from ._models import InterruptBody, Interrupted, Transcript, TurnAccepted, TurnBody, TurnView
from ._sse import event_frame, gap_frame, named_frame, sse_response

T = TypeVar("T")

#: Longest `?wait=` a turn lookup honours (seconds).
MAX_WAIT = 300.0
_FINISHED = (TurnState.COMPLETED, TurnState.FAILED)


@dataclass(frozen=True)
class GatewaySettings:
    """Knobs of the HTTP gateway."""

    #: Seconds of silence after which an event stream sends a comment line.
    heartbeat: float = 15.0
    #: Largest request body accepted (HTTP 413 above it).
    max_input_bytes: int = 1024 * 1024


def _read(future: asyncio.Future[TurnResult]) -> None:
    """Mark a submit's own result future read: the HTTP caller fetches the answer by id."""

    def done(f: asyncio.Future[TurnResult]) -> None:
        if not f.cancelled():
            f.exception()

    future.add_done_callback(done)


def scoped_key(principal: Principal, key: str) -> str:
    """The idempotency key of a request: the client's key scoped to its principal (the store
    scopes keys per session already), so two principals never share an answer."""
    digest = hashlib.sha256(f"{principal.id}\x00{key}".encode()).hexdigest()
    return f"http:{digest}"


class Gateway:
    """The routes' shared state: the router, who may do what, and the settings."""

    def __init__(
        self,
        router: SessionRouter,
        authenticator: Authenticator | None,
        authorizer: Authorizer | None,
        settings: GatewaySettings,
    ) -> None:
        self.router = router
        self.authenticator = authenticator
        self.authorizer = authorizer or OwnerOnly()
        self.settings = settings

    # ------------------------------------------------------------ who and what

    async def principal(self, request: Request) -> Principal:
        """Raises: Unauthenticated."""
        if self.authenticator is None:
            return ANONYMOUS
        return await self.authenticator.authenticate(request)

    async def check(self, principal: Principal, session_id: str, action: Action) -> None:
        """Raises: HttpError 404 when the principal may not see the session."""
        check_session_id(session_id)
        if self.authenticator is None:
            return
        owner = await io(self.router.backends.owners.owner(session_id))
        if not self.authorizer.allows(principal, owner, action):
            raise _unknown_session(session_id)

    async def claim(self, principal: Principal, session_id: str) -> None:
        """Stamp a new session with its creator; raises HttpError 404 when it is someone
        else's."""
        if self.authenticator is None:
            return
        owner = await io(self.router.backends.owners.claim(session_id, principal.id))
        if not self.authorizer.allows(principal, owner, Action.SUBMIT):
            raise _unknown_session(session_id)

    # ------------------------------------------------------------ cursors

    async def resume_from(self, session_id: str, cursor: str | None) -> tuple[str | None, bool]:
        """The cursor to read on from, and whether frames after the client's were dropped (then
        reading starts at the oldest retained frame).

        Raises:
            InvalidRequestError: the cursor is not an event id.
            EventCursorAheadError: the log never gave that id.
        """
        if cursor is None:
            return None, False
        check_cursor(cursor)
        try:
            await io(self.router.backends.events.read(session_id, cursor, 1))
        except EventCursorTrimmedError:
            return None, True
        return cursor, False

    async def has_turn_frames(self, session_id: str, turn_id: str, cursor: str) -> bool:
        """Whether the log holds frames of the turn past `cursor`."""
        frames = logged_frames(self.router.backends.events, session_id, cursor)
        async with contextlib.aclosing(frames):
            return await io(_any_of_turn(frames, turn_id))

    async def read_body(self, request: Request, limit: int | None = None) -> bytes:
        """The request body, refused (413) past `limit` (default `max_input_bytes`) without
        reading it all."""
        limit = self.settings.max_input_bytes if limit is None else limit
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)


async def _any_of_turn(frames: AsyncIterator[Event], turn_id: str) -> bool:
    async for frame in frames:
        if frame.turn_id == turn_id:
            return True
    return False


def check_session_id(session_id: str) -> None:
    if not is_session_id(session_id):
        raise HttpError(
            400,
            "INVALID_REQUEST",
            "session_id: must start with a letter or digit and contain only letters, digits "
            "and ._:@/+=- (at most 200 characters)",
        )


def _unknown_session(session_id: str) -> HttpError:
    return HttpError(404, "UNKNOWN_SESSION", f"no session {session_id!r}")


def _too_large(limit: int) -> HttpError:
    return HttpError(413, "INPUT_TOO_LARGE", f"request body: larger than {limit} bytes")


def _wants_events(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


def _cursor(last_event_id: str | None, after: str | None) -> str | None:
    """The resume cursor: a browser's `Last-Event-ID` wins over `?after=`."""
    return last_event_id if last_event_id else after


async def _event_bytes(
    frames: EventStream | TurnStream, gap: bytes = b""
) -> AsyncIterator[bytes]:
    """SSE frames of a stream of events (after a `gap` frame, when one is due); a gap the
    stream meets on the way (frames the event log no longer held when it caught up) goes out
    as a `gap` frame where it lies; an error after the 200 went out ends the stream with an
    `error` frame."""
    if gap:
        yield gap
    try:
        async for frame in frames:
            for met in frames.take_gaps():
                yield gap_frame(met.cursor or "", met.oldest_id)
            yield event_frame(frame)
        for met in frames.take_gaps():
            yield gap_frame(met.cursor or "", met.oldest_id)
    except Exception as exc:
        yield named_frame("error", {"code": type(exc).__name__, "message": str(exc)})
    finally:
        await frames.aclose()


def _turn_request(
    session_id: str,
    body: TurnBody,
    principal: Principal,
    idempotency_key: str | None,
    traceparent: str | None,
) -> SubmitRequest:
    """Raises: InvalidRequestError (a field breaks its rule)."""
    fields: dict[str, Any] = {
        "session_id": session_id,
        "agent_ref": body.agent_ref,
        "input": body.input if isinstance(body.input, str) else {"parts": body.input},
        "submit_options": body.submit_options,
        "initiator": principal,
        # W3C trace context: a receiver ignores an invalid traceparent and starts a new trace.
        "trace": TraceContext.lenient(traceparent),
    }
    if body.priority is not None:
        fields["priority"] = body.priority
    if idempotency_key is not None:
        if not 1 <= len(idempotency_key) <= 200 or not idempotency_key.isprintable():
            raise HttpError(
                400,
                "INVALID_REQUEST",
                "Idempotency-Key: must be 1 to 200 printable characters",
            )
        fields["idempotency_key"] = scoped_key(principal, idempotency_key)
    return SubmitRequest(**fields)


async def _as_sent(call: Awaitable[T], idempotency_key: str | None) -> T:
    """Await a submit; an idempotency conflict names the key the client sent (the router only
    knows the principal-scoped one).

    Raises:
        IdempotencyConflictError: the key was used before with a different input.
    """
    try:
        return await call
    except IdempotencyConflictError:
        raise IdempotencyConflictError(
            f"Idempotency-Key {idempotency_key!r} was used with a different input"
        ) from None


def _trace_headers(trace: TraceContext | None) -> dict[str, str]:
    """The submit span's context, for a client to join the turn's trace."""
    return {} if trace is None else {"traceparent": trace.traceparent}


def api_router(gateway: Gateway) -> APIRouter:
    """The `/v1` routes over one gateway, to mount in any FastAPI app."""
    api = APIRouter(prefix="/v1", route_class=MappedErrorsRoute, tags=["sessions"])
    router = gateway.router

    @api.post(
        "/sessions/{session_id}/turns",
        status_code=202,
        response_model=TurnAccepted,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": TurnBody.model_json_schema()}},
            }
        },
    )
    async def submit_turn(
        session_id: str,
        request: Request,
        idempotency_key: Annotated[str | None, Header()] = None,
        traceparent: Annotated[str | None, Header()] = None,
    ) -> Response:
        """Submit one message; with `Accept: text/event-stream`, stream the turn's events."""
        principal = await gateway.principal(request)
        check_session_id(session_id)
        raw = await gateway.read_body(request)
        try:
            body = TurnBody.model_validate_json(raw or b"null")
        except ValidationError as exc:
            raise HttpError(400, "INVALID_REQUEST", field_errors(exc)) from None
        submit = _turn_request(session_id, body, principal, idempotency_key, traceparent)
        await gateway.claim(principal, session_id)
        if _wants_events(request):
            stream = await _as_sent(router.stream(submit), idempotency_key)
            _read(stream.disposition.result)
            headers = {
                "X-Turn-Id": stream.disposition.turn_id,
                "X-Origin": stream.origin.value,
                "X-Node-Id": router.node_id,
                **_trace_headers(stream.disposition.trace),
            }
            response = sse_response(_event_bytes(stream), gateway.settings.heartbeat)
            response.headers.update(headers)
            return response
        disposition = await _as_sent(router.submit(submit), idempotency_key)
        _read(disposition.result)
        status = {SubmitOrigin.NEW: "queued", SubmitOrigin.ATTACHED: "running"}.get(
            disposition.origin
        )
        if status is None:
            status = "failed" if disposition.result.exception() is not None else "completed"
        accepted = TurnAccepted(
            turn_id=disposition.turn_id,
            session_id=session_id,
            status=status,
            origin=disposition.origin.value,
            trace_id=disposition.trace.trace_id if disposition.trace is not None else None,
        )
        location = f"/v1/sessions/{session_id}/turns/{disposition.turn_id}"
        headers = {
            "Location": location,
            "X-Node-Id": router.node_id,
            **_trace_headers(disposition.trace),
        }
        return JSONResponse(accepted.model_dump(), status_code=202, headers=headers)

    @api.get(
        "/sessions/{session_id}/turns/{turn_id}",
        response_model=TurnView,
    )
    async def get_turn(
        session_id: str,
        turn_id: str,
        request: Request,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT)] = 0.0,
    ) -> JSONResponse:
        """The turn's state and answer; `?wait=SECONDS` waits up to that long for its end."""
        principal = await gateway.principal(request)
        await gateway.check(principal, session_id, Action.READ)
        if wait > 0:
            # The state below says how the turn ended, or that it has not yet.
            with contextlib.suppress(TurnFailedError, TimeoutError):
                await router.result(session_id, turn_id, timeout=wait)
        view = TurnView.of(await router.turn(session_id, turn_id))
        # `result` / `error` only when the turn has one; `executed_by` always (null: queued).
        absent = {name for name in ("result", "error") if getattr(view, name) is None}
        return JSONResponse(view.model_dump(exclude=absent))

    @api.get(
        "/sessions/{session_id}/turns/{turn_id}/events",
        response_class=Response,
        responses={200: {"content": {"text/event-stream": {}}}, 204: {}},
    )
    async def turn_events(
        session_id: str,
        turn_id: str,
        request: Request,
        last_event_id: Annotated[str | None, Header()] = None,
        after: str | None = None,
    ) -> Response:
        """The turn's events as SSE, from its first (or past the cursor) to its terminal one."""
        principal = await gateway.principal(request)
        await gateway.check(principal, session_id, Action.READ)
        cursor = _cursor(last_event_id, after)
        info = await router.turn(session_id, turn_id)
        start, gapped = await gateway.resume_from(session_id, cursor)
        if (
            start is not None
            and info.state in _FINISHED
            and not await gateway.has_turn_frames(session_id, turn_id, start)
        ):
            return Response(status_code=204)  # everything was sent: a browser stops here
        stream = await router.follow(session_id, turn_id, after=start)
        gap = gap_frame(cursor or "", None) if gapped else b""
        return sse_response(_event_bytes(stream, gap), gateway.settings.heartbeat)

    @api.get(
        "/sessions/{session_id}/events",
        response_class=Response,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def session_events(
        session_id: str,
        request: Request,
        last_event_id: Annotated[str | None, Header()] = None,
        after: str | None = None,
    ) -> Response:
        """Every turn's events as SSE, live (after replaying past the cursor, if given)."""
        principal = await gateway.principal(request)
        await gateway.check(principal, session_id, Action.READ)
        cursor = _cursor(last_event_id, after)
        start, gapped = await gateway.resume_from(session_id, cursor)
        # After a gap, replay whatever the log still holds ('0-0' reads from its oldest).
        stream = router.events(session_id, after="0-0" if gapped else start)
        gap = gap_frame(cursor or "", None) if gapped else b""
        return sse_response(_event_bytes(stream, gap), gateway.settings.heartbeat)

    @api.post("/sessions/{session_id}/interrupt", status_code=202, response_model=Interrupted)
    async def interrupt(
        session_id: str, request: Request, body: InterruptBody | None = None
    ) -> JSONResponse:
        """Interrupt the running turn (or `turn_id`, running or queued), wherever it runs."""
        principal = await gateway.principal(request)
        await gateway.check(principal, session_id, Action.INTERRUPT)
        body = body or InterruptBody()
        done = await router.interrupt(session_id, body.reason, body.turn_id)
        return JSONResponse({"interrupted": done}, status_code=202)

    @api.post("/sessions/{session_id}/release", status_code=204, response_class=Response)
    async def release(session_id: str, request: Request) -> Response:
        """Drop the session's live handle and lease; its history stays."""
        principal = await gateway.principal(request)
        await gateway.check(principal, session_id, Action.RELEASE)
        await router.release_session(session_id)
        return Response(status_code=204)

    @api.delete("/sessions/{session_id}", status_code=204, response_class=Response)
    async def delete(session_id: str, request: Request) -> Response:
        """Delete the session's history (and its owner stamp)."""
        principal = await gateway.principal(request)
        await gateway.check(principal, session_id, Action.DELETE)
        await router.delete_session(session_id)
        await io(router.backends.owners.forget(session_id))
        return Response(status_code=204)

    @api.get("/sessions/{session_id}")
    async def status(session_id: str, request: Request) -> dict[str, Any]:
        """Best-effort status of the session across the cluster."""
        principal = await gateway.principal(request)
        await gateway.check(principal, session_id, Action.READ)
        return (await router.status(session_id)).model_dump(mode="json")

    @api.get("/sessions/{session_id}/transcript", response_model=Transcript)
    async def transcript(
        session_id: str, request: Request, after: Annotated[int, Query(ge=0, le=MAX_VERSION)] = 0
    ) -> Transcript:
        """The session's committed transcript (`?after=N`: only the entries past version N)."""
        principal = await gateway.principal(request)
        await gateway.check(principal, session_id, Action.READ)
        entries = await router.transcript(session_id, after)
        return Transcript(
            session_id=session_id, entries=[e.model_dump(mode="json") for e in entries]
        )

    return api
