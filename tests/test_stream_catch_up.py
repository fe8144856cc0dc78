"""Open streams across a lost pub/sub connection: node B's pub/sub connection alone is cut (the
fault proxy resets it and refuses its SUBSCRIBE until healed) while node A runs a turn that a
stream on B follows; every frame A logged for the turn reaches B's stream once, in order
(`events()`, `follow()`, `stream()`, both SSE routes), and, across a Redis restart that lost the
log, the stream reports the gap instead of going silent."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from stickless import (
    DeploymentMode,
    Event,
    EventStream,
    LiveSession,
    RouterConfig,
    SessionRouter,
    SubmitKind,
    TextDelta,
    TurnContext,
    TurnOutput,
    UserInput,
    is_terminal,
)
from stickless.backends.redis import RedisBackends
from stickless.local_services import free_port
from stickless.node import NodeClient, NodeServer, NodeService
from stickless.router._stream import logged_frames
from stickless.web import GatewaySettings, create_app
from stickless.wire import Signal

from .agents import req
from .conftest import FAST
from .faults.fixtures import fault_proxy_fixture  # noqa: F401
from .faults.proxy import CutBefore, FaultProxy
from .redis_fixture import RedisServer, redis_executable
from .web.sse import frames as sse_frames

SESSION = "s1"
DURING = [f"during{i}" for i in range(5)]


@dataclass
class Phases:
    """Where the turn "go" waits: after its first frame until `cut`, after the frames emitted
    while B is cut off until `healed`."""

    cut: asyncio.Event = field(default_factory=asyncio.Event)
    healed: asyncio.Event = field(default_factory=asyncio.Event)


class PhasedSession:
    """'warm' answers at once; any other input emits 'before', then (once cut) the DURING
    frames, then (once healed) 'after'."""

    def __init__(self, phases: Phases) -> None:
        self._phases = phases

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        if turn.input.as_text() == "warm":
            return TurnOutput(text="warm")
        turn.emit(TextDelta(text="before"))
        await self._phases.cut.wait()
        for text in DURING:
            turn.emit(TextDelta(text=text))
        await self._phases.healed.wait()
        turn.emit(TextDelta(text="after"))
        return TurnOutput(text="done")

    async def interrupt(self, reason: str) -> None:
        return None

    async def inject(self, item: UserInput) -> bool:
        return False

    async def aclose(self) -> None:
        return None


class PhasedOpener:
    def __init__(self, phases: Phases) -> None:
        self._phases = phases

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return PhasedSession(self._phases)


@dataclass
class Pair:
    """Node A (direct to Redis, holds the session) and node B (through the fault proxy)."""

    a: SessionRouter
    b: SessionRouter
    proxy: FaultProxy
    phases: Phases
    #: A's own stream of the session, open before the turn: a frame reaches it once logged.
    watch: EventStream


@contextlib.asynccontextmanager
async def open_pair(url: str, proxy: FaultProxy, **overrides: Any) -> AsyncIterator[Pair]:
    """A over `url`, B through `proxy` (same namespace), A holding the session."""
    phases = Phases()
    namespace = f"c{uuid.uuid4().hex[:8]}"
    log_len = overrides.pop("event_log_max_len", 10_000)
    socket_timeout = overrides.pop("socket_timeout", 5.0)
    routers = []
    try:
        for node_id, node_url in (("a", url), ("b", proxy.url())):
            config = RouterConfig(
                node_id=node_id, mode=DeploymentMode.DISTRIBUTED, **{**FAST, **overrides}
            )
            backends = RedisBackends.from_url(
                node_url,
                namespace=namespace,
                event_log_max_len=log_len,
                socket_timeout=socket_timeout,
            )
            router = SessionRouter.build(
                config=config, opener=PhasedOpener(phases), backends=backends
            )
            routers.append(router)
            await router.start()
        a, b = routers
        await (await a.submit(req(SESSION, "warm"))).result  # A holds the session
        async with a.events(SESSION) as watch:
            await watch.ready()
            yield Pair(a, b, proxy, phases, watch)
    finally:
        phases.cut.set()
        phases.healed.set()
        for router in routers:
            await router.aclose(grace=0.5)
            await router.backends.aclose()


@pytest.fixture
async def pair(redis_url: str, fault_proxy: FaultProxy) -> AsyncIterator[Pair]:
    async with open_pair(redis_url, fault_proxy) as opened:
        yield opened


async def cut_pubsub(pair: Pair) -> CutBefore:
    """Reset B's pub/sub connection and refuse its SUBSCRIBE until `heal`: B hears nothing."""
    refused = pair.proxy.cut_before(command="SUBSCRIBE", times=None)
    assert pair.proxy.reset_connections(subscribed=True) == 1
    await refused.wait_fired()  # B reconnected and was refused: it is not subscribed
    return refused


async def heal(pair: Pair, refused: CutBefore) -> None:
    """Let B subscribe again; returns once it did (a SUBSCRIBE is confirmed after every
    channel B subscribed before it, on the same connection)."""
    refused.cancel()

    async def ignore(signal: Signal) -> None:
        return None

    await pair.b.backends.signals.subscribe_events("probe", ignore)


async def run_cut_turn(
    pair: Pair,
    turn_id: Callable[[], Awaitable[str]],
    cut: Callable[[], Awaitable[CutBefore]] | None = None,
) -> str:
    """Drive the turn "go" through the cut: 'before' heard by B, DURING logged while B is cut
    off, 'after' once B is subscribed again; returns the turn id."""
    tid = await turn_id()
    async for frame in pair.watch:
        if isinstance(frame, TextDelta) and frame.text == "before":
            break
    refused = await (cut() if cut is not None else cut_pubsub(pair))
    pair.phases.cut.set()
    async for frame in pair.watch:
        if isinstance(frame, TextDelta) and frame.text == DURING[-1]:
            break
    await heal(pair, refused)
    pair.phases.healed.set()
    return tid


async def last_logged_id(router: SessionRouter) -> str:
    frames = [f async for f in logged_frames(router.backends.events, SESSION, None)]
    assert frames[-1].event_id is not None
    return frames[-1].event_id


async def logged_ids(router: SessionRouter, turn_id: str) -> list[str | None]:
    frames = logged_frames(router.backends.events, SESSION, None)
    return [f.event_id async for f in frames if f.turn_id == turn_id]


async def until_terminal(frames: AsyncIterator[Event], turn_id: str) -> list[Event]:
    got: list[Event] = []
    async for frame in frames:
        if frame.turn_id == turn_id:
            got.append(frame)
            if is_terminal(frame):
                break
    return got


def assert_complete(got: list[Event], logged: list[str | None]) -> None:
    texts = [f.text for f in got if isinstance(f, TextDelta)]
    assert texts == ["before", *DURING, "after"]
    assert [f.event_id for f in got] == logged


async def test_events_catch_up_after_a_pubsub_cut(pair: Pair) -> None:
    # Given a session stream on B, open before A runs a turn
    stream = pair.b.events(SESSION)
    await stream.ready()
    submitted: list[Any] = []

    async def submit() -> str:
        submitted.append(await pair.a.submit(req(SESSION, "go")))
        return str(submitted[0].turn_id)

    # When B's pub/sub connection is cut while the turn emits, and comes back
    reading = asyncio.ensure_future(stream.__anext__())
    turn_id = await run_cut_turn(pair, submit)
    # Then B's stream yields every frame A logged for the turn, once, in order
    async with stream:
        first = await reading
        got = [first, *await until_terminal(stream, turn_id)] if first.turn_id == turn_id else []
    assert_complete(got, await logged_ids(pair.a, turn_id))
    assert stream.take_gaps() == []


async def test_follow_catches_up_after_a_pubsub_cut(pair: Pair) -> None:
    # Given B following a turn that runs on A
    handle = await pair.a.submit(req(SESSION, "go"))
    stream = await pair.b.follow(SESSION, handle.turn_id)
    reading = asyncio.ensure_future(until_terminal(stream, handle.turn_id))

    async def turn_id() -> str:
        return handle.turn_id

    # When B's pub/sub connection is cut while the turn emits, and comes back
    await run_cut_turn(pair, turn_id)
    async with stream:
        got = await reading
    # Then the follow yields every logged frame of the turn, once, in order
    assert_complete(got, await logged_ids(pair.a, handle.turn_id))


async def test_stream_catches_up_after_a_pubsub_cut(pair: Pair) -> None:
    # Given a turn submitted and streamed on B, which A (the holder) runs
    streams: list[Any] = []

    async def submit() -> str:
        streams.append(await pair.b.stream(req(SESSION, "go")))
        return str(streams[0].disposition.turn_id)

    reading: list[asyncio.Future[list[Event]]] = []

    async def submit_and_read() -> str:
        turn_id = await submit()
        reading.append(asyncio.ensure_future(until_terminal(streams[0], turn_id)))
        return turn_id

    # When B's pub/sub connection is cut while the turn emits, and comes back
    turn_id = await run_cut_turn(pair, submit_and_read)
    async with streams[0]:
        got = await reading[0]
    # Then the stream yields every logged frame of the turn, once, in order
    assert streams[0].disposition.kind is SubmitKind.FORWARDED  # A ran it
    assert_complete(got, await logged_ids(pair.a, turn_id))


@contextlib.asynccontextmanager
async def serving(router: SessionRouter) -> AsyncIterator[str]:
    """The router's HTTP app on a loopback uvicorn server; yields its base URL."""
    port = free_port()
    app = create_app(router, settings=GatewaySettings(heartbeat=0.2))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
        assert not task.done(), "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.mark.parametrize("route", ["turn", "session"])
async def test_sse_routes_catch_up_after_a_pubsub_cut(pair: Pair, route: str) -> None:
    # Given an SSE stream served by B of a turn (or the session, resumed past the frames
    # logged before the turn) that runs on A
    since = await last_logged_id(pair.a)
    handle = await pair.a.submit(req(SESSION, "go"))
    path = f"/v1/sessions/{SESSION}" + (f"/turns/{handle.turn_id}" if route == "turn" else "")
    path += "/events" if route == "turn" else f"/events?after={since}"
    got: list[SseSeen] = []
    heard_first = asyncio.Event()
    reading = asyncio.ensure_future(read_sse(pair.b, path, got, heard_first))

    async def turn_id() -> str:
        await heard_first.wait()
        return handle.turn_id

    # When B's pub/sub connection is cut while the turn emits, and comes back
    await run_cut_turn(pair, turn_id)
    await reading
    # Then the SSE stream carries every logged frame of the turn, once, in order, no gap
    assert "gap" not in [seen.event for seen in got]
    assert [seen.id for seen in got] == await logged_ids(pair.a, handle.turn_id)
    assert [seen.text for seen in got if seen.text] == ["before", *DURING, "after"]


async def test_a_stream_catches_up_across_a_redis_restart(tmp_path: Path) -> None:
    # Given a Redis with persistence, A direct to it, B through a proxy, and a session
    # stream on B that heard the turn's first frame
    server = RedisServer(tmp_path, appendonly=True, executable=redis_executable())
    with server, FaultProxy("127.0.0.1", server.port) as proxy:
        # (leases outlive the restart: the turn goes on)
        async with open_pair(server.url, proxy, lease_ttl=10.0) as p:
            stream = p.b.events(SESSION)
            await stream.ready()
            submitted: list[Any] = []
            reading = asyncio.ensure_future(stream.__anext__())

            async def submit() -> str:
                submitted.append(await p.a.submit(req(SESSION, "go")))
                return str(submitted[0].turn_id)

            # When Redis restarts mid-turn and B subscribes again only after the turn's
            # later frames were logged
            async def restart() -> CutBefore:
                refused = proxy.cut_before(command="SUBSCRIBE", times=None)
                server.restart()
                await refused.wait_fired()
                return refused

            turn_id = await run_cut_turn(p, submit, cut=restart)
            # Then B's stream yields every frame logged for the turn, once, in order
            async with stream:
                first = await reading
                got = [first, *await until_terminal(stream, turn_id)]
            assert_complete(got, await logged_ids(p.a, turn_id))
        assert proxy.errors == []


async def test_a_stream_opened_while_pubsub_is_down_catches_up_once_it_is_back(
    redis_url: str, fault_proxy: FaultProxy
) -> None:
    # Given B's pub/sub cut off, and a session stream opened on B meanwhile (its channel's
    # SUBSCRIBE goes unconfirmed: B retries it)
    async with open_pair(redis_url, fault_proxy, socket_timeout=0.5) as p:
        refused = await cut_pubsub(p)
        stream = p.b.events(SESSION)
        await stream.ready()
        # When A runs a turn while B is cut off, and B's pub/sub comes back
        handle = await p.a.submit(req(SESSION, "go"))
        async for frame in p.watch:
            if isinstance(frame, TextDelta) and frame.text == "before":
                break
        p.phases.cut.set()
        async for frame in p.watch:
            if isinstance(frame, TextDelta) and frame.text == DURING[-1]:
                break
        refused.cancel()
        # Then B's stream catches up on what it missed, then goes on live
        async with stream:
            got = [await asyncio.wait_for(stream.__anext__(), 20)]
            p.phases.healed.set()
            got += await asyncio.wait_for(until_terminal(stream, handle.turn_id), 20)
        assert_complete(got, await logged_ids(p.a, handle.turn_id))


async def test_own_frames_do_not_carry_a_stream_past_frames_it_missed(pair: Pair) -> None:
    # Given a session stream on B, open and caught up, and B's pub/sub cut off
    stream = pair.b.events(SESSION)
    await stream.ready()
    since = await last_logged_id(pair.a)
    refused = await cut_pubsub(pair)
    # When A runs a turn while B is cut off, then B takes the session over and runs one of
    # its own (its frames reach B's streams without its pub/sub), and B's pub/sub comes back
    missed = await pair.a.submit(req(SESSION, "warm"))
    await missed.result
    await pair.a.release_session(SESSION)
    reading = asyncio.ensure_future(stream.__anext__())  # (a reader waiting all along)
    own = await pair.b.submit(req(SESSION, "warm"))
    assert own.kind is SubmitKind.EXECUTED_LOCALLY
    await own.result
    await heal(pair, refused)
    # Then B's stream yields both turns' frames, each once, in log order, and no gap
    got = [await reading]
    async with stream:
        async for frame in stream:
            got.append(frame)
            if frame.turn_id == own.turn_id and is_terminal(frame):
                break
    logged = [f async for f in logged_frames(pair.a.backends.events, SESSION, since)]
    assert [f.event_id for f in got] == [f.event_id for f in logged]
    assert {f.turn_id for f in got} == {missed.turn_id, own.turn_id}
    assert stream.take_gaps() == []


@pytest.mark.parametrize("reader", ["events", "sse", "node"])
async def test_a_stream_reports_the_gap_when_the_log_trimmed_what_it_missed(
    redis_url: str, fault_proxy: FaultProxy, reader: str
) -> None:
    # Given a log that keeps 4 frames, and a session stream on B (Python, SSE, or over the
    # node protocol)
    async with open_pair(redis_url, fault_proxy, event_log_max_len=4) as p:
        since = await last_logged_id(p.a)
        handle = await p.a.submit(req(SESSION, "go"))
        got: list[tuple[str, Any]] = []  # (kind, text / gap) in the order the reader met them
        heard_first = asyncio.Event()
        readers = {"events": _read_events, "sse": _read_sse_kinds, "node": _read_node}
        reading = asyncio.ensure_future(
            readers[reader](p.b, handle.turn_id, since, got, heard_first)
        )

        async def turn_id() -> str:
            await heard_first.wait()
            return handle.turn_id

        # When B's pub/sub is cut while the turn emits more frames than the log keeps
        await run_cut_turn(p, turn_id)
        await reading
    # Then the stream says where its gap lies (after 'before'), then goes on, in order
    kinds = [kind for kind, _ in got]
    assert kinds.count("gap") == 1
    at = kinds.index("gap")
    texts = [value for kind, value in got if kind == "text_delta"]
    assert texts[0] == "before" and kinds[at - 1] == "text_delta" and got[at - 1][1] == "before"
    assert texts[-1] == "after"
    resumed = texts[1:-1]
    assert 0 < len(resumed) < len(DURING) and resumed == DURING[-len(resumed):]


async def _read_events(
    router: SessionRouter,
    turn_id: str,
    since: str,
    got: list[tuple[str, Any]],
    heard: asyncio.Event,
) -> None:
    async with router.events(SESSION, after=since) as stream:
        async for frame in stream:
            got.extend(("gap", gap) for gap in stream.take_gaps())
            if frame.turn_id != turn_id:
                continue
            got.append((frame.type, frame.text if isinstance(frame, TextDelta) else None))
            heard.set()
            if is_terminal(frame):
                return


@dataclass(frozen=True)
class SseSeen:
    event: str
    id: str | None
    text: str | None


async def read_sse(
    router: SessionRouter, path: str, got: list[SseSeen], heard: asyncio.Event
) -> None:
    """Read the SSE route `path` served by `router` until a `turn_completed` frame, noting
    every data frame in `got` (`heard` is set at the first)."""
    async with (
        serving(router) as base,
        httpx.AsyncClient(base_url=base, timeout=30) as client,
        client.stream("GET", path) as response,
    ):
        async for frame in sse_frames(response):
            if frame.data is None:
                continue
            text = frame.data.get("text") if frame.event == "text_delta" else None
            got.append(SseSeen(frame.event, frame.id, text))
            heard.set()
            if frame.event == "turn_completed":
                return


async def _read_node(
    router: SessionRouter,
    turn_id: str,
    since: str,
    got: list[tuple[str, Any]],
    heard: asyncio.Event,
) -> None:
    """`_read_events` through a client of the router's loopback node server."""
    server = NodeServer(NodeService(router))
    client = await NodeClient.connect(await server.start())
    try:
        stream = await client.events(SESSION, after=since)
        await stream.ready()
        async for frame in stream:
            got.extend(("gap", gap) for gap in stream.take_gaps())
            if frame.turn_id != turn_id:
                continue
            got.append((frame.type, frame.text if isinstance(frame, TextDelta) else None))
            heard.set()
            if is_terminal(frame):
                await stream.aclose()
                return
    finally:
        await client.aclose()
        await server.aclose()


async def _read_sse_kinds(
    router: SessionRouter,
    turn_id: str,
    since: str,
    got: list[tuple[str, Any]],
    heard: asyncio.Event,
) -> None:
    seen: list[SseSeen] = []
    try:
        await read_sse(router, f"/v1/sessions/{SESSION}/events?after={since}", seen, heard)
    finally:
        got.extend((frame.event, frame.text) for frame in seen)
