"""The node supervisor and its public face, SessionRouter."""

from ._api import ClusterSessionStatus, SessionState, SubmitDisposition, SubmitKind
from ._router import SessionRouter
from ._stream import EventStream

__all__ = [
    "ClusterSessionStatus",
    "EventStream",
    "SessionRouter",
    "SessionState",
    "SubmitDisposition",
    "SubmitKind",
]
