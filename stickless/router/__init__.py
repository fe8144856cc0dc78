"""The node supervisor and its public face, SessionRouter."""

from ._api import (
    ClusterSessionStatus,
    SessionState,
    SubmitDisposition,
    SubmitKind,
    SubmitOrigin,
    TurnInfo,
    TurnState,
)
from ._dead_letters import DeadLetters, ReplayResult, deliver_replay
from ._router import SessionRouter
from ._stream import EventStream, StreamGap
from ._turn_stream import TurnStream, with_gaps

__all__ = [
    "ClusterSessionStatus",
    "DeadLetters",
    "EventStream",
    "ReplayResult",
    "SessionRouter",
    "SessionState",
    "SubmitDisposition",
    "SubmitKind",
    "StreamGap",
    "SubmitOrigin",
    "TurnInfo",
    "TurnState",
    "TurnStream",
    "deliver_replay",
    "with_gaps",
]
