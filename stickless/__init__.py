"""stickless: serialize AI-agent chat session turns across a cluster without sticky routing."""

from ._config import DeploymentMode, RouterConfig
from ._errors import (
    BackendUnavailableError,
    ConflictingAgentError,
    DeadLetterNotFoundError,
    FailureCode,
    FrameTooLargeError,
    IdempotencyConflictError,
    InputTooLargeError,
    InternalError,
    InvalidRequestError,
    ReplayRefusedError,
    RouterClosedError,
    SessionBusyError,
    SticklessError,
    StoreMisconfiguredError,
    TurnConflictingAgentError,
    TurnFailedError,
    UnknownTurnError,
)
from ._events import (
    Event,
    Interrupted,
    MessageCompleted,
    ReasoningDelta,
    Rejected,
    TextDelta,
    ToolUseFinished,
    ToolUseStarted,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
    is_terminal,
)
from ._metrics import NOOP_METRICS, NoopMetrics, SessionMetrics
from ._retry import RetryPolicy, TerminalError
from ._session import (
    LiveSession,
    LiveSessionOpener,
    SupportsInject,
    SupportsTurnEnding,
    Transcript,
    TurnContext,
    TurnEnding,
)
from ._types import (
    CommittedEntry,
    MediaPart,
    Principal,
    Priority,
    SubmitRequest,
    TextPart,
    TranscriptEntry,
    TurnOutput,
    TurnResult,
    UserInput,
)
from .backends.base import FencedOut
from .backends.memory import MemoryBackends
from .router import (
    ClusterSessionStatus,
    EventStream,
    SessionRouter,
    SessionState,
    StreamGap,
    SubmitDisposition,
    SubmitKind,
    SubmitOrigin,
    TurnInfo,
    TurnState,
    TurnStream,
)


def __getattr__(name: str) -> object:
    # Optional extras load lazily so `import stickless` never needs redis or ray installed.
    if name == "RedisBackends":
        from .backends.redis import RedisBackends

        return RedisBackends
    raise AttributeError(f"module 'stickless' has no attribute {name!r}")


__all__ = [
    "NOOP_METRICS",
    "BackendUnavailableError",
    "ClusterSessionStatus",
    "CommittedEntry",
    "ConflictingAgentError",
    "DeadLetterNotFoundError",
    "DeploymentMode",
    "Event",
    "EventStream",
    "FailureCode",
    "FencedOut",
    "FrameTooLargeError",
    "IdempotencyConflictError",
    "InputTooLargeError",
    "InternalError",
    "Interrupted",
    "InvalidRequestError",
    "LiveSession",
    "LiveSessionOpener",
    "MediaPart",
    "MemoryBackends",
    "MessageCompleted",
    "NoopMetrics",
    "Principal",
    "Priority",
    "ReasoningDelta",
    "RedisBackends",
    "Rejected",
    "ReplayRefusedError",
    "RetryPolicy",
    "RouterClosedError",
    "StoreMisconfiguredError",
    "RouterConfig",
    "SessionBusyError",
    "SessionMetrics",
    "SessionRouter",
    "SessionState",
    "SticklessError",
    "StreamGap",
    "SubmitDisposition",
    "SubmitKind",
    "SubmitOrigin",
    "SubmitRequest",
    "SupportsInject",
    "SupportsTurnEnding",
    "TerminalError",
    "TextDelta",
    "TextPart",
    "ToolUseFinished",
    "ToolUseStarted",
    "Transcript",
    "TranscriptEntry",
    "TurnCompleted",
    "TurnConflictingAgentError",
    "TurnContext",
    "TurnEnding",
    "TurnFailed",
    "TurnFailedError",
    "TurnInfo",
    "TurnOutput",
    "TurnResult",
    "TurnState",
    "TurnStream",
    "TurnStarted",
    "UnknownTurnError",
    "UserInput",
    "is_terminal",
]
