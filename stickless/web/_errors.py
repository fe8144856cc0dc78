"""Errors as HTTP answers: `{"error": {"code", "message"}}` with the status each one means."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.requests import Request

from .._errors import (
    BackendUnavailableError,
    ConflictingAgentError,
    EventCursorAheadError,
    IdempotencyConflictError,
    InputTooLargeError,
    InternalError,
    InvalidRequestError,
    RouterClosedError,
    SessionBusyError,
    UnknownTurnError,
)
from .._types import field_errors
from ._auth import Unauthenticated

#: Seconds a client should wait before retrying a 503.
RETRY_AFTER = "1"


class HttpError(Exception):
    """An answer the gateway decided itself (unknown session, oversized input, ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _json(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(error_body(code, message), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "request"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def error_response(exc: Exception) -> Response | None:
    """The HTTP answer of an error the routes may raise, or None for a bug (then a 500)."""
    if isinstance(exc, HttpError):
        return _json(exc.status, exc.code, exc.message)
    if isinstance(exc, RequestValidationError):
        return _json(400, "INVALID_REQUEST", _validation_message(exc))
    if isinstance(exc, ValidationError):
        return _json(400, "INVALID_REQUEST", field_errors(exc))
    if isinstance(exc, InputTooLargeError):
        return _json(413, "INPUT_TOO_LARGE", exc.message)
    if isinstance(exc, InvalidRequestError):
        return _json(400, "INVALID_REQUEST", exc.message)
    if isinstance(exc, EventCursorAheadError):
        return _json(400, "INVALID_CURSOR", exc.message or "the cursor was not issued by this log")
    if isinstance(exc, Unauthenticated):
        return _json(401, "UNAUTHENTICATED", str(exc), {"WWW-Authenticate": "Bearer"})
    if isinstance(exc, UnknownTurnError):
        return _json(404, "UNKNOWN_TURN", exc.message)
    if isinstance(exc, ConflictingAgentError):
        return _json(409, "CONFLICTING_AGENT", exc.message)
    if isinstance(exc, IdempotencyConflictError):
        return _json(409, "IDEMPOTENCY_CONFLICT", exc.message)
    if isinstance(exc, SessionBusyError):
        return _json(409, "SESSION_BUSY", exc.message)
    if isinstance(exc, BackendUnavailableError):
        return _json(503, "BACKEND_UNAVAILABLE", exc.message, {"Retry-After": RETRY_AFTER})
    if isinstance(exc, RouterClosedError):
        return _json(503, "ROUTER_CLOSED", exc.message, {"Retry-After": RETRY_AFTER})
    if isinstance(exc, InternalError):  # no Retry-After: the same request fails the same way
        return _json(500, "INTERNAL_ERROR", exc.message)
    return None


class MappedErrorsRoute(APIRoute):
    """A route whose errors are answered as `error_response` says, so an `APIRouter` mounted
    in someone else's app answers the same as `create_app` does."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def mapped(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                response = error_response(exc)
                if response is None:
                    raise
                return response

        return mapped
