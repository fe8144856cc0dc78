"""A pydantic-ai agent on stickless: behind `stickless serve`, and on a 3-node LocalCluster.

    python -m stickless serve --opener examples.pydantic_ai_app:make_opener  # (repo root)
    python examples/pydantic_ai_app.py  # three turns on three nodes

The agent uses `PYDANTIC_AI_MODEL` (e.g. `openai:gpt-4o`, with that provider's key in the
environment) when it is set, else an offline FunctionModel that streams a short answer and calls
the `clock` tool when asked for the time, so the example runs anywhere.
"""

from __future__ import annotations

import asyncio
import datetime
import os
from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from stickless import SubmitRequest
from stickless.integrations.pydantic_ai import PydanticAIOpener
from stickless.testing import LocalCluster


async def offline_model(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
    """Streams a reply naming how many earlier prompts it saw; asks the clock for the time."""
    returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returned:
        yield f"It is {returned[0].content}."
        return
    prompts = [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    ]
    if "time" in str(prompts[-1]):
        yield {0: DeltaToolCall(name="clock", json_args="{}", tool_call_id="clock-1")}
        return
    for word in f"You said {prompts[-1]!r}; {len(prompts) - 1} message(s) before it.".split():
        yield word + " "


def make_agent() -> Agent[None, str]:
    model: Any = os.environ.get("PYDANTIC_AI_MODEL") or FunctionModel(stream_function=offline_model)
    agent = Agent(model, instructions="Be brief.")

    @agent.tool_plain
    def clock() -> str:
        """The current UTC time."""
        return datetime.datetime.now(datetime.UTC).strftime("%H:%M UTC")

    return agent


def make_opener() -> PydanticAIOpener:
    """The opener `stickless serve --opener examples.pydantic_ai_app:make_opener` loads."""
    return PydanticAIOpener({"assistant": make_agent()})


async def main() -> None:
    async with LocalCluster(3, opener=make_opener()) as cluster:
        for node, text in zip(cluster.nodes, ["hello", "what time is it?", "thanks"], strict=True):
            ask = SubmitRequest(session_id="chat-1", agent_ref="assistant", input=text)
            result = await (await node.submit(ask)).result
            print(f"{node.node_id} ran {text!r}: {result.text.strip()}")
            await node.release_session("chat-1")  # the next turn opens it on the next node


if __name__ == "__main__":
    asyncio.run(main())
