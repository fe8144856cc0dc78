"""What a failed backend call means: an outage a retry may outlast (BackendUnavailableError,
HTTP 503) or a refusal the same call meets every time (InternalError, HTTP 500)."""

from __future__ import annotations

import re
from types import ModuleType

from ._errors import BackendUnavailableError, InternalError, SticklessError

redis_exceptions: ModuleType | None
try:
    from redis import exceptions as redis_exceptions
except ImportError:  # the redis extra is not installed: no Redis errors to tell apart
    redis_exceptions = None

#: Redis error codes (an error reply's first word) of a server that cannot serve the call now
#: but may later: out of memory, busy running a script, loading its data set, a read-only
#: replica, a replica cut from its primary, a failing disk, too few replicas, a script cache
#: flushed under the call, a cluster resharding or down.
TRANSIENT_CODES = frozenset(
    {
        "OOM",
        "BUSY",
        "LOADING",
        "READONLY",
        "MASTERDOWN",
        "MISCONF",
        "NOREPLICAS",
        "NOSCRIPT",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "MOVED",
        "ASK",
    }
)

#: The code of an error reply: its first word, after redis-py's pipeline annotation (which
#: quotes the reply after "caused error: ") when there is one.
_CODE = re.compile(r"""(?:.*caused error: )?[('"\s]*([A-Z]{2,})\b""", re.DOTALL)


def reply_code(message: str) -> str:
    """The upper-case error code a Redis error message starts with ("" when it has none)."""
    match = _CODE.match(message)
    return match.group(1) if match else ""


def refused(exc: BaseException) -> bool:
    """Whether a backend call failed in a way no retry changes: a Redis error reply other than
    the transient ones (`TRANSIENT_CODES`), or a value redis-py refuses to send."""
    if redis_exceptions is None:
        return False
    if isinstance(exc, redis_exceptions.DataError):
        return True
    if not isinstance(exc, redis_exceptions.ResponseError):
        return False  # connection errors and timeouts: the server is out of reach
    transient = (
        redis_exceptions.OutOfMemoryError,
        redis_exceptions.NoScriptError,
        redis_exceptions.ReadOnlyError,
        redis_exceptions.TryAgainError,
        redis_exceptions.ClusterDownError,
        redis_exceptions.AskError,
    )
    if isinstance(exc, transient):
        return False
    # redis-py strips the codes it maps to a class (ERR among them); an unmapped code (BUSY,
    # MISCONF, NOREPLICAS) stays at the start of the message.
    return reply_code(str(exc)) not in TRANSIENT_CODES


def store_error(exc: BaseException) -> SticklessError:
    """The stickless error a failed backend call surfaces as (a stickless error stays itself)."""
    if isinstance(exc, SticklessError):
        return exc
    message = f"{type(exc).__name__}: {exc}"
    return InternalError(message) if refused(exc) else BackendUnavailableError(message)


def unavailable_cause(error: BaseException) -> BackendUnavailableError | None:
    """The store outage behind `error`: itself when it is a BackendUnavailableError, or the one
    it was raised from (or while handling), as an agent framework may wrap it; else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, BackendUnavailableError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
