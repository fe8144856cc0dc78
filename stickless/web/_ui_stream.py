"""stickless turn frames as the AI SDK's UI message stream parts (protocol `v1`: SSE `data:`
lines of JSON chunks, ended by `data: [DONE]`; see the README, "AI SDK (useChat)").

`UIMessageEncoder` is the pure part: one per streamed turn, fed frames in order, it returns the
chunks each one becomes, keeping the SDK's rules (a text or reasoning part is opened before its
deltas and closed before anything else starts; a tool output follows its call).
"""

from __future__ import annotations

import json
from typing import Any

from .._events import (
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
)

#: The header a UI message stream response carries, as the SDK's own server sets it.
UI_STREAM_HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
#: The data part saying frames of the turn are missing from the stream (see `gap`).
GAP_PART = "data-stickless-gap"
#: The last line of every UI message stream.
DONE = b"data: [DONE]\n\n"

Chunk = dict[str, Any]


def sse_chunk(chunk: Chunk) -> bytes:
    """One chunk as the SDK's SSE line."""
    return f"data: {json.dumps(chunk, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


class UIMessageEncoder:
    """The UI message chunks of one turn's frames (one assistant message, id = the turn id)."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        #: The kind ("text" / "reasoning") and id of the part now open, if any.
        self._open: tuple[str, str] | None = None
        self._parts = 0
        self._tools: set[str] = set()
        #: Whether the turn's first frame was seen (else the stream starts mid-turn: a gap).
        self._started = False
        self._streamed_text = False
        self.finished = False

    def start(self) -> list[Chunk]:
        """The stream's first chunk: the assistant message's id."""
        return [{"type": "start", "messageId": self.turn_id}]

    def frame(self, event: Event) -> list[Chunk]:
        """The chunks of one frame of the turn (none for frames the SDK has no part for)."""
        chunks: list[Chunk] = []
        if not self._started and not isinstance(event, TurnStarted):
            self._started = True
            if not _is_end(event):
                chunks += self.gap({"turn_id": self.turn_id, "attempt": event.attempt,
                                    "seq": event.seq})
        if isinstance(event, TurnStarted):
            self._started = True
            return [*chunks, {"type": "start-step"}]
        if isinstance(event, TextDelta | ReasoningDelta):
            return chunks + self._delta(event)
        if isinstance(event, MessageCompleted):
            return chunks + self._close()
        if isinstance(event, ToolUseStarted | ToolUseFinished):
            return chunks + self._tool(event)
        if isinstance(event, TurnCompleted | TurnFailed | Interrupted | Rejected):
            return chunks + self._end(event)
        return chunks

    def gap(self, detail: dict[str, Any]) -> list[Chunk]:
        """A data part saying frames are missing here (the event log no longer held them)."""
        return [*self._close(), {"type": GAP_PART, "data": detail}]

    def error(self, message: str) -> list[Chunk]:
        """The stream broke after its 200 (the store went away): an error part ends it."""
        self.finished = True
        return [*self._close(), {"type": "error", "errorText": message}]

    def _delta(self, event: TextDelta | ReasoningDelta) -> list[Chunk]:
        kind = "text" if isinstance(event, TextDelta) else "reasoning"
        chunks: list[Chunk] = []
        if self._open is None or self._open[0] != kind:
            chunks += self._close()
            self._parts += 1
            self._open = (kind, f"{kind}-{self._parts}")
            chunks.append({"type": f"{kind}-start", "id": self._open[1]})
        if kind == "text":
            self._streamed_text = True
        return [*chunks, {"type": f"{kind}-delta", "id": self._open[1], "delta": event.text}]

    def _tool(self, event: ToolUseStarted | ToolUseFinished) -> list[Chunk]:
        chunks = self._close()
        call = event.tool_use_id
        if isinstance(event, ToolUseStarted) or call not in self._tools:
            # The SDK refuses an output for a call it never saw: a finish whose start was not
            # streamed (a gap) announces the call first, with the input unknown.
            given = event.input_summary if isinstance(event, ToolUseStarted) else {}
            self._tools.add(call)
            chunks.append({"type": "tool-input-available", "toolCallId": call,
                           "toolName": event.name, "input": dict(given), "dynamic": True})
        if isinstance(event, ToolUseFinished):
            if event.ok:
                chunks.append({"type": "tool-output-available", "toolCallId": call,
                               "output": event.output_summary, "dynamic": True})
            else:
                chunks.append({"type": "tool-output-error", "toolCallId": call,
                               "errorText": event.output_summary or "the tool failed",
                               "dynamic": True})
        return chunks

    def _end(self, event: TurnCompleted | TurnFailed | Interrupted | Rejected) -> list[Chunk]:
        chunks = self._close()
        if event.retrying:
            # Only this attempt ended: the turn runs again, as the SDK's next step.
            return [*chunks, {"type": "finish-step"}]
        self.finished = True
        meta = {"stickless": {"turnId": self.turn_id, "executedBy": event.executed_by}}
        if isinstance(event, TurnCompleted):
            if event.text and not self._streamed_text:
                # An answer whose frames the log no longer holds: its text, whole.
                chunks += [{"type": "text-start", "id": "text-answer"},
                           {"type": "text-delta", "id": "text-answer", "delta": event.text},
                           {"type": "text-end", "id": "text-answer"}]
            finish = {"type": "finish", "finishReason": "stop", "messageMetadata": meta}
            return [*chunks, {"type": "finish-step"}, finish]
        if isinstance(event, Interrupted):
            # As the SDK's own server ends a stream its caller aborted: no finish part.
            return [*chunks, {"type": "abort", "reason": event.reason}]
        if isinstance(event, TurnFailed):
            text = f"{event.code.value}: {event.message}" if event.message else event.code.value
        else:
            text = f"REJECTED ({event.reason}): {event.message}" if event.message else (
                f"REJECTED ({event.reason})")
        finish = {"type": "finish", "finishReason": "error", "messageMetadata": meta}
        return [*chunks, {"type": "error", "errorText": text}, finish]

    def _close(self) -> list[Chunk]:
        if self._open is None:
            return []
        kind, part = self._open
        self._open = None
        return [{"type": f"{kind}-end", "id": part}]


def _is_end(event: Event) -> bool:
    return isinstance(event, TurnCompleted | TurnFailed | Interrupted | Rejected)
