"""An OpenAI Agents SDK agent behind stickless: over HTTP with `stickless serve`, or three turns
on an in-process 3-node cluster.

    pip install -e ".[openai-agents,web]"
    python -m stickless serve --opener examples.openai_agents_app:make_opener
    # chat on http://127.0.0.1:8000/?agent=assistant
    python -m examples.openai_agents_app

Run both from the repository root (`python -m` puts it on the path, so `examples` imports).
With OPENAI_API_KEY set the agent uses the SDK's default OpenAI model; without it, it runs
offline on `OfflineModel`, a stand-in that streams a canned reply (and calls the weather tool
when asked about the weather), so the example needs no network and no key.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Usage, function_tool
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)

from stickless import SubmitRequest, TextDelta, ToolUseFinished, ToolUseStarted, TurnCompleted
from stickless.integrations.openai_agents import OpenAIAgentsOpener
from stickless.testing import LocalCluster

#: The agent_ref the opener knows (the chat page's `?agent=`).
AGENT_REF = "assistant"


@function_tool
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"It is sunny in {city}."


class OfflineModel(Model):
    """A stand-in model without network: calls `get_weather` when the user asks about the
    weather, otherwise streams back a short reply about the conversation so far."""

    def _output(self, items: list[Any]) -> list[Any]:
        last = items[-1]
        if last.get("type") == "function_call_output":
            return [_message(f"The tool says: {last['output']}")]
        said = last.get("content")
        text = said if isinstance(said, str) else "(media)"
        if "weather" in text.lower():
            city = text.rstrip("?.! ").split()[-1]
            return [
                ResponseFunctionToolCall(
                    id=f"call-{len(items)}",
                    call_id=f"call-{len(items)}",
                    type="function_call",
                    name="get_weather",
                    arguments=f'{{"city": "{city}"}}',
                )
            ]
        turns = sum(1 for item in items if item.get("role") == "user")
        return [_message(f"(offline, message {turns} of this session) You said: {text}")]

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return ModelResponse(output=self._output(_items(args[1])), usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        output = self._output(_items(args[1]))
        texts = [
            part.text
            for item in output
            if isinstance(item, ResponseOutputMessage)
            for part in item.content
            if isinstance(part, ResponseOutputText)
        ]
        for seq, word in enumerate(" ".join(texts).split(" ") if texts else []):
            yield ResponseTextDeltaEvent(
                type="response.output_text.delta",
                item_id="msg",
                output_index=0,
                content_index=0,
                delta=word if seq == 0 else " " + word,
                logprobs=[],
                sequence_number=seq,
            )
            await asyncio.sleep(0.02)  # a model's pace, so the stream is visible
        response = Response(
            id="offline",
            created_at=0,
            model="offline",
            object="response",
            output=output,
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
            status="completed",
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


def _items(input: str | list[Any]) -> list[Any]:
    return [{"role": "user", "content": input}] if isinstance(input, str) else input


def _message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def make_opener() -> OpenAIAgentsOpener:
    """The opener `stickless serve --opener examples.openai_agents_app:make_opener` loads."""
    online = bool(os.environ.get("OPENAI_API_KEY"))
    agent = Agent(
        name="assistant",
        instructions="You are a concise assistant.",
        tools=[get_weather],
        model=None if online else OfflineModel(),  # None: the SDK's default model
    )
    # Offline there is nowhere to send traces; online the SDK exports them as usual.
    return OpenAIAgentsOpener({AGENT_REF: agent}, run_config=RunConfig(tracing_disabled=not online))


async def main() -> None:
    """Three turns of one session, each on another node of a LocalCluster: the history
    follows the session from node to node, and each turn's frames stream back as they come."""
    texts = ["Hello, I am Ann.", "What is the weather in Oslo?", "Thanks!"]
    async with LocalCluster(3, opener=make_opener()) as cluster:
        for node, text in zip(cluster.nodes, texts, strict=True):
            print(f"> {text}")
            request = SubmitRequest(session_id="s1", agent_ref=AGENT_REF, input=text)
            async with await node.stream(request) as stream:
                async for event in stream:
                    if isinstance(event, TextDelta):
                        print(event.text, end="", flush=True)
                    elif isinstance(event, ToolUseStarted):
                        print(f"[{event.name} {event.input_summary}]", end=" ", flush=True)
                    elif isinstance(event, ToolUseFinished):
                        print(f"[-> {event.output_summary}]", end=" ", flush=True)
                    elif isinstance(event, TurnCompleted):
                        print(f"\n  (ran on {event.executed_by})")
            await node.release_session("s1")  # the next turn opens the session on another node


if __name__ == "__main__":
    asyncio.run(main())
