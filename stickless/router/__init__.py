"""The node supervisor and its public face, SessionRouter."""

from ._api import ClusterSessionStatus, SessionState, SubmitDisposition, SubmitKind
from ._dead_letters import DeadLetters, ReplayResult, deliver_replay
from ._router import SessionRouter
from ._stream import EventStream

__all__ = [
    "ClusterSessionStatus",
    "DeadLetters",
    "EventStream",
    "ReplayResult",
    "SessionRouter",
    "SessionState",
    "SubmitDisposition",
    "SubmitKind",
    "deliver_replay",
]
