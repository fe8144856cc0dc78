"""The demo agent (`stickless serve`'s default): a NOW message sent while its reply streams joins
that turn, which acknowledges it in its text and commits it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from stickless import (
    MemoryBackends,
    Priority,
    RouterConfig,
    SessionRouter,
    SubmitRequest,
    TextDelta,
)
from stickless.demo.agent import AGENT_REF, STORY
from stickless.demo.opener import DemoOpener


@pytest.fixture
async def router() -> AsyncIterator[SessionRouter]:
    router = SessionRouter.build(
        config=RouterConfig(node_id="demo-a"),
        opener=DemoOpener(token_delay=0.0),
        backends=MemoryBackends(),
    )
    await router.start()
    try:
        yield router
    finally:
        await router.aclose()


def _req(text: str, **fields: object) -> SubmitRequest:
    return SubmitRequest(session_id="s1", agent_ref=AGENT_REF, input=text, **fields)  # type: ignore[arg-type]


async def test_a_now_message_joins_the_streaming_reply(router: SessionRouter) -> None:
    # Given a slow reply streaming
    stream = await router.stream(_req("story", submit_options={"story": True, "delay": 0.02}))
    text = ""
    async for event in stream:
        if isinstance(event, TextDelta):
            text += event.text
            break
    # When a NOW message is sent
    joining = await router.submit(_req("hurry", priority=Priority.NOW))
    async for event in stream:
        if isinstance(event, TextDelta):
            text += event.text
    # Then the reply acknowledges it, and its caller is answered with that turn's answer
    running = await stream.disposition.result
    joined = await joining.result
    assert joined.text == running.text == text.strip()
    assert joined.turn_id == joining.turn_id != running.turn_id
    assert text.count("(you also said 'hurry') ") == 1
    assert text.replace("(you also said 'hurry') ", "").split() == STORY.split()
    assert running.data["words"] == len(STORY.split())
    # And the turn committed it as the user's too, with no turn of its own
    entries = await router.transcript("s1")
    assert [(e.role, e.content, e.turn_id) for e in entries] == [
        ("user", "story", running.turn_id),
        ("user", "hurry", running.turn_id),
        ("assistant", running.text, running.turn_id),
    ]
