"""`stickless.client` against real `stickless serve` processes: one node in memory and one over
a real redis-server (every call of the surface, sync and async), and a cluster of three behind
haproxy running deploy/haproxy.cfg (and nginx running deploy/nginx.conf) where the node serving
a stream is SIGKILLed mid-turn: the client resumes on a survivor and gives every frame once."""

from __future__ import annotations

import itertools
import json
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stickless import (
    ConflictingAgentError,
    IdempotencyConflictError,
    InvalidRequestError,
    TurnFailedError,
    UnknownTurnError,
)
from stickless.client import (
    AsyncClient,
    Client,
    Gap,
    StreamEvent,
    UnauthenticatedError,
    UnknownSessionError,
)
from stickless.local_services import free_port

from .test_web_cluster import STORY, steer_away_from, warm_up
from .web_cluster import Haproxy, Nginx, WebCluster, _ready_line, _spawn, _stop

AGENT = "demo-agent"
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


@pytest.fixture(params=["memory", "redis"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A `stickless serve` process with bearer tokens, in memory or over Redis; its URL."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    port = free_port()
    args = [sys.executable, "-m", "stickless", "serve", "--port", str(port), "--tokens",
            str(tokens)]  # fmt: skip
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_url")
        args += ["--redis", redis_url, "--namespace", f"client{port}"]
    log = tmp_path / "serve.log"
    process = _spawn(args, log)
    try:
        _ready_line(process, "stickless serve", log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(process, signal.SIGTERM)


def texts(items: list[StreamEvent | Gap]) -> str:
    return "".join(
        i.data["text"] for i in items if isinstance(i, StreamEvent) and i.type == "text_delta"
    )


def test_the_sync_client_speaks_every_route(server: str) -> None:
    with Client(server, token="tok-alice") as alice:
        # A submit, and its answer by id
        first = alice.submit("s1", "hello", agent_ref=AGENT)
        assert first.origin == "new" and first.node_id and first.idempotency_key
        assert alice.result("s1", first.turn_id, timeout=20).text.startswith("you said 'hello'")
        # A submit streamed to its end, every frame once, with the turn's own answer at the end
        stream = alice.stream("s1", "tell me more", agent_ref=AGENT,
                                     idempotency_key="msg-2", priority="NEXT")  # fmt: skip
        items = list(stream)
        assert stream.turn_id and stream.origin == "new"
        assert items[0].type == "turn_started" and isinstance(items[-1], StreamEvent)
        assert items[-1].type == "turn_completed" and items[-1].terminal
        answer = alice.result("s1", stream.turn_id)
        assert texts(items) == answer.text + " "  # (the demo agent ends each word with a space)
        # The same key and input again: the same turn, answered from the cache
        again = alice.attach("s1", "msg-2", "tell me more", agent_ref=AGENT)
        assert (again.turn_id, again.origin) == (stream.turn_id, "cached")
        # A finished turn replays from a cursor, skipping what was already given
        replay = list(alice.follow_turn("s1", stream.turn_id, after=items[2].id))
        assert [i.id for i in replay] == [i.id for i in items[3:]]
        # History, status
        history = alice.transcript("s1")
        assert [e["role"] for e in history] == ["user", "assistant"] * 2
        assert [e["content"] for e in alice.transcript("s1", after=2)] == [
            "tell me more", answer.text
        ]
        assert alice.status("s1")["session_id"] == "s1"
        # Errors are the stickless exceptions of their codes
        with pytest.raises(IdempotencyConflictError, match="msg-2"):
            alice.submit("s1", "something else", agent_ref=AGENT, idempotency_key="msg-2")
        with pytest.raises(UnknownTurnError) as unknown:
            alice.turn("s1", "no-such-turn")
        assert unknown.value.status == 404  # type: ignore[attr-defined]
        with pytest.raises(ConflictingAgentError):
            alice.submit("s1", "x", agent_ref="another-agent")
        with pytest.raises(InvalidRequestError, match="after"):
            list(alice.follow_turn("s1", stream.turn_id, after="not-an-id"))
        # Interrupt a slow turn while its stream is read; the stream ends interrupted
        slow = alice.stream("s1", "a story", agent_ref=AGENT, submit_options=STORY)
        got = list(itertools.takewhile(lambda i: i.type != "text_delta", slow))  # type: ignore[union-attr]
        assert slow.turn_id is not None and got[0].type == "turn_started"  # type: ignore[union-attr]
        assert alice.interrupt("s1", turn_id=slow.turn_id)
        assert next(i for i in slow if isinstance(i, StreamEvent) and i.terminal).type == (
            "interrupted"
        )
        with pytest.raises(TurnFailedError) as interrupted:
            alice.result("s1", slow.turn_id, timeout=20)
        assert interrupted.value.code == "INTERRUPTED"
        # Bearer tokens: another principal does not see the session, no token is refused
        with Client(server, token="tok-bob") as bob, pytest.raises(UnknownSessionError):
            bob.transcript("s1")
        with Client(server) as nobody, pytest.raises(UnauthenticatedError):
            nobody.status("s1")
        # Release, then delete: the session is gone with its owner stamp
        alice.release("s1")
        assert len(alice.transcript("s1")) == 4
        alice.delete_session("s1")
        with pytest.raises(UnknownSessionError):
            alice.transcript("s1")


async def test_the_async_client_follows_a_session_and_waits_for_results(server: str) -> None:
    async with AsyncClient(server, token="tok-alice") as client:
        # Given a first turn streamed through the async client to its end
        first = [item async for item in client.stream("s2", "pong", agent_ref=AGENT)]
        assert isinstance(first[-1], StreamEvent) and first[-1].type == "turn_completed"
        # When the session is followed past that turn's last frame, and a second turn is sent
        session = client.follow_session("s2", after=first[-1].id)
        accepted = await client.submit("s2", "ping", agent_ref=AGENT)
        seen: list[StreamEvent | Gap] = []
        async for item in session:
            seen.append(item)
            if isinstance(item, StreamEvent) and item.terminal:
                break
        await session.aclose()
        # Then the session stream carried only the second turn, to its end
        assert {i.turn_id for i in seen if isinstance(i, StreamEvent)} == {accepted.turn_id}
        assert seen[0].type == "turn_started" and seen[-1].type == "turn_completed"  # type: ignore[union-attr]
        # And the lookups agree with it
        result = await client.result("s2", accepted.turn_id, timeout=20)
        assert texts(seen) == result.text + " "
        view = await client.turn("s2", accepted.turn_id, wait=20)
        assert view.finished and view.output().text.startswith("you said 'ping'")
        assert next(e["content"] for e in await client.transcript("s2", after=2)) == "ping"
        assert await client.interrupt("s2") is False  # nothing runs
        await client.release("s2")
        await client.delete_session("s2")
        with pytest.raises(UnknownSessionError):
            await client.status("s2")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("balancer", [Haproxy, Nginx])
def test_a_stream_resumes_without_loss_or_duplicates_after_its_node_dies(
    redis_url: str, tmp_path: Path, balancer: type[Haproxy]
) -> None:
    cluster = WebCluster(redis_url, tmp_path, nodes=3, balancer=balancer)
    with cluster, Client(cluster.url) as client:
        # Given a slow turn submitted and streamed by a node that does not hold the session
        sid = f"s-{uuid.uuid4().hex[:12]}"
        holder = warm_up(cluster, sid)
        serving = steer_away_from(cluster, holder)
        stream = client.stream(sid, "tell me a story", agent_ref=AGENT,
                                      submit_options=STORY)  # fmt: skip
        items: list[StreamEvent | Gap] = []
        for item in stream:
            items.append(item)
            # When that node is SIGKILLed after three words
            if len(texts(items).split()) == 3:
                assert stream.nodes == [serving] != [holder]
                cluster.node_named(serving).sigkill()
        # Then the stream went on on a survivor to the turn's end
        assert stream.nodes[0] == serving and serving not in stream.nodes[1:]
        assert len(stream.nodes) >= 2
        end = items[-1]
        assert isinstance(end, StreamEvent) and end.type == "turn_completed"
        assert end.data["executed_by"] == holder
        # And every frame came once, in order: the text is the turn's answer
        assert stream.turn_id is not None
        ids = [i.id for i in items if isinstance(i, StreamEvent)]
        assert None not in ids and len(set(ids)) == len(ids)
        seqs = [i.data["seq"] for i in items if isinstance(i, StreamEvent)]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        assert texts(items) == client.result(sid, stream.turn_id, timeout=30).text + " "
