"""Run OpenAI Agents SDK agents as stickless live sessions (extra `openai-agents`).

`OpenAIAgentsOpener({agent_ref: Agent})` opens one `OpenAIAgentsSession` per session on the
node that holds it. A turn runs `Runner.run_streamed` over a `TranscriptSession`: the SDK's
history lives in the stickless transcript (each item's own JSON in an entry's `data`), so the
conversation continues on whichever node takes the next turn. The run's stream becomes stickless
frames; interrupts cancel the run; a NOW message joins the running turn (see `inject`).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from collections.abc import Mapping
from typing import Any, cast

from agents import (
    Agent,
    ItemHelpers,
    MessageOutputItem,
    RawResponsesStreamEvent,
    RunConfig,
    RunItemStreamEvent,
    Runner,
    RunResultStreaming,
    SessionSettings,
    StreamEvent,
    ToolCallItem,
    ToolCallOutputItem,
    TResponseInputItem,
)
from agents.run_config import DEFAULT_MAX_TURNS
from openai.types.responses import (
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseTextDeltaEvent,
)
from pydantic_core import to_jsonable_python

from .._events import (
    MessageCompleted,
    ReasoningDelta,
    TextDelta,
    ToolUseFinished,
    ToolUseStarted,
)
from .._session import LiveSession, TurnContext, TurnEnding
from .._types import (
    WIRE_INT_MAX,
    WIRE_INT_MIN,
    MediaPart,
    TranscriptEntry,
    TurnOutput,
    UserInput,
)

#: Keys of a tool call's `input_summary` (the flattened arguments beyond them are left out).
MAX_SUMMARY_KEYS = 32
#: Characters kept of each string in an `input_summary` (and of its keys).
MAX_SUMMARY_CHARS = 200
#: Characters kept of a tool's output in `ToolUseFinished.output_summary`.
MAX_OUTPUT_SUMMARY_CHARS = 1000
#: Characters kept of an item's readable text in its transcript entry's `content`.
MAX_CONTENT_CHARS = 4096
#: Roles whose plain entries (no item in `data`) still read back as messages.
_MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json_text(value: Any) -> str:
    """`value` as text: itself when a string, else its JSON form (pydantic models included)."""
    if isinstance(value, str):
        return value
    return json.dumps(to_jsonable_python(value, fallback=repr), ensure_ascii=False)


def _wire_int(value: Any) -> bool:
    return isinstance(value, int) and WIRE_INT_MIN <= value <= WIRE_INT_MAX


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Dotted keys to primitives (strings cut), up to MAX_SUMMARY_KEYS of them."""
    if len(out) >= MAX_SUMMARY_KEYS:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _flatten(item, f"{prefix}.{index}" if prefix else str(index), out)
    else:
        key = _cut(prefix or "value", MAX_SUMMARY_CHARS)
        if isinstance(value, str):
            out[key] = _cut(value, MAX_SUMMARY_CHARS)
        elif value is None or isinstance(value, float) or _wire_int(value):
            out[key] = value
        else:  # an int outside msgpack's range, or anything else a tool passed through
            out[key] = _cut(str(value), MAX_SUMMARY_CHARS)


def input_summary(raw_call: Any) -> dict[str, Any]:
    """A tool call's arguments as a flat, bounded map of primitives (for `ToolUseStarted`)."""
    arguments = getattr(raw_call, "arguments", None)
    if isinstance(raw_call, Mapping):
        arguments = raw_call.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {"arguments": _cut(arguments, MAX_SUMMARY_CHARS)}
    if arguments is None:  # a hosted tool (shell, computer, ...): its action is the input
        arguments = {
            k: v
            for k, v in to_jsonable_python(raw_call, fallback=repr).items()
            if k not in {"id", "call_id", "type", "status", "name"}
        }
    out: dict[str, Any] = {}
    _flatten(arguments, "", out)
    return out


def _readable(item: Mapping[str, Any]) -> str:
    """The text a person would read of an item (message text, a call, an output)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    if item.get("type") == "function_call":
        return f"{item.get('name', '')}({item.get('arguments', '')})"
    output = item.get("output")
    return output if isinstance(output, str) else ""


def item_entry(item: TResponseInputItem | Mapping[str, Any]) -> TranscriptEntry:
    """The transcript entry of one SDK item: its JSON form as `data`, its text as `content`.

    Raises:
        ValueError: the item nests deeper than 8 levels or encodes above 1 MiB.
    """
    data: dict[str, Any] = to_jsonable_python(item, fallback=repr)
    role = data.get("role")
    if not isinstance(role, str) or not role:
        role = str(data.get("type") or "item")
    return TranscriptEntry(
        role=_cut(role, 100), content=_cut(_readable(data), MAX_CONTENT_CHARS), data=data
    )


def entry_item(entry: TranscriptEntry) -> TResponseInputItem | None:
    """The SDK item an entry holds; a plain message entry (no data) reads as a message, any
    other entry is not part of the model's history (None)."""
    if entry.data:
        return cast(TResponseInputItem, copy.deepcopy(entry.data))
    if entry.role in _MESSAGE_ROLES:
        return cast(TResponseInputItem, {"role": entry.role, "content": entry.content})
    return None


def _media_part(part: MediaPart) -> dict[str, Any]:
    if part.data is not None:
        source = f"data:{part.mime_type};base64,{base64.b64encode(part.data).decode()}"
    else:
        source = part.url or ""
    if part.mime_type.startswith("image/"):
        return {"type": "input_image", "image_url": source, "detail": "auto"}
    if part.data is not None:
        return {"type": "input_file", "file_data": source, "filename": part.name or "file"}
    return {"type": "input_file", "file_url": source}


def run_input(user: UserInput) -> list[TResponseInputItem]:
    """A user input as the SDK's input: one user message (its text, or its parts)."""
    content: str | list[dict[str, Any]] = user.as_text()
    if any(isinstance(part, MediaPart) for part in user.parts):
        content = [
            _media_part(part)
            if isinstance(part, MediaPart)
            else {"type": "input_text", "text": part.text}
            for part in user.parts
        ]
    return [cast(TResponseInputItem, {"role": "user", "content": content})]


class TranscriptSession:
    """The SDK's `Session` over the stickless transcript, cached on the live handle.

    Reads come from the cache, which each turn brings up to date with only the entries
    committed since its version (all of them, once, on a new handle). Items the SDK adds are
    kept until the turn ends and then staged on the turn's transcript, so they commit with the
    turn's outcome (fenced) or not at all; `pop_item` can take back only those. The committed
    history is append-only: `clear_session` refuses once it holds anything, deleting a session's
    history is `SessionRouter.delete_session`.
    """

    session_settings: SessionSettings | None = None

    def __init__(self, session_id: str, settings: SessionSettings | None = None) -> None:
        self.session_id = session_id
        self.session_settings = settings
        self._history: list[TResponseInputItem] = []
        #: The transcript version `_history` reflects.
        self.version = 0
        #: The current turn's items (each with its entry), added by the SDK during the run.
        self._pending: list[tuple[TResponseInputItem, TranscriptEntry]] = []
        #: The last turn's staged items, until `turn_ended` says whether they committed.
        self._staged: list[TResponseInputItem] = []
        self._turn: TurnContext | None = None

    async def begin(self, turn: TurnContext) -> None:
        """Bring the cache up to the committed history (reading only what is new) and take
        writes for `turn`."""
        self._staged = []  # an ending never told leaves them to be read back below
        added = await turn.transcript.load(after=self.version)
        self._history.extend(item for item in map(entry_item, added) if item is not None)
        self.version = turn.transcript.version or 0
        self._pending = []
        self._turn = turn

    async def finish(self) -> None:
        """Stage the turn's items on its transcript (they commit with the turn's outcome)."""
        turn, self._turn = self._turn, None
        pending, self._pending = self._pending, []
        self._staged = [item for item, _ in pending]
        if turn is not None and pending:
            await turn.transcript.append(*(entry for _, entry in pending))

    def ended(self, ending: TurnEnding) -> None:
        """Keep the staged items without reading them back when they committed right after the
        version cached (else the next `begin` reads the history since)."""
        if ending.committed and ending.version == self.version + len(self._staged):
            self._history.extend(self._staged)
            self.version = ending.version
        self._staged = []

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        items = self._history + [item for item, _ in self._pending]
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return copy.deepcopy(items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if self._turn is None:
            raise RuntimeError("items can only be added during a turn (they commit with it)")
        for item in items:
            entry = item_entry(item)
            self._pending.append((cast(TResponseInputItem, entry.data), entry))

    async def pop_item(self) -> TResponseInputItem | None:
        # Only this turn's items can be taken back: committed entries are never removed.
        return self._pending.pop()[0] if self._pending else None

    async def clear_session(self) -> None:
        self._pending = []
        if self._history:
            raise NotImplementedError(
                "the committed history is append-only: SessionRouter.delete_session deletes it"
            )


class OpenAIAgentsSession:
    """One session's live handle: runs its agent over the session's history, turn by turn."""

    def __init__(
        self,
        session_id: str,
        agent: Agent[Any],
        *,
        run_config: RunConfig | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.agent = agent
        self.history = TranscriptSession(session_id, session_settings)
        self._run_config = run_config
        self._max_turns = max_turns
        self._run: RunResultStreaming | None = None
        #: NOW messages taken into the running turn, run once the current run stops.
        self._injected: list[TResponseInputItem] = []
        self._accepting = False

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        await self.history.begin(turn)
        # Either way of interrupting (this handle's `interrupt` or the turn's flag) cancels.
        watch = asyncio.ensure_future(turn.interrupted.wait())
        watch.add_done_callback(lambda done: None if done.cancelled() else self._cancel())
        self._accepting = True
        try:
            tools: dict[str, str] = {}
            next_input = run_input(turn.input)
            while True:
                result = self._run = Runner.run_streamed(
                    self.agent,
                    next_input,
                    run_config=self._run_config,
                    max_turns=self._max_turns,
                    session=self.history,
                )
                if turn.interrupted.is_set():
                    result.cancel()
                async for event in result.stream_events():
                    _relay(turn, event, tools)
                if turn.interrupted.is_set() or not self._injected:
                    break
                # A NOW message arrived: the run stopped after its model turn (and tools);
                # continue in this turn with the history plus the new message.
                next_input, self._injected = self._injected, []
            return TurnOutput(text=_output_text(result.final_output))
        finally:
            self._accepting = False
            self._injected = []
            watch.cancel()
            self._cancel()
            self._run = None
            await self.history.finish()

    async def turn_ended(self, ending: TurnEnding) -> None:
        self.history.ended(ending)

    async def inject(self, item: UserInput) -> bool:
        """Take a NOW message into the running turn: the SDK has no public way to add input to
        a live streamed run, so the run is asked to stop after its current model turn and its
        tool calls (`cancel(mode="after_turn")`), and the turn goes on with a run over the
        history plus this message. False when no run can take it (the turn is ending)."""
        run = self._run
        if run is None or not self._accepting or run.is_complete:
            return False
        self._injected.extend(run_input(item))
        run.cancel(mode="after_turn")
        return True

    async def interrupt(self, reason: str) -> None:
        self._cancel()

    async def aclose(self) -> None:
        self._cancel()

    def _cancel(self) -> None:
        run = self._run
        if run is not None and not run.is_complete:
            run.cancel()  # immediate: cancels the model call and the run's tasks


def _output_text(final_output: Any) -> str:
    return "" if final_output is None else _json_text(final_output)


def _relay(turn: TurnContext, event: StreamEvent, tools: dict[str, str]) -> None:
    """Emit the stickless frame of one SDK stream event (most events have none)."""
    if isinstance(event, RawResponsesStreamEvent):
        data = event.data
        if isinstance(data, ResponseTextDeltaEvent) and data.delta:
            turn.emit(TextDelta(text=data.delta))
        elif (
            isinstance(
                data, ResponseReasoningSummaryTextDeltaEvent | ResponseReasoningTextDeltaEvent
            )
            and data.delta
        ):
            turn.emit(ReasoningDelta(text=data.delta))
    elif isinstance(event, RunItemStreamEvent):
        item = event.item
        if isinstance(item, ToolCallItem):
            call_id = str(item.call_id or "")
            name = item.tool_name or str(getattr(item.raw_item, "type", "tool"))
            tools[call_id] = name
            turn.emit(
                ToolUseStarted(
                    tool_use_id=call_id, name=name, input_summary=input_summary(item.raw_item)
                )
            )
        elif isinstance(item, ToolCallOutputItem):
            call_id = str(item.call_id or "")
            raw = item.raw_item
            status = raw.get("status") if isinstance(raw, Mapping) else getattr(raw, "status", None)
            turn.emit(
                ToolUseFinished(
                    tool_use_id=call_id,
                    name=tools.get(call_id, ""),
                    # A function tool's exception reaches the model as an output text (the
                    # SDK's failure_error_function) and the stream does not mark it: only a
                    # hosted tool's failed status is seen here.
                    ok=status not in ("failed", "incomplete"),
                    output_summary=_cut(_json_text(item.output), MAX_OUTPUT_SUMMARY_CHARS),
                )
            )
        elif isinstance(item, MessageOutputItem):
            turn.emit(MessageCompleted(text=ItemHelpers.text_message_output(item)))


class OpenAIAgentsOpener:
    """A `LiveSessionOpener` over `{agent_ref: Agent}`: each session runs the agent its
    `agent_ref` names (the agents are shared by all sessions; each handle has its history)."""

    def __init__(
        self,
        agents: Mapping[str, Agent[Any]],
        *,
        run_config: RunConfig | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.agents = dict(agents)
        self._run_config = run_config
        self._max_turns = max_turns
        self._settings = session_settings

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        try:
            agent = self.agents[agent_ref]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise LookupError(f"no agent {agent_ref!r} (known: {known})") from None
        return OpenAIAgentsSession(
            session_id,
            agent,
            run_config=self._run_config,
            max_turns=self._max_turns,
            session_settings=self._settings,
        )


__all__ = [
    "OpenAIAgentsOpener",
    "OpenAIAgentsSession",
    "TranscriptSession",
    "entry_item",
    "input_summary",
    "item_entry",
    "run_input",
]
