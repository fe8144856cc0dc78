"""Every gateway route and error, through httpx on the ASGI app over an in-memory router."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from stickless import LiveSession
from stickless.demo.opener import DemoOpener
from stickless.web import Gateway, GatewaySettings, api_router

from .conftest import AGENT, Served, turn
from .sse import events, parse

SSE = {"Accept": "text/event-stream"}


async def _done(client: httpx.AsyncClient, sid: str, body: dict[str, Any], **headers: str) -> Any:
    """Submit and wait for the turn's end; the GET turn answer."""
    answer = await client.post(f"/v1/sessions/{sid}/turns", json=body, headers=headers)
    assert answer.status_code == 202, answer.text
    got = await client.get(answer.headers["location"], params={"wait": 10}, headers=headers)
    assert got.status_code == 200
    return got.json()


def _error(answer: httpx.Response, status: int, code: str) -> str:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code
    message: str = error["message"]
    return message


# ---------------------------------------------------------------- turns


async def test_a_submit_is_accepted_and_its_result_fetched_by_id(served: Served) -> None:
    client = served.client
    answer = await client.post("/v1/sessions/s1/turns", json=turn("hello"))
    assert answer.status_code == 202
    body = answer.json()
    assert body["origin"] == "new" and body["session_id"] == "s1"
    assert answer.headers["location"] == f"/v1/sessions/s1/turns/{body['turn_id']}"
    got = (await client.get(answer.headers["location"], params={"wait": 10})).json()
    assert got["state"] == "completed"
    assert got["executed_by"] == served.router.node_id
    assert got["result"]["text"].startswith("you said 'hello'")
    assert "error" not in got


async def test_a_streamed_submit_sends_the_turn_as_sse_from_start_to_end(served: Served) -> None:
    answer = await served.client.post("/v1/sessions/s1/turns", json=turn("one two"), headers=SSE)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["cache-control"] == "no-store"
    assert answer.headers["x-accel-buffering"] == "no"
    assert answer.headers["x-origin"] == "new"
    frames = events(parse(answer.text))
    kinds = [f.event for f in frames]
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_completed"
    assert all(f.id and f.data["event_id"] == f.id for f in frames)
    assert {f.data["turn_id"] for f in frames} == {answer.headers["x-turn-id"]}
    text = "".join(f.data["text"] for f in frames if f.event == "text_delta")
    assert text.strip() == frames[-1].data["text"]


async def test_a_retried_key_gets_the_same_turn_and_a_changed_input_conflicts(
    served: Served,
) -> None:
    client = served.client
    key = {"Idempotency-Key": "k-1"}
    first = await _done(client, "s1", turn("same"), **key)
    again = await client.post("/v1/sessions/s1/turns", json=turn("same"), headers=key)
    assert again.status_code == 202
    assert again.json()["turn_id"] == first["turn_id"]
    assert again.json()["origin"] == "cached" and again.json()["status"] == "completed"
    # The stream of a cached answer is its stored frames, ending with the terminal one.
    streamed = await client.post("/v1/sessions/s1/turns", json=turn("same"), headers=key | SSE)
    assert streamed.headers["x-origin"] == "cached"
    assert events(parse(streamed.text))[-1].event == "turn_completed"
    changed = await client.post("/v1/sessions/s1/turns", json=turn("other"), headers=key)
    _error(changed, 409, "IDEMPOTENCY_CONFLICT")
    transcript = (await client.get("/v1/sessions/s1/transcript")).json()["entries"]
    assert [e["content"] for e in transcript if e["role"] == "user"] == ["same"]


async def test_a_session_bound_to_another_agent_conflicts(served: Served) -> None:
    await _done(served.client, "s1", turn("hi"))
    other = {"agent_ref": "another-agent", "input": "hi"}
    _error(await served.client.post("/v1/sessions/s1/turns", json=other), 409, "CONFLICTING_AGENT")


class _OnlyTheDemoAgent(DemoOpener):
    """The demo opener, refusing every other agent name."""

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        if agent_ref != AGENT:
            raise LookupError(f"no agent named {agent_ref!r}")
        return await super().open(session_id, agent_ref, attributes)


async def test_a_mistyped_first_agent_does_not_bind_the_session(
    make_app: Callable[..., Any],
) -> None:
    served: Served = await make_app(opener=_OnlyTheDemoAgent(token_delay=0.0))
    mistyped = {"agent_ref": "nope", "input": "hi"}
    # Given a session's first turn names an agent the opener refuses
    failed = await _done(served.client, "s1", mistyped)
    assert failed["state"] == "failed" and failed["error"]["code"] == "FAILED"
    assert "no agent named 'nope'" in failed["error"]["message"]
    # Then a turn for the right agent runs
    assert (await _done(served.client, "s1", turn("hello")))["state"] == "completed"
    # And only then is the mistyped agent a conflict, naming the bound one
    answer = await served.client.post("/v1/sessions/s1/turns", json=mistyped)
    message = _error(answer, 409, "CONFLICTING_AGENT")
    assert message == f"session s1 is bound to agent {AGENT!r}, not 'nope'"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": "x"}, "agent_ref"),
        ({"agent_ref": AGENT}, "input"),
        ({"agent_ref": AGENT, "input": "x", "priority": "SOON"}, "priority"),
        ({"agent_ref": AGENT, "input": "x", "colour": "red"}, "colour"),
        ({"agent_ref": "bad agent", "input": "x"}, "agent_ref"),
        ({"agent_ref": AGENT, "input": []}, "input"),
    ],
)
async def test_an_invalid_turn_is_refused_naming_the_field(
    served: Served, body: dict[str, Any], field: str
) -> None:
    message = _error(await served.client.post("/v1/sessions/s1/turns", json=body), 400,
                     "INVALID_REQUEST")
    assert field in message
    # Nothing was reserved or run.
    assert await served.router.transcript("s1") == []


async def test_a_body_that_is_not_json_or_a_bad_session_id_is_refused(served: Served) -> None:
    raw = await served.client.post(
        "/v1/sessions/s1/turns", content=b"{not json", headers={"content-type": "application/json"}
    )
    _error(raw, 400, "INVALID_REQUEST")
    _error(await served.client.post("/v1/sessions/-bad/turns", json=turn("x")), 400,
           "INVALID_REQUEST")
    bad_key = {"Idempotency-Key": "x" * 201}
    _error(await served.client.post("/v1/sessions/s1/turns", json=turn("x"), headers=bad_key),
           400, "INVALID_REQUEST")


async def test_a_body_over_the_bound_is_refused_413(make_app: Any) -> None:
    small: Served = await make_app(max_input_bytes=200)
    big = turn("x" * 300)
    _error(await small.client.post("/v1/sessions/s1/turns", json=big), 413, "INPUT_TOO_LARGE")
    ok = await small.client.post("/v1/sessions/s1/turns", json=turn("short"))
    assert ok.status_code == 202


async def test_an_unknown_turn_is_404_and_a_bad_wait_is_400(served: Served) -> None:
    _error(await served.client.get("/v1/sessions/s1/turns/nope"), 404, "UNKNOWN_TURN")
    _error(await served.client.get("/v1/sessions/s1/turns/nope/events"), 404, "UNKNOWN_TURN")
    _error(await served.client.get("/v1/sessions/s1/turns/t", params={"wait": -1}), 400,
           "INVALID_REQUEST")


async def test_a_running_turn_reads_running_and_wait_returns_before_its_end(
    served: Served,
) -> None:
    slow = turn("x", story=True, delay=0.5)
    answer = await served.client.post("/v1/sessions/s1/turns", json=slow)
    url = answer.headers["location"]
    got = (await served.client.get(url, params={"wait": 0.3})).json()
    assert got["state"] in ("queued", "running")
    assert "result" not in got and "error" not in got and "executed_by" in got
    await served.client.post("/v1/sessions/s1/interrupt", json={})


# ---------------------------------------------------------------- turn events


async def test_a_finished_turns_events_replay_and_resume_then_204(served: Served) -> None:
    client = served.client
    done = await _done(client, "s1", turn("a b c d"))
    url = f"/v1/sessions/s1/turns/{done['turn_id']}/events"
    whole = events(parse((await client.get(url)).text))
    assert whole[0].event == "turn_started" and whole[-1].event == "turn_completed"
    # Resumed from the third frame: the rest, by Last-Event-ID or ?after=.
    rest = events(parse((await client.get(url, headers={"Last-Event-ID": whole[2].id})).text))
    assert [f.id for f in rest] == [f.id for f in whole[3:]]
    after = events(parse((await client.get(url, params={"after": whole[2].id})).text))
    assert [f.id for f in after] == [f.id for f in whole[3:]]
    # Past the terminal frame there is nothing to send: 204 (a browser stops reconnecting).
    assert (await client.get(url, headers={"Last-Event-ID": whole[-1].id})).status_code == 204


async def test_a_malformed_or_foreign_cursor_is_400_before_the_stream(served: Served) -> None:
    done = await _done(served.client, "s1", turn("x"))
    url = f"/v1/sessions/s1/turns/{done['turn_id']}/events"
    _error(await served.client.get(url, headers={"Last-Event-ID": "garbage"}), 400,
           "INVALID_REQUEST")
    _error(await served.client.get(url, params={"after": "99999999999999-0"}), 400,
           "INVALID_CURSOR")


async def test_a_cursor_older_than_the_log_starts_with_a_gap(make_app: Any) -> None:
    small: Served = await make_app(max_len=4)
    first = await _done(small.client, "s1", turn("one"))
    old = events(parse((await small.client.get(
        f"/v1/sessions/s1/turns/{first['turn_id']}/events")).text))
    assert old  # the log still held the first turn's last frames
    await _done(small.client, "s1", turn("two three four five six"))
    second = await _done(small.client, "s1", turn("seven eight nine ten"))
    url = f"/v1/sessions/s1/turns/{second['turn_id']}/events"
    resumed = events(parse((await small.client.get(url, headers={"Last-Event-ID": old[0].id}))
                           .text))
    assert resumed[0].event == "gap" and resumed[0].data["cursor"] == old[0].id
    assert resumed[-1].event == "turn_completed"


# ---------------------------------------------------------------- controls


async def test_interrupt_stops_the_running_turn(served: Served) -> None:
    client = served.client
    answer = await client.post("/v1/sessions/s1/turns", json=turn("x", story=True, delay=0.2))
    turn_id = answer.json()["turn_id"]
    url = f"/v1/sessions/s1/turns/{turn_id}"
    # Wait until it runs (its first text frame), then interrupt it.
    async with served.router.events("s1", turn_id, after="0-0") as stream:
        async for frame in stream:
            if frame.type == "text_delta":
                break
    stopped = await client.post("/v1/sessions/s1/interrupt", json={"turn_id": turn_id,
                                                                   "reason": "STOP"})
    assert stopped.status_code == 202 and stopped.json() == {"interrupted": True}
    got = (await client.get(url, params={"wait": 10})).json()
    assert got["state"] == "failed" and got["error"]["code"] == "INTERRUPTED"
    nothing = await client.post("/v1/sessions/s1/interrupt")
    assert nothing.status_code == 202 and nothing.json() == {"interrupted": False}
    _error(await client.post("/v1/sessions/s1/interrupt", json={"colour": 1}), 400,
           "INVALID_REQUEST")


async def test_a_stale_stop_of_a_finished_turn_answers_at_once(
    make_app: Callable[..., Any],
) -> None:
    # A grace of ten minutes: a Stop that waits for an answer nobody sends outlasts the test.
    served: Served = await make_app(interrupt_grace=600.0)
    finished = await _done(served.client, "s1", turn("done"))
    stale = {"turn_id": finished["turn_id"], "reason": "STOP"}
    stopped = await served.client.post("/v1/sessions/s1/interrupt", json=stale)
    assert stopped.status_code == 202 and stopped.json() == {"interrupted": False}


async def test_status_transcript_release_and_delete(served: Served) -> None:
    client = served.client
    await _done(client, "s1", turn("remember me"))
    status = await client.get("/v1/sessions/s1")
    assert status.status_code == 200 and status.json()["session_id"] == "s1"
    assert status.json()["holder"] == served.router.node_id
    entries = (await client.get("/v1/sessions/s1/transcript")).json()["entries"]
    assert (entries[0]["role"], entries[0]["content"]) == ("user", "remember me")
    # ?after=N reads only the entries past version N; a negative one is refused by name
    later = (await client.get("/v1/sessions/s1/transcript", params={"after": 1})).json()
    assert later["entries"] == entries[1:] and entries[0]["partial"] is False
    refused = await client.get("/v1/sessions/s1/transcript", params={"after": -1})
    assert refused.status_code == 400 and "after" in refused.text
    assert (await client.post("/v1/sessions/s1/release")).status_code == 204
    assert served.router.local_sessions() == []
    assert len((await client.get("/v1/sessions/s1/transcript")).json()["entries"]) == 2
    assert (await client.delete("/v1/sessions/s1")).status_code == 204
    assert (await client.get("/v1/sessions/s1/transcript")).json()["entries"] == []


# ---------------------------------------------------------------- probes and failures


async def test_probes_docs_and_the_chat_page(served: Served) -> None:
    client = served.client
    assert (await client.get("/healthz")).json()["node_id"] == served.router.node_id
    assert (await client.get("/readyz")).status_code == 200
    assert (await client.get("/docs")).status_code == 200
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert "/v1/sessions/{session_id}/turns" in paths
    page = await client.get("/")
    assert page.status_code == 200 and "<!doctype html" in page.text.lower()


async def test_an_unreachable_backend_is_503_with_retry_after(served: Served) -> None:
    served.backends.sever()
    answer = await served.client.post("/v1/sessions/s1/turns", json=turn("x"))
    _error(answer, 503, "BACKEND_UNAVAILABLE")
    assert answer.headers["retry-after"] == "1"
    assert (await served.client.get("/readyz")).status_code == 503


async def test_a_closed_router_is_503(served: Served) -> None:
    await served.router.aclose(grace=1.0)
    answer = await served.client.post("/v1/sessions/s1/turns", json=turn("x"))
    _error(answer, 503, "ROUTER_CLOSED")
    assert answer.headers["retry-after"] == "1"
    _error(await served.client.get("/readyz"), 503, "ROUTER_CLOSED")


async def test_the_api_router_mounted_in_another_app_maps_errors_the_same(
    served: Served,
) -> None:
    app = FastAPI()
    app.include_router(api_router(Gateway(served.router, None, None, GatewaySettings())))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://mounted") as client:
        _error(await client.get("/v1/sessions/s1/turns/nope"), 404, "UNKNOWN_TURN")
        _error(await client.post("/v1/sessions/s1/turns", json={}), 400, "INVALID_REQUEST")
        accepted = await client.post("/v1/sessions/s1/turns", json=turn("x"))
        assert accepted.status_code == 202


async def test_the_python_client_surfaces_a_gap_then_reads_on(make_app: Any) -> None:
    from stickless.client import AsyncClient, Gap, StreamEvent

    small: Served = await make_app(max_len=4)
    client = AsyncClient("http://gateway", http=small.client)
    first = [i async for i in client.stream("s1", "one", agent_ref=AGENT)]
    middle = await client.submit("s1", "two three four five six", agent_ref=AGENT)
    await client.result("s1", middle.turn_id, timeout=10)
    second = await client.submit("s1", "seven eight nine ten", agent_ref=AGENT)
    await client.result("s1", second.turn_id, timeout=10)
    assert isinstance(first[0], StreamEvent) and first[0].id is not None
    resumed = [i async for i in client.follow_turn("s1", second.turn_id, after=first[0].id)]
    assert resumed[0] == Gap(cursor=first[0].id, oldest_id=None)
    assert isinstance(resumed[-1], StreamEvent) and resumed[-1].type == "turn_completed"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_load_nothing_from_another_site(served: Served, page: str) -> None:
    html = (await served.client.get(page)).text
    assert "://" not in html and "'//" not in html and '"//' not in html, html
    # Every script, style and icon it loads, and the schema, come from the node itself
    loaded = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""", html)
    paths = {a or b for a, b in loaded} | {"/openapi.json"}
    assert any(p.endswith(".js") for p in paths), paths
    for path in paths:
        assert (await served.client.get(path)).status_code == 200, path
