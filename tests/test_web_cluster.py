"""Acceptance tests of the HTTP gateway through a real load balancer: three `stickless serve`
processes over one redis-server behind haproxy doing round robin per request, no stickiness
(`tests/web_cluster.py`).

Every request opens its own connection (`httpx.request` / `httpx.stream` make a fresh client
each time), so haproxy balances each one; every `/v1` answer names the node that gave it in
`X-Node-Id`, which is how the tests check where a request landed.

Steering: a test that needs its next request to land on a node other than the session's holder
first learns the balancer's rotation from three cheap reads (`GET .../transcript`), then sends
one more cheap read when the holder would be next, and finally checks that the request did land
where the rotation said (a balancer that stopped rotating fails the test instead of silently
testing the holder).

Waits are event driven (an SSE stream read until the frame that matters) or bounded `?wait=`
lookups; no sleep stands in for synchronisation.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from .web_cluster import WebCluster

AGENT = "demo-agent"
#: Bound of one request (a stream: of the silence between two chunks). Not a synchronisation
#: threshold: a healthy answer comes long before it.
TIMEOUT = httpx.Timeout(30.0)
#: `?wait=` of a turn lookup that must find the turn finished.
WAIT = 25
#: A long slow reply (about fifty words, 0.2 s apart): running for ~10 s.
STORY = {"delay": 0.2, "story": True}
TERMINAL = {"turn_completed", "turn_failed", "interrupted", "rejected"}


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[WebCluster]:
    with WebCluster(redis_url, tmp_path, nodes=3) as running:
        yield running


# ---------------------------------------------------------------- HTTP, one connection each


def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One request on a connection of its own."""
    return httpx.request(method, url, timeout=TIMEOUT, **kwargs)


def node_of(answer: httpx.Response) -> str:
    node = answer.headers.get("x-node-id")
    assert node, f"no X-Node-Id on {answer.request.method} {answer.request.url}"
    return node


def new_session() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


def turn_body(text: str, **options: Any) -> dict[str, Any]:
    return {"agent_ref": AGENT, "input": text, "submit_options": options}


def submit(cluster: WebCluster, sid: str, text: str, **options: Any) -> httpx.Response:
    answer = call("POST", f"{cluster.url}/v1/sessions/{sid}/turns", json=turn_body(text, **options))
    assert answer.status_code == 202, answer.text
    return answer


def wait_turn(cluster: WebCluster, sid: str, tid: str) -> dict[str, Any]:
    """The turn's view once it has ended (a bounded `?wait=` lookup)."""
    answer = call("GET", f"{cluster.url}/v1/sessions/{sid}/turns/{tid}?wait={WAIT}")
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    assert view["state"] in ("completed", "failed"), view
    return view


def transcript(cluster: WebCluster, sid: str) -> list[dict[str, Any]]:
    answer = call("GET", f"{cluster.url}/v1/sessions/{sid}/transcript")
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


def warm_up(cluster: WebCluster, sid: str) -> str:
    """Open the session with a cheap turn; its holder (the node that ran it)."""
    tid = submit(cluster, sid, "warm up").json()["turn_id"]
    view = wait_turn(cluster, sid, tid)
    assert view["state"] == "completed", view
    holder: str = view["executed_by"]
    assert holder in {n.node_id for n in cluster.nodes}
    return holder


def steer_away_from(cluster: WebCluster, avoid: str) -> str:
    """Cheap reads until the balancer's next pick is not `avoid`; that next pick."""
    probe = f"{cluster.url}/v1/sessions/{new_session()}/transcript"
    order = [node_of(call("GET", probe)) for _ in range(len(cluster.nodes))]
    assert sorted(order) == sorted(n.node_id for n in cluster.nodes), order
    position = 0  # the balancer's next pick is order[position] (it just served order[-1])
    if order[position] == avoid:
        assert node_of(call("GET", probe)) == avoid
        position += 1
    return order[position]


# ---------------------------------------------------------------- SSE


@dataclass(frozen=True)
class Frame:
    id: str | None
    event: str
    data: dict[str, Any]


class Sse:
    """A streaming answer's frames, read as they come; `broken` once the connection dropped."""

    def __init__(self, answer: httpx.Response) -> None:
        self.answer = answer
        self.node = node_of(answer)
        self.frames: list[Frame] = []
        self.broken: Exception | None = None
        self._lines = answer.iter_lines()

    def __iter__(self) -> Iterator[Frame]:
        fields: dict[str, str] = {}
        try:
            for line in self._lines:
                if line == "":
                    if "event" in fields:
                        frame = Frame(fields.get("id"), fields["event"], json.loads(fields["data"]))
                        self.frames.append(frame)
                        yield frame
                    fields = {}
                elif not line.startswith(":"):  # a comment line is a heartbeat
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
        except httpx.TransportError as exc:  # the node answering it died: a partial frame is lost
            self.broken = exc

    def until(self, done: Any) -> Frame:
        """Read up to the first frame for which `done(frame)` holds."""
        for frame in self:
            if done(frame):
                return frame
        raise AssertionError(f"the stream ended ({self.broken!r}) before the awaited frame")

    def to_end(self) -> list[Frame]:
        """Read what is left; the frames read now."""
        start = len(self.frames)
        for _ in self:
            pass
        return self.frames[start:]


@contextlib.contextmanager
def sse(method: str, url: str, **kwargs: Any) -> Iterator[Sse]:
    headers = {"Accept": "text/event-stream", **kwargs.pop("headers", {})}
    with httpx.stream(method, url, headers=headers, timeout=TIMEOUT, **kwargs) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        yield Sse(answer)


def texts(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.event == "text_delta"]


def is_terminal(frame: Frame) -> bool:
    return frame.event in TERMINAL and not frame.data.get("retrying", False)


# ---------------------------------------------------------------- tests


def test_a_conversation_moves_across_every_node(cluster: WebCluster) -> None:
    sid = new_session()
    answered: list[str] = []
    turns: list[tuple[str, str]] = []
    for n in (1, 2, 3):
        # Given each request through the balancer (a new connection each)
        text = f"message number {n}"
        accepted = submit(cluster, sid, text)
        answered.append(node_of(accepted))
        body = accepted.json()
        assert body["session_id"] == sid and body["origin"] == "new"
        tid = body["turn_id"]
        assert accepted.headers["location"] == f"/v1/sessions/{sid}/turns/{tid}"
        # When its result is fetched through the balancer
        looked_up = call("GET", f"{cluster.url}/v1/sessions/{sid}/turns/{tid}?wait={WAIT}")
        answered.append(node_of(looked_up))
        view = looked_up.json()
        assert view["state"] == "completed", view
        assert view["result"]["text"].startswith(f"you said {text!r}")
        turns.append((text, view["result"]["text"]))
    # Then every request landed on the next node
    assert all(a != b for a, b in itertools.pairwise(answered)), answered
    assert set(answered) == {n.node_id for n in cluster.nodes}
    # And the transcript holds the three exchanges, in order
    entries = transcript(cluster, sid)
    expected = [(role, content) for user, reply in turns for role, content in
                (("user", user), ("assistant", reply))]  # fmt: skip
    assert [(e["role"], e["content"]) for e in entries] == expected
    assert len(entries) == 6
    # And an error answer names its node too
    missing = call("GET", f"{cluster.url}/v1/sessions/{sid}/turns/no-such-turn")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "UNKNOWN_TURN"
    assert node_of(missing) in {n.node_id for n in cluster.nodes}


def test_a_stream_resumes_on_another_node_after_its_node_dies(cluster: WebCluster) -> None:
    # Given a session whose holder is known, and a slow turn streamed by another node
    sid = new_session()
    holder = warm_up(cluster, sid)
    expected_node = steer_away_from(cluster, holder)
    url = f"{cluster.url}/v1/sessions/{sid}/turns"
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    caller = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    with sse("POST", url, json=turn_body("tell me a story", **STORY), headers=caller) as stream:
        assert stream.node == expected_node != holder
        tid = stream.answer.headers["x-turn-id"]
        assert stream.answer.headers["x-origin"] == "new"
        serving = cluster.node_named(stream.node)
        stream.until(lambda f: len(texts(stream.frames)) >= 3)
        # When the serving node is SIGKILLed mid-turn
        serving.sigkill()
        stream.to_end()
        before = stream.frames
    assert stream.broken is not None, "the stream of the killed node ended cleanly"
    assert not any(is_terminal(f) for f in before)
    assert before[0].event == "turn_started" and before[0].data["executed_by"] == holder
    # Then the client resumes through the balancer from the last id it received
    last_id = before[-1].id
    assert last_id is not None
    events = f"{cluster.url}/v1/sessions/{sid}/turns/{tid}/events"
    with sse("GET", events, headers={"Last-Event-ID": last_id}) as resumed:
        assert resumed.node != serving.node_id
        end = resumed.until(is_terminal)
        after = resumed.frames
    frames = before + after
    # And every frame, read on two nodes that did not run the turn, names the caller's trace
    assert {f.data["trace_id"] for f in frames} == {trace_id}
    # And the turn went on on its holder to its end, every frame received exactly once
    assert end.event == "turn_completed" and end.data["executed_by"] == holder
    view = wait_turn(cluster, sid, tid)
    assert view["state"] == "completed" and view["executed_by"] == holder, view
    result = view["result"]["text"]
    assert end.data["text"] == result
    ids = [f.id for f in frames]
    assert None not in ids and len(set(ids)) == len(ids), ids
    assert {f.data["turn_id"] for f in frames} == {tid}
    assert {f.data["attempt"] for f in frames} == {1}
    seqs = [f.data["seq"] for f in frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    # (the demo agent sends each word with a trailing space)
    assert "".join(f.data["text"] for f in texts(frames)) == result + " "
    assert texts(after), "the resumed stream carried none of the turn's text"


def test_an_interrupt_through_the_balancer_stops_the_turn_on_its_holder(
    cluster: WebCluster,
) -> None:
    # Given a slow turn running on the session's holder, followed through the balancer
    sid = new_session()
    holder = warm_up(cluster, sid)
    tid = submit(cluster, sid, "tell me a story", **STORY).json()["turn_id"]
    with sse("GET", f"{cluster.url}/v1/sessions/{sid}/turns/{tid}/events") as stream:
        stream.until(lambda f: f.event == "text_delta")
        # When an interrupt lands on a node that does not hold the session
        expected_node = steer_away_from(cluster, holder)
        answer = call("POST", f"{cluster.url}/v1/sessions/{sid}/interrupt")
        assert node_of(answer) == expected_node != holder
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"interrupted": True}
        # Then the turn ends interrupted
        end = stream.until(is_terminal)
    assert end.event == "interrupted", end
    assert end.data["reason"] == "USER" and end.data["executed_by"] == holder
    view = wait_turn(cluster, sid, tid)
    assert view["state"] == "failed" and view["error"]["code"] == "INTERRUPTED", view
    # And nothing of the interrupted turn was committed
    assert [e["content"] for e in transcript(cluster, sid) if e["role"] == "user"] == ["warm up"]


def test_a_stream_served_by_a_survivor_hears_its_holder_lost(cluster: WebCluster) -> None:
    # Given a slow turn running on the session's holder, streamed by another node
    sid = new_session()
    holder = warm_up(cluster, sid)
    expected_node = steer_away_from(cluster, holder)
    url = f"{cluster.url}/v1/sessions/{sid}/turns"
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    caller = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    with sse("POST", url, json=turn_body("tell me a story", **STORY), headers=caller) as stream:
        assert stream.node == expected_node != holder
        tid = stream.answer.headers["x-turn-id"]
        stream.until(lambda f: len(texts(stream.frames)) >= 3)
        # When the holder is SIGKILLed mid-turn
        cluster.node_named(holder).sigkill()
        # Then the stream ends with the turn lost with its holder
        end = stream.until(is_terminal)
        assert stream.to_end() == []
    assert stream.broken is None
    # (logged like every frame: see the README, "Delivery, attempts and retries")
    assert end.event == "turn_failed" and end.data["code"] == "HOLDER_LOST", end
    assert end.data["executed_by"] == holder and end.id is not None
    # And the turn says so through the balancer
    view = wait_turn(cluster, sid, tid)
    assert view["state"] == "failed" and view["error"]["code"] == "HOLDER_LOST", view


def test_a_retried_post_is_one_turn_run_once(cluster: WebCluster) -> None:
    # Given a turn posted with an idempotency key
    sid = new_session()
    url = f"{cluster.url}/v1/sessions/{sid}/turns"
    body = turn_body("pay the invoice", delay=0.2)
    key = {"Idempotency-Key": f"invoice-{uuid.uuid4().hex}"}
    answers = [call("POST", url, json=body, headers=key)]
    # When the client retries it through the balancer while it runs
    answers += [call("POST", url, json=body, headers=key) for _ in range(2)]
    nodes = [node_of(a) for a in answers]
    assert len(set(nodes)) == 3, nodes
    assert all(a.status_code == 202 for a in answers), [a.text for a in answers]
    first, *retries = [a.json() for a in answers]
    tid = first["turn_id"]
    assert first["origin"] == "new"
    # Then every retry got the same turn
    assert [r["turn_id"] for r in retries] == [tid, tid]
    assert all(r["origin"] in ("attached", "cached") for r in retries), retries
    view = wait_turn(cluster, sid, tid)
    assert view["state"] == "completed", view
    # And a retry after its end is answered from the cache, on yet another node
    late = call("POST", url, json=body, headers=key)
    assert late.status_code == 202 and node_of(late) != nodes[-1]
    assert late.json() == {**first, "status": "completed", "origin": "cached"}
    # And it ran exactly once: one turn_started in its events, one exchange in the transcript
    with sse("GET", f"{cluster.url}/v1/sessions/{sid}/turns/{tid}/events") as stream:
        stream.until(is_terminal)
    assert [f.event for f in stream.frames].count("turn_started") == 1
    entries = transcript(cluster, sid)
    assert [(e["role"], e["content"]) for e in entries] == [
        ("user", "pay the invoice"),
        ("assistant", view["result"]["text"]),
    ]
    assert {e["turn_id"] for e in entries} == {tid}
