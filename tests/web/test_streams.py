"""Live event streams through a real uvicorn server: session events with heartbeats, following
a running turn, and a client that leaves mid-turn (the turn goes on)."""

from __future__ import annotations

import httpx

from stickless.demo.agent import STORY

from .conftest import turn
from .sse import Frame, frames

SSE = {"Accept": "text/event-stream"}


async def _until_terminal(response: httpx.Response) -> list[Frame]:
    got: list[Frame] = []
    async for frame in frames(response):
        if frame.data is None:
            continue
        got.append(frame)
        if frame.event in ("turn_completed", "turn_failed", "interrupted", "rejected"):
            break
    return got


async def test_session_events_stream_live_with_heartbeats(live_server: str) -> None:
    async with (
        httpx.AsyncClient(base_url=live_server, timeout=30) as client,
        client.stream("GET", "/v1/sessions/s1/events") as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["cache-control"] == "no-store"
        live = frames(stream)
        # Silence first: the heartbeat comment keeps the connection.
        first = await anext(live)
        assert first.data is None and "keep-alive" in first.comments
        submitted = await client.post("/v1/sessions/s1/turns", json=turn("a b c"))
        turn_id = submitted.json()["turn_id"]
        got: list[Frame] = []
        async for frame in live:
            if frame.data is not None:
                got.append(frame)
                if frame.event == "turn_completed":
                    break
    assert got[0].event == "turn_started"
    assert {f.data["turn_id"] for f in got} == {turn_id}
    assert all(f.id for f in got)


async def test_following_a_running_turn_streams_it_to_its_end(live_server: str) -> None:
    async with httpx.AsyncClient(base_url=live_server, timeout=30) as client:
        slow = turn("x", story="one two three four five six", delay=0.05)
        url = (await client.post("/v1/sessions/s1/turns", json=slow)).headers["location"]
        async with client.stream("GET", f"{url}/events") as stream:
            got = await _until_terminal(stream)
        result = (await client.get(url, params={"wait": 10})).json()["result"]
    assert got[0].event == "turn_started" and got[-1].event == "turn_completed"
    text = "".join(f.data["text"] for f in got if f.event == "text_delta")
    assert text.strip() == result["text"]
    assert len({f.id for f in got}) == len(got)


async def test_a_client_leaving_mid_turn_does_not_interrupt_it(live_server: str) -> None:
    async with httpx.AsyncClient(base_url=live_server, timeout=30) as client:
        slow = turn("x", story=True, delay=0.02)
        async with client.stream("POST", "/v1/sessions/s1/turns", json=slow,
                                 headers=SSE) as stream:
            turn_id = stream.headers["x-turn-id"]
            texts = 0
            async for frame in frames(stream):
                texts += frame.event == "text_delta"
                if texts == 2:
                    break  # leave: the response is closed with the stream
        done = await client.get(f"/v1/sessions/s1/turns/{turn_id}", params={"wait": 30})
    assert done.json()["state"] == "completed"
    assert done.json()["result"]["text"] == STORY


async def test_a_burst_of_frames_reaches_the_client_whole(live_server: str) -> None:
    words = [f"w{i}" for i in range(3000)]
    async with (
        httpx.AsyncClient(base_url=live_server, timeout=60) as client,
        client.stream(
            "POST",
            "/v1/sessions/s1/turns",
            json=turn("x", story=" ".join(words), delay=0),
            headers=SSE,
        ) as stream,
    ):
        got = await _until_terminal(stream)
    texts = [f.data["text"].strip() for f in got if f.event == "text_delta"]
    assert texts == words
    assert got[-1].event == "turn_completed"


async def test_a_traceparent_header_puts_the_turn_in_the_callers_trace(live_server: str) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    caller = f"00-{trace_id}-00f067aa0ba902b7-01"
    async with httpx.AsyncClient(base_url=live_server, timeout=30) as client:
        async with client.stream(
            "POST",
            "/v1/sessions/s1/turns",
            json=turn("a b"),
            headers={**SSE, "traceparent": caller},
        ) as stream:
            got = await _until_terminal(stream)
            answered = stream.headers["traceparent"]
        # The submit's own span answers: same trace, a span of its own
        assert answered.startswith(f"00-{trace_id}-") and answered != caller
        assert {f.data["trace_id"] for f in got} == {trace_id}
        assert len({f.data["span_id"] for f in got}) == 1
        # A JSON submit says the trace too; an invalid traceparent starts a new one (W3C)
        plain = await client.post(
            "/v1/sessions/s1/turns", json=turn("c"), headers={"traceparent": caller}
        )
        assert plain.status_code == 202 and plain.json()["trace_id"] == trace_id
        fresh = await client.post(
            "/v1/sessions/s1/turns", json=turn("d"), headers={"traceparent": "00-bogus-01"}
        )
        assert fresh.status_code == 202
        assert fresh.json()["trace_id"] not in (None, trace_id)
        assert fresh.headers["traceparent"].split("-")[1] == fresh.json()["trace_id"]
