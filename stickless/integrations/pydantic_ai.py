"""A pydantic-ai `Agent` as a stickless live session (extra `pydantic-ai`): streamed text,
thinking and tool calls become stickless frames, and the agent's own message history lives in
the session's transcript, so the conversation goes on on whichever node holds it next.

Each message of a run is one transcript entry whose `data` holds the message's JSON form
(`{"pydantic_ai": ...}`), so history is restored exactly. A session keeps the history it read
and loads only what other nodes committed since (see the README, "A history the session
caches"). A NOW message is injected into the running turn only while one of its tools runs:
pydantic-ai then delivers it with the tool's result in the very next model request (at any
other moment the run may end first, so the message runs as a turn of its own instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    AgentStreamEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
    UserPromptPart,
)

from .._events import ReasoningDelta, TextDelta, ToolUseFinished, ToolUseStarted
from .._session import TurnContext, TurnEnding
from .._types import CommittedEntry, TranscriptEntry, TurnOutput, UserInput

#: The `data` key of an entry that holds one pydantic-ai message (its JSON form).
MESSAGE_KEY = "pydantic_ai"
#: The same, as a JSON string: for a message nested deeper (or bigger) than an entry's data
#: may be structured.
MESSAGE_JSON_KEY = "pydantic_ai_json"
#: Longest tool input value / output summary put in a frame (longer ones are cut).
SUMMARY_CHARS = 500


class PydanticAIOpener:
    """Opens a `PydanticAISession` over the agent named by the session's `agent_ref`."""

    def __init__(self, agents: Mapping[str, Agent[Any, Any]]) -> None:
        self._agents = dict(agents)

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> PydanticAISession:
        """Raises: KeyError: no agent is registered under `agent_ref`."""
        agent = self._agents.get(agent_ref)
        if agent is None:
            raise KeyError(
                f"no pydantic-ai agent named {agent_ref!r} (have {sorted(self._agents)})"
            )
        return PydanticAISession(agent, session_id)


class PydanticAISession:
    """One session's agent runs, with the history it has read so far."""

    def __init__(self, agent: Agent[Any, Any], session_id: str) -> None:
        self.agent = agent
        self.session_id = session_id
        #: The conversation as of `version` (the transcript's committed version).
        self.messages: list[ModelMessage] = []
        self.version = 0
        #: Entries the last turn read from the store (0 when its cache was current).
        self.last_loaded = 0
        self._staged: list[ModelMessage] = []
        self._run_ctx: RunContext[Any] | None = None
        self._tools_running = 0

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        added = await turn.transcript.load(after=self.version)
        self.last_loaded = len(added)
        self.messages.extend(messages_of(added))
        self.version = turn.transcript.version or 0
        self._staged = []
        streamed: list[str] = []
        run = asyncio.ensure_future(
            self.agent.run(
                prompt_of(turn.input),
                message_history=list(self.messages),
                event_stream_handler=self._handler(turn, streamed),
            )
        )
        stopped = asyncio.ensure_future(turn.interrupted.wait())
        try:
            await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not run.done():
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
            self._run_ctx = None
        if turn.interrupted.is_set() and not (run.done() and not run.cancelled()):
            # What the user saw so far, for `commit_partial_on_interrupt` to keep.
            self._staged = [
                ModelRequest(parts=[UserPromptPart(content=prompt_of(turn.input))]),
                ModelResponse(parts=[TextPart(content="".join(streamed))]),
            ]
            await turn.transcript.append(*entries_of(self._staged))
            return TurnOutput(text="".join(streamed))
        result = run.result()
        self._staged = list(result.new_messages())
        await turn.transcript.append(*entries_of(self._staged))
        output = result.output
        return TurnOutput(
            text=output if isinstance(output, str) else json.dumps(output, default=str)
        )

    def _handler(self, turn: TurnContext, streamed: list[str]) -> Any:
        async def on_events(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
            self._run_ctx = ctx
            async for event in events:
                frame = self._frame_of(event)
                if frame is None:
                    continue
                if isinstance(frame, TextDelta):
                    streamed.append(frame.text)
                turn.emit(frame)

        return on_events

    def _frame_of(self, event: AgentStreamEvent) -> Any:
        """The stickless frame of a pydantic-ai stream event (None: nothing to show)."""
        if isinstance(event, PartStartEvent):
            part = event.part
            if isinstance(part, TextPart) and part.content:
                return TextDelta(text=part.content)
            if isinstance(part, ThinkingPart) and part.content:
                return ReasoningDelta(text=part.content)
        elif isinstance(event, PartDeltaEvent):
            delta = event.delta
            if isinstance(delta, TextPartDelta) and delta.content_delta:
                return TextDelta(text=delta.content_delta)
            if isinstance(delta, ThinkingPartDelta) and delta.content_delta:
                return ReasoningDelta(text=delta.content_delta)
        elif isinstance(event, FunctionToolCallEvent):
            self._tools_running += 1
            call = event.part
            return ToolUseStarted(
                tool_use_id=call.tool_call_id,
                name=call.tool_name,
                input_summary=summary_of(call.args_as_dict()),
            )
        elif isinstance(event, FunctionToolResultEvent):
            self._tools_running = max(0, self._tools_running - 1)
            returned = event.part
            return ToolUseFinished(
                tool_use_id=returned.tool_call_id,
                name=returned.tool_name,
                ok=returned.outcome == "success",
                output_summary=_cut(returned.model_response_str()),
            )
        return None

    async def inject(self, item: UserInput) -> bool:
        """Take a NOW message into the running turn while one of its tools runs (see the
        module's docstring); False otherwise."""
        ctx = self._run_ctx
        if ctx is None or self._tools_running == 0:
            return False
        ctx.enqueue(prompt_of(item))
        return True

    async def turn_ended(self, ending: TurnEnding) -> None:
        """Keep the turn's own messages when they committed right after what this session had
        read; otherwise the next turn reads them back with whatever else was committed."""
        if ending.committed and ending.version == self.version + len(self._staged):
            self.messages.extend(self._staged)
            self.version = ending.version
        self._staged = []

    async def interrupt(self, reason: str) -> None:
        return None  # `turn.interrupted` is set: `run_turn` cancels the run

    async def aclose(self) -> None:
        self.messages = []


def prompt_of(item: UserInput) -> str:
    """The text of a user input (media parts are not passed to the agent)."""
    return item.as_text()


def entries_of(messages: Sequence[ModelMessage]) -> list[TranscriptEntry]:
    """One transcript entry per message: its JSON form in `data`, its text in `content`."""
    dumped = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    entries = []
    for message, data in zip(messages, dumped, strict=True):
        role = "user" if isinstance(message, ModelRequest) else "assistant"
        content = _text_of(message)
        try:
            entries.append(TranscriptEntry(role=role, content=content, data={MESSAGE_KEY: data}))
        except ValueError:  # nested deeper than an entry's data may be: kept as a JSON string
            text = json.dumps(data, ensure_ascii=False)
            entries.append(
                TranscriptEntry(role=role, content=content, data={MESSAGE_JSON_KEY: text})
            )
    return entries


def messages_of(entries: Sequence[CommittedEntry]) -> list[ModelMessage]:
    """The pydantic-ai messages stored in committed entries (others are skipped).

    Raises:
        ValueError: an entry's message is not a pydantic-ai message (names the entry).
    """
    raw: list[Any] = []
    for entry in entries:
        if MESSAGE_KEY in entry.data:
            raw.append(entry.data[MESSAGE_KEY])
        elif MESSAGE_JSON_KEY in entry.data:
            raw.append(json.loads(str(entry.data[MESSAGE_JSON_KEY])))
    try:
        return list(ModelMessagesTypeAdapter.validate_python(raw))
    except ValidationError as exc:
        raise ValueError(f"transcript holds an unreadable pydantic-ai message: {exc}") from None


def summary_of(args: Mapping[str, Any]) -> dict[str, str | int | float | bool | None]:
    """Tool arguments as a flat map of primitives (nested values as cut JSON text)."""
    flat: dict[str, str | int | float | bool | None] = {}
    for key, value in args.items():
        if (
            value is None
            or isinstance(value, bool | float)
            or (isinstance(value, int) and -(2**63) <= value < 2**63)
        ):
            flat[str(key)] = value
        elif isinstance(value, str):
            flat[str(key)] = _cut(value)
        else:
            flat[str(key)] = _cut(json.dumps(value, ensure_ascii=False, default=str))
    return flat


def _text_of(message: ModelMessage) -> str:
    """The message's plain text: user prompts and response text (not tool calls, thinking)."""
    texts: list[str] = []
    for part in message.parts:
        content = getattr(part, "content", None)
        if isinstance(part, UserPromptPart | TextPart) and isinstance(content, str):
            texts.append(content)
    return "\n".join(texts)


def _cut(text: str) -> str:
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "\u2026"


__all__ = ["PydanticAIOpener", "PydanticAISession"]
