"""The AI SDK routes over an in-memory router: the chat request as a UI message stream, a
request sent again, refused requests, resume and stop (the SDK's own client runs against a real
cluster in tests/test_ai_sdk_cluster.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stickless.demo.agent import STORY
from stickless.web import AISdkSettings, create_app

from .conftest import ALICE, BOB, Served
from .sse import Frame, frames, parse

API = "/v1/ai-sdk/chat"


def chat(
    chat_id: str, text: str = "hello", message_id: str = "m-1", **extra: Any
) -> dict[str, Any]:
    """The body `DefaultChatTransport` posts (with the transport's `body: { agent_ref }`)."""
    message = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": chat_id, "messages": [message], "trigger": "submit-message",
            "messageId": None, "agent_ref": "demo-agent", **extra}


def chunks(body: str) -> list[Any]:
    return [frame.data for frame in parse(body) if frame.data is not None]


async def test_a_chat_request_streams_its_turn_as_ui_message_chunks(served: Served) -> None:
    answer = await served.client.post(API, json=chat("c1"))
    assert answer.status_code == 200
    assert answer.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert answer.headers["content-type"].startswith("text/event-stream")
    got = chunks(answer.text)
    assert got[-1] == "[DONE]"
    assert got[0] == {"type": "start", "messageId": answer.headers["x-turn-id"]}
    kinds = [c["type"] for c in got[1:-1]]
    assert kinds[:2] == ["start-step", "text-start"]
    assert kinds[-3:] == ["text-end", "finish-step", "finish"]
    text = "".join(c["delta"] for c in got[1:-1] if c["type"] == "text-delta")
    assert text.strip() == "you said 'hello'; this handle has now run 1 turn(s)"


async def test_the_same_message_sent_again_gets_its_turn_not_a_second_one(served: Served) -> None:
    first = await served.client.post(API, json=chat("c1"))
    again = await served.client.post(API, json=chat("c1"))
    assert again.status_code == 200
    assert again.headers["x-turn-id"] == first.headers["x-turn-id"]
    assert again.headers["x-origin"] == "cached"
    assert len(await served.router.transcript("c1")) == 2  # one turn's user + assistant
    changed = await served.client.post(API, json=chat("c1", text="other"))
    assert changed.status_code == 409
    assert "user message 'm-1' was sent before" in changed.json()["error"]["message"]


def _last(body: dict[str, Any], **fields: Any) -> dict[str, Any]:
    body["messages"][-1].update(fields)
    return body


REFUSED = [
    ("no messages", {**chat("c1"), "messages": []}, "messages"),
    ("the last message is not the user's", _last(chat("c1"), role="assistant"), "role 'user'"),
    ("regenerate", {**chat("c1"), "trigger": "regenerate-message"}, "trigger"),
    ("no agent", {**chat("c1"), "agent_ref": None}, "agent_ref"),
    ("no text or file part", _last(chat("c1"), parts=[{"type": "step-start"}]), "parts"),
    ("a file part without its media type", _last(chat("c1"), parts=[{"type": "file", "url": "x"}]),
     "mediaType"),
    ("a chat id that is not a session id", chat("-bad id"), "id (the chat id"),
    ("an unknown priority", {**chat("c1"), "priority": "SOON"}, "priority"),
]


@pytest.mark.parametrize(("body", "named"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
async def test_a_bad_chat_request_is_refused_naming_the_field(
    served: Served, body: dict[str, Any], named: str
) -> None:
    answer = await served.client.post(API, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "INVALID_REQUEST"
    assert named in answer.json()["error"]["message"]
    # Nothing half-written: no turn, no chat stream, no history.
    assert await served.backends.chat_streams.current("c1") is None
    assert await served.router.transcript("c1") == []


async def test_a_body_past_the_limit_is_413(served: Served) -> None:
    app = create_app(served.router, ai_sdk=AISdkSettings(prefix="/chat", max_body_bytes=200))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        answer = await c.post("/chat", json=chat("c1", text="x" * 300))
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "INPUT_TOO_LARGE"
    assert await served.backends.chat_streams.current("c1") is None


async def test_resume_answers_204_with_no_unfinished_turn(served: Served) -> None:
    assert (await served.client.get(f"{API}/c1/stream")).status_code == 204
    await served.client.post(API, json=chat("c1"))
    assert (await served.client.get(f"{API}/c1/stream")).status_code == 204


async def _until_text(stream: AsyncIterator[Frame]) -> list[Frame]:
    got: list[Frame] = []
    async for frame in stream:
        got.append(frame)
        if isinstance(frame.data, dict) and frame.data["type"] == "text-delta":
            return got
    raise AssertionError(f"the stream ended without text: {got}")


async def _rest(stream: AsyncIterator[Frame]) -> list[Any]:
    return [frame.data async for frame in stream if frame.data is not None]


def _types(got: list[Any]) -> list[str]:
    return [c if c == "[DONE]" else c["type"] for c in got]


def _text(got: list[Any]) -> str:
    return "".join(c["delta"] for c in got if c != "[DONE]" and c["type"] == "text-delta")


async def test_resume_replays_the_running_turn_from_its_start(live_server: str) -> None:
    slow = chat("c1", submit_options={"story": True, "delay": 0.02})
    async with (
        httpx.AsyncClient(base_url=live_server, timeout=30) as client,
        client.stream("POST", API, json=slow) as posted,
    ):
        await _until_text(frames(posted))
        async with client.stream("GET", f"{API}/c1/stream") as resumed:
            assert resumed.status_code == 200
            assert resumed.headers["x-vercel-ai-ui-message-stream"] == "v1"
            got = await _rest(frames(resumed))
    assert got[0] == {"type": "start", "messageId": posted.headers["x-turn-id"]}
    assert got[1] == {"type": "start-step"}
    assert _text(got).split() == STORY.split()
    assert _types(got[-3:]) == ["finish-step", "finish", "[DONE]"]


async def test_stop_interrupts_the_chats_turn_and_its_stream_ends(live_server: str) -> None:
    slow = chat("c1", submit_options={"story": True, "delay": 0.05})
    async with (
        httpx.AsyncClient(base_url=live_server, timeout=30) as client,
        client.stream("POST", API, json=slow) as posted,
    ):
        live = frames(posted)
        await _until_text(live)
        stopped = await client.post(f"{API}/c1/stop")
        assert stopped.status_code == 202
        assert stopped.json() == {"interrupted": True}
        rest = await _rest(live)
        turn = await client.get(f"/v1/sessions/c1/turns/{posted.headers['x-turn-id']}?wait=10")
    assert rest[-2:] == [{"type": "abort", "reason": "USER"}, "[DONE]"]
    assert turn.json()["error"]["code"] == "INTERRUPTED"


async def test_only_the_chats_owner_sees_or_stops_it(make_app: Any) -> None:
    served: Served = await make_app(auth=True)
    client = served.client
    assert (await client.post(API, json=chat("c1"))).status_code == 401
    assert (await client.post(API, json=chat("c1"), headers=ALICE)).status_code == 200
    # Bob cannot tell alice's chat from one that does not exist.
    assert (await client.get(f"{API}/c1/stream", headers=BOB)).status_code == 204
    assert (await client.post(f"{API}/c1/stop", headers=BOB)).status_code == 404
    taken = await client.post(API, json=chat("c1", message_id="m-2"), headers=BOB)
    assert taken.status_code == 404
    assert taken.json()["error"]["code"] == "UNKNOWN_SESSION"
    assert (await client.post(f"{API}/c1/stop", headers=ALICE)).status_code == 202
