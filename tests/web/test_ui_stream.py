"""The mapping of turn frames to the AI SDK's UI message chunks (`UIMessageEncoder`), as a table:
frames in, chunks out."""

from __future__ import annotations

from typing import Any

import pytest

from stickless import FailureCode
from stickless._events import (
    Event,
    Interrupted,
    MessageCompleted,
    ReasoningDelta,
    TextDelta,
    ToolUseFinished,
    ToolUseStarted,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
)
from stickless.web._ui_stream import UIMessageEncoder

T = "turn-1"
META = {"stickless": {"turnId": T, "executedBy": "web-1"}}
START = TurnStarted(turn_id=T, seq=0, executed_by="web-1")
DONE_OK = TurnCompleted(turn_id=T, seq=9, executed_by="web-1", text="hi")

CASES: list[tuple[str, list[Event], list[dict[str, Any]]]] = [
    (
        "text deltas share one part; reasoning opens another, closing the text",
        [START, TextDelta(turn_id=T, seq=1, text="a"), TextDelta(turn_id=T, seq=2, text="b"),
         ReasoningDelta(turn_id=T, seq=3, text="r"), TextDelta(turn_id=T, seq=4, text="c"),
         DONE_OK],
        [{"type": "start-step"},
         {"type": "text-start", "id": "text-1"},
         {"type": "text-delta", "id": "text-1", "delta": "a"},
         {"type": "text-delta", "id": "text-1", "delta": "b"},
         {"type": "text-end", "id": "text-1"},
         {"type": "reasoning-start", "id": "reasoning-2"},
         {"type": "reasoning-delta", "id": "reasoning-2", "delta": "r"},
         {"type": "reasoning-end", "id": "reasoning-2"},
         {"type": "text-start", "id": "text-3"},
         {"type": "text-delta", "id": "text-3", "delta": "c"},
         {"type": "text-end", "id": "text-3"},
         {"type": "finish-step"},
         {"type": "finish", "finishReason": "stop", "messageMetadata": META}],
    ),
    (
        "a finished message closes its part; a tool call is a dynamic tool with its output",
        [START, TextDelta(turn_id=T, seq=1, text="a"), MessageCompleted(turn_id=T, seq=2, text="a"),
         ToolUseStarted(turn_id=T, seq=3, tool_use_id="c1", name="clock",
                        input_summary={"tz": "UTC"}),
         ToolUseFinished(turn_id=T, seq=4, tool_use_id="c1", name="clock", output_summary="12:00"),
         DONE_OK],
        [{"type": "start-step"},
         {"type": "text-start", "id": "text-1"},
         {"type": "text-delta", "id": "text-1", "delta": "a"},
         {"type": "text-end", "id": "text-1"},
         {"type": "tool-input-available", "toolCallId": "c1", "toolName": "clock",
          "input": {"tz": "UTC"}, "dynamic": True},
         {"type": "tool-output-available", "toolCallId": "c1", "output": "12:00", "dynamic": True},
         {"type": "finish-step"},
         {"type": "finish", "finishReason": "stop", "messageMetadata": META}],
    ),
    (
        "a stream starting mid-turn says so; a failed tool whose call was lost is announced",
        [ToolUseFinished(turn_id=T, seq=5, tool_use_id="c1", name="clock", ok=False,
                         output_summary="boom"),
         Interrupted(turn_id=T, seq=6, executed_by="web-1", reason="USER")],
        [{"type": "data-stickless-gap", "data": {"turn_id": T, "attempt": 1, "seq": 5}},
         {"type": "tool-input-available", "toolCallId": "c1", "toolName": "clock", "input": {},
          "dynamic": True},
         {"type": "tool-output-error", "toolCallId": "c1", "errorText": "boom", "dynamic": True},
         {"type": "abort", "reason": "USER"}],
    ),
    (
        "an answer without its frames (the log dropped them) comes whole, without a gap",
        [DONE_OK],
        [{"type": "text-start", "id": "text-answer"},
         {"type": "text-delta", "id": "text-answer", "delta": "hi"},
         {"type": "text-end", "id": "text-answer"},
         {"type": "finish-step"},
         {"type": "finish", "finishReason": "stop", "messageMetadata": META}],
    ),
    (
        "a lost attempt ends its step; the retry is the next; a failure is an error part",
        [START, TextDelta(turn_id=T, seq=1, text="a"),
         TurnFailed(turn_id=T, seq=2, executed_by="web-1", code=FailureCode.HOLDER_LOST,
                    message="gone", retrying=True),
         TurnStarted(turn_id=T, attempt=2, seq=0, executed_by="web-1"),
         TurnFailed(turn_id=T, attempt=2, seq=1, executed_by="web-1",
                    code=FailureCode.HOLDER_LOST, message="gone")],
        [{"type": "start-step"},
         {"type": "text-start", "id": "text-1"},
         {"type": "text-delta", "id": "text-1", "delta": "a"},
         {"type": "text-end", "id": "text-1"},
         {"type": "finish-step"},
         {"type": "start-step"},
         {"type": "error", "errorText": "HOLDER_LOST: gone"},
         {"type": "finish", "finishReason": "error", "messageMetadata": META}],
    ),
]


@pytest.mark.parametrize(("frames", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_frames_become_ui_message_chunks(
    frames: list[Event], expected: list[dict[str, Any]]
) -> None:
    encoder = UIMessageEncoder(T)
    assert encoder.start() == [{"type": "start", "messageId": T}]
    chunks = [chunk for frame in frames for chunk in encoder.frame(frame)]
    assert chunks == expected
    assert encoder.finished


def test_a_retried_attempt_does_not_finish_the_message() -> None:
    encoder = UIMessageEncoder(T)
    encoder.frame(START)
    encoder.frame(TurnFailed(turn_id=T, seq=1, code=FailureCode.HOLDER_LOST, retrying=True))
    assert not encoder.finished


def test_a_broken_stream_closes_its_part_and_ends_with_an_error() -> None:
    encoder = UIMessageEncoder(T)
    encoder.frame(START)
    encoder.frame(TextDelta(turn_id=T, seq=1, text="a"))
    assert encoder.error("BackendUnavailableError: gone") == [
        {"type": "text-end", "id": "text-1"},
        {"type": "error", "errorText": "BackendUnavailableError: gone"},
    ]
    assert encoder.finished
