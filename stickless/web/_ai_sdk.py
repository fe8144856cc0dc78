"""Routes that speak the AI SDK's UI message stream protocol, so `useChat` with its default
`DefaultChatTransport` and `resume: true` runs against stickless unchanged (see the README,
"AI SDK (useChat)", and docs/architecture.md, "AI SDK routes").

- `POST {prefix}`: the SDK's chat request; the last user message is the turn's input, the
  chat id the session id; streams the turn as UI message chunks.
- `GET {prefix}/{chat_id}/stream`: the chat's running turn from its start (replayed from the
  event log, then live), or 204 when there is nothing to resume.
- `POST {prefix}/{chat_id}/stop`: interrupt the chat's turn. The SDK's own `stop()` only aborts
  its fetch, and a client that leaves never interrupts a turn in stickless.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .._errors import IdempotencyConflictError, UnknownTurnError
from .._trace import TraceContext
from .._types import Principal, SubmitRequest, field_errors
from ..router import TurnState, TurnStream
from ..router._background import io
from ._auth import Action
from ._errors import HttpError, MappedErrorsRoute
from ._models import Interrupted
from ._routes import Gateway, check_session_id, scoped_key
from ._sse import sse_response
from ._ui_stream import DONE, UI_STREAM_HEADERS, UIMessageEncoder, sse_chunk

_FINISHED = (TurnState.COMPLETED, TurnState.FAILED)


@dataclass(frozen=True)
class AISdkSettings:
    """Where the AI SDK routes live and what a chat request may carry."""

    #: The path the frontend's `DefaultChatTransport({ api })` names.
    prefix: str = "/v1/ai-sdk/chat"
    #: The agent of a chat whose request names none (`body: { agent_ref }` on the transport).
    agent_ref: str | None = None
    #: Largest request body accepted (HTTP 413 above it): the SDK sends the whole history.
    max_body_bytes: int = 8 * 1024 * 1024


class UIMessageIn(BaseModel):
    """One message of the SDK's request (only the last one is read in full)."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1, max_length=200)
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]]


class ChatRequest(BaseModel):
    """The body `DefaultChatTransport` posts, plus the stickless fields a transport's `body`
    option may add (`agent_ref`, `priority`, `submit_options`); other fields are the app's."""

    model_config = ConfigDict(extra="allow")
    id: str
    messages: list[UIMessageIn] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None
    agent_ref: str | None = Field(default=None, min_length=1)
    priority: Literal["NOW", "NEXT", "LATER"] | None = None
    submit_options: dict[str, Any] = Field(default_factory=dict)


def user_input(message: UIMessageIn) -> list[dict[str, Any]]:
    """The stickless input parts of the SDK's user message: its text and file parts.

    Raises:
        HttpError: 400 when it is not a user message or carries neither.
    """
    if message.role != "user":
        raise _invalid("messages: the last message must be the user's (role 'user'), "
                       f"got role {message.role!r}")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(message.parts):
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _invalid(f"messages[-1].parts[{index}].text: must be a string")
            parts.append({"type": "text", "text": text})
        elif kind == "file":
            url, media = part.get("url"), part.get("mediaType")
            if not isinstance(url, str) or not isinstance(media, str):
                raise _invalid(f"messages[-1].parts[{index}]: a file part needs string "
                               "'url' and 'mediaType'")
            name = part.get("filename")
            parts.append({"type": "media", "mime_type": media, "url": url,
                          "name": name if isinstance(name, str) else None})
    if not parts:
        raise _invalid("messages[-1].parts: needs a text or file part")
    return parts


def _invalid(message: str) -> HttpError:
    return HttpError(400, "INVALID_REQUEST", message)


async def _ui_bytes(stream: TurnStream, encoder: UIMessageEncoder) -> AsyncIterator[bytes]:
    """The turn's frames as UI message chunks, then `[DONE]`; an error after the 200 went out
    ends the stream with an error part."""
    try:
        for chunk in encoder.start():
            yield sse_chunk(chunk)
        async for frame in stream:
            for chunk in encoder.frame(frame):
                yield sse_chunk(chunk)
            if encoder.finished:
                break
    except Exception as exc:
        for chunk in encoder.error(f"{type(exc).__name__}: {exc}"):
            yield sse_chunk(chunk)
    finally:
        await stream.aclose()
    yield DONE


def _ui_response(stream: TurnStream, gateway: Gateway) -> Response:
    turn_id = stream.disposition.turn_id
    response = sse_response(_ui_bytes(stream, UIMessageEncoder(turn_id)),
                            gateway.settings.heartbeat)
    response.headers.update({**UI_STREAM_HEADERS, "X-Turn-Id": turn_id,
                             "X-Origin": stream.origin.value})
    return response


class _Chats:
    """The handlers' shared work over one gateway."""

    def __init__(self, gateway: Gateway, settings: AISdkSettings) -> None:
        self.gateway = gateway
        self.settings = settings

    def submit_request(
        self, body: ChatRequest, principal: Principal, idempotency_key: str | None,
        traceparent: str | None,
    ) -> SubmitRequest:
        """Raises: HttpError 400 (a field breaks its rule)."""
        if body.trigger == "regenerate-message":
            raise _invalid("trigger: 'regenerate-message' is not supported (a stickless "
                           "session's history is append-only): send a new message instead")
        last = body.messages[-1]
        parts = user_input(last)
        agent_ref = body.agent_ref or self.settings.agent_ref
        if agent_ref is None:
            raise _invalid("agent_ref: required (the transport's `body: { agent_ref }`), as "
                           "this gateway has no default agent")
        # A request sent again for the same user message attaches to its turn (or gets its
        # answer) instead of running it twice.
        key = idempotency_key or f"ai-sdk:{last.id}"
        if not 1 <= len(key) <= 200 or not key.isprintable():
            raise _invalid("Idempotency-Key: must be 1 to 200 printable characters")
        fields: dict[str, Any] = {
            "session_id": body.id,
            "agent_ref": agent_ref,
            "input": {"parts": parts},
            "submit_options": body.submit_options,
            "initiator": principal,
            "idempotency_key": scoped_key(principal, key),
            "trace": TraceContext.lenient(traceparent),
        }
        if body.priority is not None:
            fields["priority"] = body.priority
        try:
            return SubmitRequest(**fields)
        except ValidationError as exc:
            raise _invalid(field_errors(exc)) from None

    async def send(self, request: Request) -> Response:
        """The chat request: submit the last user message and stream its turn."""
        gateway = self.gateway
        principal = await gateway.principal(request)
        raw = await gateway.read_body(request, self.settings.max_body_bytes)
        try:
            body = ChatRequest.model_validate_json(raw or b"null")
        except ValidationError as exc:
            raise _invalid(field_errors(exc)) from None
        try:
            check_session_id(body.id)
        except HttpError as exc:
            raise _invalid(f"id (the chat id, which is the session id): {exc.message}") from None
        submit = self.submit_request(body, principal, request.headers.get("idempotency-key"),
                                     request.headers.get("traceparent"))
        await gateway.claim(principal, body.id)
        try:
            stream = await gateway.router.stream(submit)
        except IdempotencyConflictError:
            sent = request.headers.get("idempotency-key")
            what = (f"Idempotency-Key {sent!r} was used" if sent else
                    f"messages: user message {body.messages[-1].id!r} was sent")
            raise IdempotencyConflictError(
                f"{what} before with other content (a stickless history is append-only: send "
                "a new message)"
            ) from None
        try:
            pointer = gateway.router.backends.chat_streams
            await io(pointer.started(body.id, stream.disposition.turn_id))
        except BaseException:
            await stream.aclose()
            raise
        return _ui_response(stream, gateway)

    async def resume(self, chat_id: str, request: Request) -> Response:
        """The chat's unfinished turn from its start, else 204."""
        gateway = self.gateway
        principal = await gateway.principal(request)
        try:
            await gateway.check(principal, chat_id, Action.READ)
        except HttpError as exc:
            if exc.status != 404:
                raise
            # A chat the caller may not see has nothing to resume, as one that never existed
            # (the SDK asks on every page load, new chats included).
            return Response(status_code=204)
        turn_id = await io(gateway.router.backends.chat_streams.current(chat_id))
        if turn_id is None:
            return Response(status_code=204)
        try:
            info = await gateway.router.turn(chat_id, turn_id)
            if info.state in _FINISHED:
                return Response(status_code=204)
            stream = await gateway.router.follow(chat_id, turn_id)
        except UnknownTurnError:  # expired with its reservation: long finished
            return Response(status_code=204)
        return _ui_response(stream, gateway)

    async def stop(self, chat_id: str, request: Request) -> JSONResponse:
        """Interrupt the chat's turn (the one its client last started), wherever it runs."""
        gateway = self.gateway
        principal = await gateway.principal(request)
        await gateway.check(principal, chat_id, Action.INTERRUPT)
        turn_id = await io(gateway.router.backends.chat_streams.current(chat_id))
        done = await gateway.router.interrupt(chat_id, "USER", turn_id)
        return JSONResponse(Interrupted(interrupted=done).model_dump(), status_code=202)


def ai_sdk_router(gateway: Gateway, settings: AISdkSettings | None = None) -> APIRouter:
    """The AI SDK routes over one gateway (same auth and error answers as `/v1`), to mount in
    any FastAPI app."""
    settings = settings or AISdkSettings()
    chats = _Chats(gateway, settings)
    api = APIRouter(prefix=settings.prefix, route_class=MappedErrorsRoute, tags=["ai-sdk"])
    streamed: dict[int | str, dict[str, Any]] = {200: {"content": {"text/event-stream": {}}}}

    @api.post("", response_class=Response, responses=streamed,
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": ChatRequest.model_json_schema()}}}})
    async def send(request: Request) -> Response:
        """The AI SDK's chat request: run the last user message as the chat's next turn and
        stream it (UI message stream v1)."""
        return await chats.send(request)

    @api.get("/{chat_id}/stream", response_class=Response, responses={**streamed, 204: {}})
    async def resume(chat_id: str, request: Request) -> Response:
        """Resume the chat's unfinished turn from its start; 204 when there is none."""
        return await chats.resume(chat_id, request)

    @api.post("/{chat_id}/stop", status_code=202, response_model=Interrupted)
    async def stop(chat_id: str, request: Request) -> JSONResponse:
        """Interrupt the chat's turn (a client that only disconnects never does)."""
        return await chats.stop(chat_id, request)

    return api

