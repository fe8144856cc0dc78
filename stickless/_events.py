"""Turn event frames streamed to subscribers on every node."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    field_validator,
)

from ._errors import FailureCode
from ._trace import TraceContext
from ._types import PrimitiveMap, WireStr


class _Frame(BaseModel):
    """Fields every frame carries; the relay stamps them, the agent leaves them empty."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    session_id: StrictStr = ""
    turn_id: StrictStr = ""
    #: The run of the turn the frame belongs to (1-based; seq counts within one attempt).
    attempt: StrictInt = 1
    seq: int = 0
    event_id: StrictStr | None = None
    #: The W3C trace and span of the turn ('' for a frame no trace reached): a subscriber on
    #: any node can join its logs and spans to the request that started the turn.
    trace_id: StrictStr = ""
    span_id: StrictStr = ""


class _TerminalFrame(_Frame):
    """A frame that ends its turn; it names the node that ran the turn (or decided its end)."""

    executed_by: WireStr = ""
    #: Set when only this attempt ended: the turn runs again as the next attempt (its holder
    #: was lost, or it failed under a retry policy), so the frame does not end the turn.
    retrying: StrictBool = False


#: The seq of a terminal frame another node sends for a turn it declared lost: above any seq the
#: turn's own relay gives, so it still orders after the turn's frames.
LATE_TERMINAL_SEQ = 2**31 - 1


class TurnStarted(_Frame):
    type: Literal["turn_started"] = "turn_started"
    executed_by: WireStr = ""
    #: Fencing token of the lease the turn runs under. Turns start in token order, so a turn
    #: started under a newer token tells a reader that any turn of an older one still open
    #: (its holder lost, its late terminal frame not read yet) had ended before it.
    token: StrictInt = 0


class TextDelta(_Frame):
    type: Literal["text_delta"] = "text_delta"
    text: WireStr


class ReasoningDelta(_Frame):
    type: Literal["reasoning_delta"] = "reasoning_delta"
    text: WireStr


class ToolUseStarted(_Frame):
    type: Literal["tool_use_started"] = "tool_use_started"
    tool_use_id: WireStr
    name: WireStr
    input_summary: PrimitiveMap = Field(default_factory=dict)


class ToolUseFinished(_Frame):
    type: Literal["tool_use_finished"] = "tool_use_finished"
    tool_use_id: WireStr
    name: WireStr
    ok: StrictBool = True
    output_summary: WireStr = ""


class MessageCompleted(_Frame):
    type: Literal["message_completed"] = "message_completed"
    text: WireStr


class TurnCompleted(_TerminalFrame):
    type: Literal["turn_completed"] = "turn_completed"
    text: WireStr = ""
    data: PrimitiveMap = Field(default_factory=dict)


class TurnFailed(_TerminalFrame):
    type: Literal["turn_failed"] = "turn_failed"
    code: FailureCode = FailureCode.FAILED
    message: WireStr = ""

    @field_validator("code", mode="before")
    @classmethod
    def _known_code(cls, value: object) -> object:
        # A code from a newer node degrades to FAILED instead of dropping the frame.
        return FailureCode.parse(value) if isinstance(value, str) else value


class Interrupted(_TerminalFrame):
    type: Literal["interrupted"] = "interrupted"
    reason: WireStr


class Rejected(_TerminalFrame):
    type: Literal["rejected"] = "rejected"
    reason: WireStr
    message: WireStr = ""


Event = Annotated[
    TurnStarted
    | TextDelta
    | ReasoningDelta
    | ToolUseStarted
    | ToolUseFinished
    | MessageCompleted
    | TurnCompleted
    | TurnFailed
    | Interrupted
    | Rejected,
    Field(discriminator="type"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)

TERMINAL_EVENTS = (TurnCompleted, TurnFailed, Interrupted, Rejected)


def unfinished_frame(code: FailureCode, reason: str, **fields: object) -> Interrupted | TurnFailed:
    """The terminal frame of a turn that did not complete, saying what its answer says: the
    user's interrupt is `interrupted` (with their reason), every other end `turn_failed` with
    its code (HOLDER_LOST, LEASE_LOST, SHUTDOWN, EVICTED, ...)."""
    if code is FailureCode.INTERRUPTED:
        return Interrupted.model_validate({"reason": reason, **fields})
    return TurnFailed.model_validate({"code": code, "message": reason, **fields})


def trace_fields(trace: TraceContext | None) -> dict[str, str]:
    """The frame fields that name `trace` (none for no trace)."""
    if trace is None:
        return {}
    return {"trace_id": trace.trace_id, "span_id": trace.span_id}


def frame_trace(frame: Event) -> TraceContext | None:
    """The trace and span a frame names (None: none, or ids that are not valid)."""
    if not frame.trace_id:
        return None
    try:
        return TraceContext(trace_id=frame.trace_id, span_id=frame.span_id)
    except ValueError:
        return None


def traced(frame: Event, trace: TraceContext | None) -> Event:
    """The frame naming `trace`, unless it names one already (or there is none)."""
    if trace is None or frame.trace_id:
        return frame
    return frame.model_copy(update=trace_fields(trace))


def lost_frame(
    session_id: str,
    turn_id: str,
    holder: str,
    message: str,
    trace: TraceContext | None,
    *,
    retrying_attempt: int | None = None,
) -> Event:
    """The HOLDER_LOST frame another node writes for a turn whose holder stopped answering:
    late (after any of the turn's own), naming the turn's trace; with `retrying_attempt`, only
    that attempt ended and the turn runs again."""
    frame = TurnFailed(
        session_id=session_id,
        turn_id=turn_id,
        seq=LATE_TERMINAL_SEQ,
        code=FailureCode.HOLDER_LOST,
        message=message,
        executed_by=holder,
        **({} if retrying_attempt is None else {"attempt": retrying_attempt, "retrying": True}),
    )
    return traced(frame, trace)


def is_terminal(event: Event) -> bool:
    """True for the frames that end a turn for a subscriber (not an attempt that is retried)."""
    return isinstance(event, TERMINAL_EVENTS) and not event.retrying


def drop_rank(event: Event) -> int:
    """Overflow rank: reasoning (0) is shed before text (1), before everything else (2)."""
    if isinstance(event, ReasoningDelta):
        return 0
    if isinstance(event, TextDelta):
        return 1
    return 2
