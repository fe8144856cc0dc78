"""The JSON bodies of the HTTP API (requests validated at the edge; answers documented in
OpenAPI)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..router import TurnInfo


class TurnBody(BaseModel):
    """`POST /v1/sessions/{sid}/turns`: one user message."""

    model_config = ConfigDict(extra="forbid")
    agent_ref: str
    #: The message text, or its parts (`{"type": "text", "text": ...}` / media parts).
    input: str | list[dict[str, Any]]
    priority: Literal["NOW", "NEXT", "LATER"] | None = None
    submit_options: dict[str, Any] = Field(default_factory=dict)


class InterruptBody(BaseModel):
    """`POST /v1/sessions/{sid}/interrupt`: which turn (default: the running one) and why."""

    model_config = ConfigDict(extra="forbid")
    turn_id: str | None = None
    reason: str = Field(default="USER", min_length=1, max_length=200)


class TurnAccepted(BaseModel):
    """The 202 answer of a submit: the turn's id and how the submit got it."""

    turn_id: str
    session_id: str
    status: Literal["queued", "running", "completed", "failed"]
    origin: Literal["new", "attached", "cached"]
    #: The W3C trace of the turn: every event of the turn names it.
    trace_id: str | None = None


class ResultBody(BaseModel):
    text: str
    data: dict[str, Any]


class ErrorDetail(BaseModel):
    code: str
    message: str


class TurnView(BaseModel):
    """`GET /v1/sessions/{sid}/turns/{tid}`."""

    turn_id: str
    session_id: str
    state: Literal["queued", "running", "completed", "failed"]
    executed_by: str | None
    attempt: int
    result: ResultBody | None = None
    error: ErrorDetail | None = None

    @classmethod
    def of(cls, info: TurnInfo) -> TurnView:
        result = None
        if info.result is not None:
            result = ResultBody(text=info.result.text, data=dict(info.result.data))
        error = None
        if info.failure_code is not None:
            error = ErrorDetail(code=info.failure_code.value, message=info.failure_message or "")
        return cls(
            turn_id=info.turn_id,
            session_id=info.session_id,
            state=info.state.value,
            executed_by=info.executed_by,
            attempt=info.attempt,
            result=result,
            error=error,
        )


class Interrupted(BaseModel):
    interrupted: bool


class Transcript(BaseModel):
    session_id: str
    entries: list[dict[str, Any]]
