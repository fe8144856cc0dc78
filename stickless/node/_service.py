"""The application-facing facade of one node: primitives in, primitives out.

Both the loopback node server (separate OS processes) and the Ray node router wrap a
`NodeService`, so a submit from either returns a small ticket and the result is fetched later:
by session and turn id on any node (the router's stored lookup), or by turn id alone on the
node that took the submit, which keeps each turn's answer until it is collected or expires.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from .._errors import (
    BackendUnavailableError,
    ConflictingAgentError,
    FailureCode,
    IdempotencyConflictError,
    InputTooLargeError,
    InternalError,
    InvalidRequestError,
    RouterClosedError,
    SessionBusyError,
    SticklessError,
    TurnConflictingAgentError,
    TurnFailedError,
    UnknownTurnError,
)
from .._session import LiveSessionOpener
from .._types import TurnResult
from ..router import SessionRouter, SubmitDisposition, TurnStream

_ERRORS: dict[str, type[SticklessError]] = {
    cls.__name__: cls
    for cls in (
        SticklessError,
        BackendUnavailableError,
        ConflictingAgentError,
        IdempotencyConflictError,
        InputTooLargeError,
        InternalError,
        InvalidRequestError,
        RouterClosedError,
        SessionBusyError,
        UnknownTurnError,
    )
}


def error_to_wire(error: BaseException) -> dict[str, Any]:
    """An error as primitives (type name, message, and the failure code for turn failures)."""
    if isinstance(error, TurnFailedError):
        return {
            "type": "TurnFailedError",
            "code": error.code.value,
            "message": error.detail,
            "session_id": error.session_id,
            "turn_id": error.turn_id,
        }
    # (a subclass travels as the nearest error the other side knows: NotLive as
    # BackendUnavailableError)
    if isinstance(error, TimeoutError):
        return {"type": "TimeoutError", "message": str(error)}
    name = next(
        (c.__name__ for c in type(error).__mro__ if c.__name__ in _ERRORS), "SticklessError"
    )
    message = (
        error.message if isinstance(error, SticklessError) else f"{type(error).__name__}: {error}"
    )
    return {"type": name, "message": message}


def error_from_wire(raw: Mapping[str, Any]) -> Exception:
    """Rebuild an error sent by `error_to_wire` (unknown types become SticklessError)."""
    message = str(raw.get("message", ""))
    if raw.get("type") == "TimeoutError":
        return TimeoutError(message)
    if raw.get("type") == "TurnFailedError":
        return TurnFailedError.of(
            FailureCode.parse(str(raw.get("code", ""))),
            message,
            session_id=str(raw.get("session_id", "")),
            turn_id=str(raw.get("turn_id", "")),
        )
    cls = _ERRORS.get(str(raw.get("type")), SticklessError)
    return cls(message)


def load_opener(path: str) -> LiveSessionOpener:
    """Import `package.module:attribute`: an opener, or a zero-argument factory of one. The
    current directory is searched first (as `python -m` and uvicorn do), so a module beside
    the command needs no PYTHONPATH.

    Raises:
        ValueError: the path is malformed, its module is not found, or it names something
            that is not an opener (the message says which).
    """
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"opener must look like 'package.module:attribute', got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not f"{module_name}.".startswith(f"{exc.name}."):
            raise  # the opener's module was found, and itself imports a missing one
        raise ValueError(
            f"opener {path!r}: no module named {exc.name!r} in the current directory "
            f"({os.getcwd()}) or the installed packages"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"opener {path!r}: {module_name} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not hasattr(target, "open") and callable(target):
        target = target()
    if not hasattr(target, "open"):
        raise ValueError(f"{path!r} is neither a LiveSessionOpener nor a factory of one")
    opener: LiveSessionOpener = target
    return opener


class NodeService:
    """Ticket-based access to one router for callers in other processes."""

    def __init__(self, router: SessionRouter) -> None:
        self.router = router
        self._results: dict[str, asyncio.Future[TurnResult]] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}

    async def submit(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Submit; returns a ticket {kind, turn_id, node_id, session_id, attached, origin}."""
        disposition = await self.router.submit(request)
        self._keep(disposition)
        return ticket_of(disposition)

    def _keep(self, disposition: SubmitDisposition) -> None:
        turn_id = disposition.turn_id
        existing = self._results.get(turn_id)
        if existing is not None and not existing.done():
            return  # an attach to a turn this node already follows
        self._results[turn_id] = disposition.result
        handle = self._expiry.pop(turn_id, None)
        if handle is not None:
            handle.cancel()
        # Unclaimed answers are dropped after the forward TTL (plus the time to run).
        keep_for = 2 * self.router.config.forward_ttl
        self._expiry[turn_id] = asyncio.get_running_loop().call_later(
            keep_for, self._forget, turn_id
        )

    def _forget(self, turn_id: str) -> None:
        self._results.pop(turn_id, None)
        self._expiry.pop(turn_id, None)

    async def result(
        self,
        turn_id: str,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the API's bound)
    ) -> dict[str, Any]:
        """Await a turn: with `session_id` any turn of the cluster (`SessionRouter.result`),
        else one submitted through this node.

        Raises:
            TurnFailedError: the turn did not succeed.
            UnknownTurnError: with `session_id`, the session has no such turn.
            TimeoutError: with `session_id`, no answer within `timeout` seconds.
            InvalidRequestError: without `session_id`, this node has no such turn (never
                submitted here, or expired).
        """
        if session_id is not None:
            found = await self.router.result(session_id, turn_id, timeout=timeout)
            return found.model_dump(mode="python")
        future = self._results.get(turn_id)
        if future is None:
            raise InvalidRequestError(f"turn_id: no turn {turn_id!r} was submitted on this node")
        result = await asyncio.shield(future)
        return result.model_dump(mode="python")

    async def run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Submit and await the result."""
        ticket = await self.submit(request)
        return await self.result(str(ticket["turn_id"]))

    async def turn(self, session_id: str, turn_id: str) -> dict[str, Any]:
        """The turn's state and answer as primitives (see SessionRouter.turn)."""
        return (await self.router.turn(session_id, turn_id)).model_dump(mode="json")

    async def transcript(self, session_id: str) -> list[dict[str, Any]]:
        """The session's committed transcript as primitives (see SessionRouter.transcript)."""
        return [entry.model_dump(mode="json") for entry in await self.router.transcript(session_id)]

    async def stream(self, request: Mapping[str, Any]) -> TurnStream:
        """Submit and follow the turn (see SessionRouter.stream); its result is also kept for
        `result(turn_id)` here. The caller closes the stream."""
        stream = await self.router.stream(request)
        self._keep(stream.disposition)
        return stream

    async def interrupt(
        self, session_id: str, reason: str = "USER", turn_id: str | None = None
    ) -> bool:
        """Whether a turn was interrupted or cancelled (see SessionRouter.interrupt)."""
        return await self.router.interrupt(session_id, reason=reason, turn_id=turn_id)

    async def release_session(self, session_id: str) -> None:
        await self.router.release_session(session_id)

    async def delete_session(self, session_id: str) -> None:
        await self.router.delete_session(session_id)

    async def status(self, session_id: str) -> dict[str, Any]:
        return (await self.router.status(session_id)).model_dump(mode="json")

    async def aclose(self, grace: float = 5.0) -> None:
        for handle in self._expiry.values():
            handle.cancel()
        self._expiry.clear()
        await self.router.aclose(grace=grace)


def ticket_of(disposition: SubmitDisposition) -> dict[str, Any]:
    """The primitives of a disposition a caller elsewhere needs to follow its turn."""
    return {
        "kind": disposition.kind.value,
        "turn_id": disposition.turn_id,
        "node_id": disposition.node_id,
        "session_id": disposition.session_id,
        "attached": disposition.attached,
        "origin": disposition.origin.value,
        "trace_id": disposition.trace.trace_id if disposition.trace is not None else "",
    }


__all__ = [
    "NodeService",
    "TurnConflictingAgentError",
    "error_from_wire",
    "error_to_wire",
    "load_opener",
    "ticket_of",
]
