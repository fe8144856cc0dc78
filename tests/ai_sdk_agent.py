"""The agent of the AI SDK tests (`stickless serve --opener tests.ai_sdk_agent:make_opener`):
a reply streamed word by word, after reasoning and a tool call when asked, stopping when
interrupted.

`submit_options`: `delay` (seconds between words), `story` (a long reply), `tools` (reason,
then call the `clock` tool before replying).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from stickless import (
    LiveSession,
    ReasoningDelta,
    TextDelta,
    ToolUseFinished,
    ToolUseStarted,
    TranscriptEntry,
    TurnContext,
    TurnOutput,
)

#: The long reply of a turn submitted with `story: true` (forty words).
STORY = " ".join(f"word{i}" for i in range(1, 41))


class ClockAgent:
    """One handle per session; see the module docstring for what a turn does."""

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        options = turn.submit_options
        delay = options.get("delay", 0.0)
        delay = float(delay) if isinstance(delay, int | float) else 0.0
        text = turn.input.as_text()
        if options.get("tools"):
            turn.emit(ReasoningDelta(text="The user wants the time; "))
            turn.emit(ReasoningDelta(text="the clock knows."))
            turn.emit(ToolUseStarted(tool_use_id="call-1", name="clock",
                                     input_summary={"tz": "UTC"}))
            turn.emit(ToolUseFinished(tool_use_id="call-1", name="clock", output_summary="12:00"))
        reply = STORY if options.get("story") else f"It is 12:00 UTC. You said: {text}"
        sent: list[str] = []
        for word in reply.split():
            if turn.interrupted.is_set():
                return TurnOutput(text=" ".join(sent))
            turn.emit(TextDelta(text=word if not sent else " " + word))
            sent.append(word)
            await asyncio.sleep(delay)
        await turn.transcript.append(
            TranscriptEntry(role="user", content=text),
            TranscriptEntry(role="assistant", content=reply),
        )
        return TurnOutput(text=reply)

    async def interrupt(self, reason: str) -> None:
        """Nothing to cancel: the turn watches `turn.interrupted`."""

    async def aclose(self) -> None:
        """Nothing to release."""


class ClockOpener:
    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return ClockAgent()


def make_opener() -> ClockOpener:
    return ClockOpener()
