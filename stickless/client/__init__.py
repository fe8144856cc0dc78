"""A Python client of the HTTP gateway (extra `client`: httpx): `Client` (blocking) and
`AsyncClient` (asyncio), with streams that resume by themselves (see the README, "Serve over
HTTP")."""

try:
    import httpx  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "stickless.client needs httpx: pip install 'stickless[client]' (or the package with "
        "its client extra from a clone: pip install '.[client]')"
    ) from exc

from ._async import AsyncClient, AsyncEventStream
from ._core import (
    Accepted,
    Backoff,
    ErrorDetail,
    Gap,
    HttpStatusError,
    StreamEvent,
    StreamItem,
    TurnOutput,
    TurnView,
    UnauthenticatedError,
    UnknownSessionError,
)
from ._sync import Client, EventStream

__all__ = [
    "Accepted",
    "AsyncClient",
    "AsyncEventStream",
    "Backoff",
    "Client",
    "ErrorDetail",
    "EventStream",
    "Gap",
    "HttpStatusError",
    "StreamEvent",
    "StreamItem",
    "TurnOutput",
    "TurnView",
    "UnauthenticatedError",
    "UnknownSessionError",
]
