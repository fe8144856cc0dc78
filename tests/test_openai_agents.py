"""The OpenAI Agents SDK adapter: an `agents.Agent` behind stickless, over a model defined here
that streams the Responses API events the SDK reads (gated by asyncio events, never timers).

A conversation continues on whichever node runs the next turn, tool calls and reasoning reach a
subscriber on another node, an interrupt from any node cancels the model's stream, a NOW message
joins the running turn, and a long history is read once per handle, then only what is new."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, ModelResponse, RunConfig, Usage, function_tool
from agents.models.interface import Model
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseTextDeltaEvent,
)
from openai.types.responses.response_reasoning_item import Summary

from stickless import (
    FailureCode,
    LiveSession,
    Priority,
    SessionRouter,
    SubmitRequest,
    TextDelta,
    Transcript,
    TranscriptEntry,
    TurnContext,
    TurnEnding,
    UserInput,
)
from stickless.integrations.openai_agents import (
    OpenAIAgentsOpener,
    OpenAIAgentsSession,
    entry_item,
    input_summary,
    item_entry,
)
from stickless.testing import LocalCluster

from .agents import failure_code
from .conftest import BACKENDS, FAST

# --------------------------------------------------------------------------- the fake model


@dataclass
class Reply:
    """One model response: reasoning, then text streamed word by word, or a tool call."""

    text: str = ""
    reasoning: str = ""
    #: (call id, tool name, JSON arguments): the response calls that tool instead of answering.
    tool: tuple[str, str, str] | None = None
    #: Extra assistant messages before the text (to grow a long history in one response).
    filler: int = 0
    #: The stream waits here after its first text delta (until set, or cancelled).
    gate: asyncio.Event | None = None


class FakeModel(Model):
    """Answers each call with the next scripted `Reply`, recording what it was sent (a plain
    class: the SDK copies a dataclass model's fields to identify the agent)."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        #: The input items of every call, in order.
        self.inputs: list[list[dict[str, Any]]] = []
        #: Set once a gated stream has sent its first delta.
        self.waiting = asyncio.Event()
        #: How many streams were cancelled before they finished.
        self.cancelled = 0

    def _next(self, input: str | list[Any]) -> Reply:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.inputs.append([dict(item) for item in items])
        return self.replies.pop(0)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        reply = self._next(args[1])
        return ModelResponse(output=_output(reply), usage=Usage(), response_id="r")

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        reply = self._next(args[1])
        seq = iter(range(10_000))
        yield ResponseCreatedEvent(
            type="response.created", response=_response([], "in_progress"), sequence_number=0
        )
        try:
            if reply.reasoning:
                yield ResponseReasoningSummaryTextDeltaEvent(
                    type="response.reasoning_summary_text.delta",
                    item_id="rs-1",
                    output_index=0,
                    summary_index=0,
                    delta=reply.reasoning,
                    sequence_number=next(seq),
                )
            for index, word in enumerate(reply.text.split(" ")):
                yield ResponseTextDeltaEvent(
                    type="response.output_text.delta",
                    item_id="msg",
                    output_index=0,
                    content_index=0,
                    delta=word if index == 0 else " " + word,
                    logprobs=[],
                    sequence_number=next(seq),
                )
                if reply.gate is not None and index == 0:
                    self.waiting.set()
                    await reply.gate.wait()
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise
        yield ResponseCompletedEvent(
            type="response.completed",
            response=_response(_output(reply), "completed"),
            sequence_number=next(seq),
        )


def _message(text: str, item_id: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def _output(reply: Reply) -> list[Any]:
    output: list[Any] = []
    if reply.reasoning:
        output.append(
            ResponseReasoningItem(
                id="rs-1", type="reasoning", summary=[Summary(type="summary_text", text="…")]
            )
        )
    output += [_message(f"filler {n}", f"f-{n}") for n in range(reply.filler)]
    if reply.tool is not None:
        call_id, name, arguments = reply.tool
        output.append(
            ResponseFunctionToolCall(
                id=call_id, call_id=call_id, type="function_call", name=name, arguments=arguments
            )
        )
    else:
        output.append(_message(reply.text, "msg"))
    return output


def _response(output: list[Any], status: Any) -> Response:
    return Response(
        id="resp",
        created_at=0,
        model="fake",
        object="response",
        output=output,
        tool_choice="auto",
        tools=[],
        parallel_tool_calls=False,
        status=status,
    )


@function_tool
def get_weather(city: str, days: int) -> str:
    """The weather in a city for the next days."""
    return f"sunny in {city} for {days} days"


def _opener(model: FakeModel, session: type[OpenAIAgentsSession] = OpenAIAgentsSession) -> Any:
    agent = Agent(name="assistant", instructions="Be brief.", model=model, tools=[get_weather])
    run_config = RunConfig(tracing_disabled=True)
    if session is OpenAIAgentsSession:
        return OpenAIAgentsOpener({"assistant": agent}, run_config=run_config)

    class Opener(OpenAIAgentsOpener):
        async def open(
            self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
        ) -> LiveSession:
            return session(session_id, self.agents[agent_ref], run_config=run_config)

    return Opener({"assistant": agent})


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> pytest.FixtureRequest:
    return request


def _cluster(request: pytest.FixtureRequest, opener: Any, **overrides: Any) -> LocalCluster:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        return LocalCluster.over_redis(url, 3, opener=opener, **{**FAST, **overrides})
    return LocalCluster(3, opener=opener, **{**FAST, **overrides})


def _req(text: str, **kw: Any) -> SubmitRequest:
    return SubmitRequest(session_id="s1", agent_ref="assistant", input=text, **kw)


def _said(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of the messages in a model call's input."""
    said = []
    for item in items:
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        if "role" in item:
            said.append((item["role"], content))
    return said


# --------------------------------------------------------------------------- across nodes


async def test_a_conversation_continues_on_whichever_node_runs_the_turn(
    backend: pytest.FixtureRequest,
) -> None:
    model = FakeModel([Reply("Hi Ann."), Reply("You are Ann."), Reply("Bye Ann.")])
    async with _cluster(backend, _opener(model)) as cluster:
        ran = []
        for node, text in zip(cluster.nodes, ["I am Ann", "Who am I?", "Bye"], strict=True):
            result = await (await node.submit(_req(text))).result
            ran.append((result.executed_by, result.text))
            await node.release_session("s1")  # the next turn opens a new handle elsewhere
    assert ran == [
        (cluster.nodes[0].node_id, "Hi Ann."),
        (cluster.nodes[1].node_id, "You are Ann."),
        (cluster.nodes[2].node_id, "Bye Ann."),
    ]
    # Each call saw the earlier turns' items, restored from the transcript on a new node
    assert [_said(items) for items in model.inputs] == [
        [("user", "I am Ann")],
        [("user", "I am Ann"), ("assistant", "Hi Ann."), ("user", "Who am I?")],
        [
            ("user", "I am Ann"),
            ("assistant", "Hi Ann."),
            ("user", "Who am I?"),
            ("assistant", "You are Ann."),
            ("user", "Bye"),
        ],
    ]


async def _frames(router: SessionRouter, submit_on: SessionRouter, request: SubmitRequest) -> list:
    stream = router.events("s1")
    await stream.ready()
    disp = await submit_on.submit(request)
    frames = []
    async for event in stream:
        frames.append(event)
        if event.type in ("turn_completed", "turn_failed", "interrupted"):
            break
    await stream.aclose()
    await disp.result
    return frames


async def test_tool_calls_and_reasoning_reach_a_subscriber_on_another_node(
    backend: pytest.FixtureRequest,
) -> None:
    model = FakeModel(
        [
            Reply(
                reasoning="Need the weather.",
                tool=("call-1", "get_weather", '{"city": "Oslo", "days": 2}'),
            ),
            Reply("Sunny for two days."),
        ]
    )
    async with _cluster(backend, _opener(model)) as cluster:
        a, _, c = cluster.nodes
        frames = await _frames(c, a, _req("Weather in Oslo?"))
    shown = [
        (f.type, getattr(f, "text", None) or getattr(f, "tool_use_id", None))
        for f in frames
        if f.type != "turn_started"
    ]
    assert shown == [
        ("reasoning_delta", "Need the weather."),
        ("tool_use_started", "call-1"),
        ("tool_use_finished", "call-1"),
        ("text_delta", "Sunny"),
        ("text_delta", " for"),
        ("text_delta", " two"),
        ("text_delta", " days."),
        ("message_completed", "Sunny for two days."),
        ("turn_completed", "Sunny for two days."),
    ]
    started, finished = frames[2], frames[3]
    assert (started.name, started.input_summary) == ("get_weather", {"city": "Oslo", "days": 2})
    assert (finished.name, finished.ok) == ("get_weather", True)
    assert finished.output_summary == "sunny in Oslo for 2 days"
    # The tool's call and output are the second call's input
    assert [item.get("type") for item in model.inputs[1]][-2:] == [
        "function_call",
        "function_call_output",
    ]


async def test_an_interrupt_from_another_node_cancels_the_model_stream(
    backend: pytest.FixtureRequest,
) -> None:
    gate = asyncio.Event()  # never set: only the interrupt ends this stream
    model = FakeModel([Reply("Once upon a time", gate=gate), Reply("Hello.")])
    # A grace far beyond the test's timeout: the turn must end by the adapter's own cancel,
    # not by the router cancelling the turn's task.
    async with _cluster(backend, _opener(model), interrupt_grace=600.0) as cluster:
        a, b, c = cluster.nodes
        stream = c.events("s1")
        await stream.ready()
        disp = await a.submit(_req("Tell me a story"))
        async for event in stream:
            if isinstance(event, TextDelta):
                break
        await stream.aclose()
        assert event.text == "Once"
        assert await b.interrupt("s1", reason="USER")
        assert await failure_code(disp.result) is FailureCode.INTERRUPTED
        assert model.cancelled == 1
        # Nothing of the interrupted turn committed: the next turn starts from an empty history
        result = await (await b.submit(_req("Hi"))).result
    assert result.text == "Hello."
    assert _said(model.inputs[1]) == [("user", "Hi")]


async def test_a_now_message_joins_the_running_turn(backend: pytest.FixtureRequest) -> None:
    gate = asyncio.Event()
    model = FakeModel([Reply("Counting to ten", gate=gate), Reply("Stopped counting.")])
    offers: asyncio.Queue[bool] = asyncio.Queue()

    class Recording(OpenAIAgentsSession):
        async def inject(self, item: UserInput) -> bool:
            taken = await super().inject(item)
            offers.put_nowait(taken)
            return taken

    async with _cluster(backend, _opener(model, Recording)) as cluster:
        a, b, _ = cluster.nodes
        first = await a.submit(_req("Count to ten"))
        await model.waiting.wait()
        urgent = await b.submit(_req("Stop counting", priority=Priority.NOW))
        assert await offers.get() is True
        gate.set()  # the run stops after this model response and goes on with the message
        results = [await first.result, await urgent.result]
    assert [r.text for r in results] == ["Stopped counting."] * 2
    assert _said(model.inputs[1]) == [
        ("user", "Count to ten"),
        ("assistant", "Counting to ten"),
        ("user", "Stop counting"),
    ]


class Spying(OpenAIAgentsSession):
    """Records what each turn read from the transcript: (turn input, after, entries read)."""

    loads: list[tuple[str, int, int]]

    async def run_turn(self, turn: TurnContext) -> Any:
        read = turn.transcript.load

        async def load(after: int = 0) -> list[Any]:
            entries = await read(after)
            self.loads.append((turn.input.as_text(), after, len(entries)))
            return entries

        turn.transcript.load = load  # type: ignore[method-assign]
        return await super().run_turn(turn)


async def test_a_long_history_is_read_once_per_handle_then_only_what_is_new(
    backend: pytest.FixtureRequest,
) -> None:
    # The first response holds 498 messages and an answer: with the user's, 500 items
    model = FakeModel([Reply("Done.", filler=498), Reply("Still here."), Reply("Yes.")])
    Spying.loads = []
    async with _cluster(backend, _opener(model, Spying)) as cluster:
        a, b, _ = cluster.nodes
        await (await a.submit(_req("Fill"))).result
        await a.release_session("s1")
        await (await b.submit(_req("Still there?"))).result  # a new handle, on B
        await (await b.submit(_req("Sure?"))).result  # the same handle
        entries = await b.transcript("s1")
    assert Spying.loads == [
        ("Fill", 0, 0),
        ("Still there?", 0, 500),  # B's new handle reads the whole history once
        ("Sure?", 502, 0),  # its own entries it kept when told they committed at 502
    ]
    # Yet every call saw the whole history, and the transcript holds each item once
    assert [len(items) for items in model.inputs] == [1, 501, 503]
    assert _said(model.inputs[2])[-3:] == [
        ("user", "Still there?"),
        ("assistant", "Still here."),
        ("user", "Sure?"),
    ]
    assert len(entries) == 504
    assert [entry_item(e) for e in entries[-4:-1]] == model.inputs[2][-3:]


# --------------------------------------------------------------------------- one handle


async def _no_history(after: int) -> tuple[list[Any], int]:
    return [], 0


def _turn(text: str) -> tuple[TurnContext, list[Any]]:
    frames: list[Any] = []
    turn = TurnContext(
        session_id="s1",
        turn_id="t1",
        input=UserInput.text(text),
        priority=Priority.NEXT,
        submit_options={},
        initiator=None,
        emitter=frames.append,
        transcript=Transcript(_no_history),
    )
    return turn, frames


@pytest.mark.parametrize("how", ["flag", "interrupt"])
async def test_either_way_of_interrupting_cancels_the_run(how: str) -> None:
    model = FakeModel([Reply("Once upon a time", gate=asyncio.Event())])
    agent = Agent(name="assistant", model=model)
    session = OpenAIAgentsSession("s1", agent, run_config=RunConfig(tracing_disabled=True))
    turn, frames = _turn("Tell me a story")
    running = asyncio.ensure_future(session.run_turn(turn))
    await model.waiting.wait()
    if how == "flag":
        turn.interrupted.set()  # the flag alone (a router sets it before calling interrupt)
    else:
        await session.interrupt("USER")
    output = await running
    assert (output.text, model.cancelled) == ("", 1)
    assert [f.text for f in frames if isinstance(f, TextDelta)] == ["Once"]
    # What the run had added is staged (it commits only if the deployment keeps partials)
    assert [e.content for e in turn.transcript.staged] == ["Tell me a story"]
    await session.turn_ended(TurnEnding(turn_id="t1", result="INTERRUPTED", committed=False))
    assert await session.history.get_items() == []


def test_tool_arguments_are_summarised_flat_and_bounded() -> None:
    call = ResponseFunctionToolCall(
        call_id="c",
        type="function_call",
        name="search",
        arguments='{"q": "' + "x" * 500 + '", "filters": {"site": "a.org", "years": [2020, 2021]}}',
    )
    summary = input_summary(call)
    assert summary == {
        "q": "x" * 199 + "…",
        "filters.site": "a.org",
        "filters.years.0": 2020,
        "filters.years.1": 2021,
    }
    assert input_summary({"arguments": "not json"}) == {"arguments": "not json"}
    assert len(input_summary({"arguments": {f"k{i}": i for i in range(100)}})) == 32


def test_items_round_trip_through_transcript_entries() -> None:
    item = {"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"a": 1}'}
    entry = item_entry(item)
    assert (entry.role, entry.content, entry.data) == ("function_call", 'f({"a": 1})', item)
    assert entry_item(entry) == item
    # A plain entry another agent wrote reads as a message; anything else is not history
    assert entry_item(TranscriptEntry(role="user", content="hi")) == {
        "role": "user",
        "content": "hi",
    }
    assert entry_item(TranscriptEntry(role="note", content="x")) is None


async def test_the_example_runs_three_turns_offline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    from examples.openai_agents_app import main

    await main()
    printed = capsys.readouterr().out
    assert "[get_weather {'city': 'Oslo'}] [-> It is sunny in Oslo.]" in printed
    # The third turn, on the third node, still knew the first two
    assert "(offline, message 3 of this session) You said: Thanks!" in printed
    ran_on = [line.split()[-1] for line in printed.splitlines() if "(ran on" in line]
    assert len(set(ran_on)) == 3


async def test_a_user_interrupt_commits_what_the_run_had_added_when_partials_are_kept() -> None:
    model = FakeModel([Reply("Once upon a time", gate=asyncio.Event()), Reply("Hello.")])
    opener = _opener(model)
    async with LocalCluster(2, opener=opener, commit_partial_on_interrupt=True, **FAST) as cluster:
        a, b = cluster.nodes
        disp = await a.submit(_req("Tell me a story"))
        await model.waiting.wait()
        assert await b.interrupt("s1", reason="USER")
        assert await failure_code(disp.result) is FailureCode.INTERRUPTED
        await (await b.submit(_req("Hi"))).result
        entries = await b.transcript("s1")
    # The SDK had saved the user's message when the run began; the reply was cut off unsaved
    assert [(e.content, e.partial) for e in entries[:1]] == [("Tell me a story", True)]
    assert _said(model.inputs[1]) == [("user", "Tell me a story"), ("user", "Hi")]
