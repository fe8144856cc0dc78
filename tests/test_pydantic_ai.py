"""The pydantic-ai adapter with the framework's own offline model (FunctionModel): a
conversation whose turns run on different nodes continues its history, tool calls and thinking
stream as stickless frames, an interrupt stops the run, and a long history loads once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaThinkingPart, DeltaToolCall, FunctionModel

from stickless import (
    Event,
    FailureCode,
    ReasoningDelta,
    SubmitRequest,
    TextDelta,
    ToolUseFinished,
    ToolUseStarted,
    TurnFailedError,
    TurnStream,
    UserInput,
)
from stickless.integrations.pydantic_ai import PydanticAIOpener, PydanticAISession, entries_of
from stickless.testing import LocalCluster

from .agents import wait_until
from .commits import commit_turn
from .conftest import BACKENDS, FAST


@dataclass
class Model:
    """A scripted model: what each request saw, and a gate for a turn that must hang."""

    seen: list[list[ModelMessage]] = field(default_factory=list)
    hang: asyncio.Event = field(default_factory=asyncio.Event)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: list[str] = field(default_factory=list)

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | dict[int, Any]]:
        self.seen.append(list(messages))
        last = messages[-1]
        if any(isinstance(p, ToolReturnPart) for p in last.parts):
            (returned,) = [p for p in last.parts if isinstance(p, ToolReturnPart)]
            yield f"It is {returned.content}."
            return
        prompt = _prompts(messages)[-1]
        if "weather" in prompt:
            yield {0: DeltaThinkingPart(content="I should look it up.")}
            yield {
                1: DeltaToolCall(name="weather", json_args='{"city": "Paris"}', tool_call_id="c1")
            }
            return
        if prompt == "slow":
            yield "Once upon "
            self.entered.set()
            try:
                await self.hang.wait()
            except asyncio.CancelledError:
                self.cancelled.append(prompt)
                raise
            yield "a time."
            return
        yield f"heard {prompt!r} after {len(_prompts(messages)) - 1} earlier prompt(s)"


def _prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


def _agent(model: Model) -> Agent[None, str]:
    agent = Agent(FunctionModel(stream_function=model.stream))

    @agent.tool_plain
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    return agent


class CapturingOpener(PydanticAIOpener):
    """Keeps the sessions it opened, to see what each turn read."""

    def __init__(self, agents: Mapping[str, Agent[Any, Any]]) -> None:
        super().__init__(agents)
        self.opened: list[PydanticAISession] = []

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> PydanticAISession:
        session = await super().open(session_id, agent_ref, attributes)
        self.opened.append(session)
        return session


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest) -> Any:
    def build(opener: PydanticAIOpener, nodes: int = 2, **overrides: Any) -> LocalCluster:
        config = {**FAST, **overrides}
        if request.param == "redis":
            url = request.getfixturevalue("redis_url")
            return LocalCluster.over_redis(url, nodes, opener=opener, **config)
        return LocalCluster(nodes, opener=opener, **config)

    return build


def _req(text: str) -> SubmitRequest:
    return SubmitRequest(session_id="s1", agent_ref="assistant", input=text)


async def _frames(stream: TurnStream) -> list[Event]:
    async with stream:
        return [frame async for frame in stream]


async def test_a_conversation_goes_on_across_nodes(make: Any) -> None:
    model = Model()
    async with make(PydanticAIOpener({"assistant": _agent(model)}), nodes=3) as cluster:
        a, b, c = cluster.nodes
        answers = []
        for node, text in ((a, "hello"), (b, "how are you"), (c, "bye")):
            answers.append((await (await node.submit(_req(text))).result).text)
            await node.release_session("s1")  # the next turn opens the session elsewhere
    # Each turn ran on another node's new handle, and the model saw every earlier prompt
    assert answers == [
        "heard 'hello' after 0 earlier prompt(s)",
        "heard 'how are you' after 1 earlier prompt(s)",
        "heard 'bye' after 2 earlier prompt(s)",
    ]
    assert _prompts(model.seen[-1]) == ["hello", "how are you", "bye"]
    # ...with the earlier responses restored exactly (the framework's own messages)
    responses = [m for m in model.seen[-1] if isinstance(m, ModelResponse)]
    assert [p.content for m in responses for p in m.parts if isinstance(p, TextPart)] == [
        "heard 'hello' after 0 earlier prompt(s)",
        "heard 'how are you' after 1 earlier prompt(s)",
    ]


async def test_thinking_and_tool_calls_stream_as_frames(make: Any) -> None:
    model = Model()
    async with make(PydanticAIOpener({"assistant": _agent(model)})) as cluster:
        a, b = cluster.nodes
        await (await a.submit(_req("hi"))).result
        # Streamed from B, run on A
        frames = await _frames(await b.stream(_req("what is the weather")))
    kinds = [frame.type for frame in frames]
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_completed"
    (thought,) = [f for f in frames if isinstance(f, ReasoningDelta)]
    (started,) = [f for f in frames if isinstance(f, ToolUseStarted)]
    (finished,) = [f for f in frames if isinstance(f, ToolUseFinished)]
    assert thought.text == "I should look it up."
    assert (started.tool_use_id, started.name, started.input_summary) == (
        "c1",
        "weather",
        {"city": "Paris"},
    )
    assert (finished.tool_use_id, finished.name, finished.ok) == ("c1", "weather", True)
    assert "sunny in Paris" in finished.output_summary
    assert kinds.index("tool_use_started") < kinds.index("tool_use_finished")
    text = "".join(f.text for f in frames if isinstance(f, TextDelta))
    assert text == "It is sunny in Paris."
    assert frames[-1].type == "turn_completed" and frames[-1].text == text  # type: ignore[union-attr]


@pytest.mark.parametrize("commit_partial", [True, False])
async def test_an_interrupt_stops_the_run_and_keeps_what_was_seen_when_asked(
    make: Any, commit_partial: bool
) -> None:
    model = Model()
    opener = PydanticAIOpener({"assistant": _agent(model)})
    async with make(opener, commit_partial_on_interrupt=commit_partial) as cluster:
        a, b = cluster.nodes
        running = await a.submit(_req("slow"))
        await model.entered.wait()
        # The user stops it from the other node
        assert await b.interrupt("s1") is True
        with pytest.raises(TurnFailedError) as failure:
            await running.result
        after = (await (await a.submit(_req("next"))).result).text
    assert failure.value.code is FailureCode.INTERRUPTED
    assert model.cancelled == ["slow"]  # the model's stream was cancelled, not left running
    history = model.seen[-1]
    if commit_partial:
        # The next turn's history holds what the user saw of the stopped one
        assert _prompts(history) == ["slow", "next"]
        texts = [p.content for m in history for p in m.parts if isinstance(p, TextPart)]
        assert texts == ["Once upon "]
        assert after == "heard 'next' after 1 earlier prompt(s)"
    else:
        assert _prompts(history) == ["next"]


async def test_a_long_history_loads_once_then_only_what_is_new(make: Any) -> None:
    model = Model()
    opener = CapturingOpener({"assistant": _agent(model)})
    async with make(opener) as cluster:
        a, _ = cluster.nodes
        # Given 500 committed messages (250 exchanges) of this session
        earlier: list[ModelMessage] = []
        for n in range(250):
            earlier.append(ModelRequest(parts=[UserPromptPart(content=f"q{n}")]))
            earlier.append(ModelResponse(parts=[TextPart(content=f"a{n}")]))
        await cluster.backends.records.provision("s1", "assistant", 1)
        await commit_turn(cluster.backends, "s1", 1, "seed", entries_of(earlier))
        # When two turns run on one node
        first = (await (await a.submit(_req("one"))).result).text
        loaded_first = opener.opened[0].last_loaded
        second = (await (await a.submit(_req("two"))).result).text
        loaded_second = opener.opened[0].last_loaded
    # Then the first read the 500 messages, the second nothing (its cache was current)
    assert len(opener.opened) == 1
    assert (loaded_first, loaded_second) == (500, 0)
    assert first == "heard 'one' after 250 earlier prompt(s)"
    assert second == "heard 'two' after 251 earlier prompt(s)"
    assert len(model.seen[-1]) == 500 + 2 + 1


class InjectRecordingSession(PydanticAISession):
    """Records which NOW messages the adapter took into the running turn."""

    injected: list[tuple[str, bool]]

    async def inject(self, item: UserInput) -> bool:
        taken = await super().inject(item)
        self.injected.append((item.as_text(), taken))
        return taken


async def test_a_now_message_joins_the_turn_while_a_tool_runs(make: Any) -> None:
    tool_running, release = asyncio.Event(), asyncio.Event()
    requests: list[list[str]] = []

    async def model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        last = messages[-1]
        requests.append([str(p.content) for p in last.parts if isinstance(p, UserPromptPart)])
        if any(isinstance(p, ToolReturnPart) for p in last.parts):
            yield f"done, also read {requests[-1]}"
            return
        yield {0: DeltaToolCall(name="lookup", json_args="{}", tool_call_id="t1")}

    agent = Agent(FunctionModel(stream_function=model))

    @agent.tool_plain
    async def lookup() -> str:
        """A slow lookup."""
        tool_running.set()
        await release.wait()
        return "found"

    injected: list[tuple[str, bool]] = []

    class Opener(PydanticAIOpener):
        async def open(
            self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
        ) -> PydanticAISession:
            session = InjectRecordingSession(agent, session_id)
            session.injected = injected
            return session

    async with make(Opener({})) as cluster:
        a, b = cluster.nodes
        running = await a.submit(_req("check"))
        await tool_running.wait()
        # A NOW message from the other node while the tool runs: taken into the turn
        urgent = await b.submit(
            SubmitRequest(session_id="s1", agent_ref="assistant", input="also this", priority="NOW")
        )
        await wait_until(lambda: injected == [("also this", True)])
        release.set()
        result = await running.result
        joined = await urgent.result
    # The model's next request carried it with the tool's result; its caller got the turn's
    assert requests == [["check"], ["also this"]]
    assert result.text == joined.text == "done, also read ['also this']"
