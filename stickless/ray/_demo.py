"""`stickless demo --ray N`: the demo on a local N-node Ray cluster, and the agent it deploys.

The router actors import `make_opener` from here (every node can import the stickless package),
so the agent is self-contained: it streams a scripted reply word by word, stops when
interrupted and commits the user's and its own message to the transcript. Per-turn behaviour
comes from `submit_options`: `delay` (seconds between words), `story` (a long reply) and
`recall` (report how many entries were committed before this turn).

`run_ray_demo` starts a loopback Ray cluster (`ray.cluster_utils.Cluster`) and, unless given a
Redis URL, a private `redis-server` on a free loopback port; it deploys one router per Ray node
and walks through the scenes, then undeploys and stops Ray and Redis (the latter by its pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import local_services
from .._errors import FailureCode, IdempotencyConflictError, TurnFailedError
from .._events import Event, Interrupted, TextDelta, TurnStarted, is_terminal
from .._session import LiveSession, TurnContext
from .._types import TranscriptEntry, TurnOutput, TurnResult
from ..local_services import find_redis_server

if TYPE_CHECKING:
    from ..cli import Console

#: Agent name every demo session is bound to.
AGENT_REF = "demo-agent"

#: Router timings for the demo (short, so the TTL fallbacks would also settle quickly).
RAY_DEMO_CONFIG: dict[str, Any] = {
    "lease_ttl": 3.0,
    "lease_extend_interval": 1.0,
    "idempotency_secondary_ttl": 3.0,
    "holder_loss_sweep_interval": 1.0,
    "status_heartbeat_interval": 1.0,
    "forward_ttl": 20.0,
    "release_interrupt_timeout": 2.0,
    "interrupt_grace": 0.5,
}

_STORY = (
    "Once upon a time a request landed on a Ray node whose router did not hold its session, "
    "so the router forwarded it to the holder, which streamed every word to subscribers on "
    "other nodes, until somebody pressed stop or the holder's actor was killed"
)


# ====================================================================== the agent


class DemoAgent:
    """A LiveSession that streams a scripted reply word by word."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._turns = 0

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        options = turn.submit_options
        delay = options.get("delay", 0.02)
        delay = float(delay) if isinstance(delay, int | float) else 0.02
        text = turn.input.as_text()
        self._turns += 1
        data: dict[str, int] = {}
        if options.get("story"):
            reply = _STORY
        elif options.get("recall"):
            history = len(await turn.transcript.load())
            data["history"] = history
            reply = f"you said {text!r}; I can see {history} committed entries before this"
        else:
            reply = f"you said {text!r}; this handle has now run {self._turns} turn(s)"
        sent: list[str] = []
        for word in reply.split():
            if turn.interrupted.is_set():
                return TurnOutput(text=" ".join(sent), data={**data, "words": len(sent)})
            turn.emit(TextDelta(text=word + " "))
            sent.append(word)
            await asyncio.sleep(delay)
        await turn.transcript.append(
            TranscriptEntry(role="user", content=text),
            TranscriptEntry(role="assistant", content=reply),
        )
        return TurnOutput(text=reply, data={**data, "words": len(sent)})

    async def interrupt(self, reason: str) -> None:
        """Nothing to cancel: the turn watches `turn.interrupted` between words."""

    async def aclose(self) -> None:
        """Nothing to release."""


class DemoOpener:
    """Opens a DemoAgent per session."""

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return DemoAgent(session_id)


def make_opener() -> DemoOpener:
    """The opener the demo deploys: `stickless.ray._demo:make_opener`."""
    return DemoOpener()


# ====================================================================== infrastructure


class RayDemoError(Exception):
    """A scene saw something other than what stickless promises."""


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server on a free loopback port in a temporary directory; stopped by its pid.

    Raises:
        RayDemoError: redis-server is not on PATH or did not answer.
    """
    executable = find_redis_server()
    if executable is None:
        raise RayDemoError("redis-server is not on PATH (install it, or pass --redis URL)")
    try:
        with local_services.private_redis(executable, prefix="stickless-demo-redis-") as server:
            yield server.url
    except local_services.ServiceError as exc:
        raise RayDemoError(str(exc)) from exc


@contextlib.contextmanager
def local_ray_cluster(nodes: int) -> Iterator[list[str]]:
    """Start `nodes` Ray nodes on 127.0.0.1 (one head) and connect; yields their node ids,
    head first. Everything is shut down on exit (Ray stops the node processes by pid)."""
    try:
        with local_services.local_ray_cluster(nodes) as local:
            yield local.node_ids
    except local_services.ServiceError as exc:
        raise RayDemoError(str(exc)) from exc


# ====================================================================== demo state


@dataclass
class Submitted:
    """One submit as the demo saw it."""

    session_id: str
    label: str
    via: str  # router node id
    kind: str
    turn_id: str
    executed_by: str | None = None
    outcome: str = "pending"
    cached: bool = False


@dataclass
class RayDemo:
    console: Console
    namespace: str
    redis_url: str
    ray_nodes: list[str]  # head first
    token_delay: float
    handles: dict[str, Any] = field(default_factory=dict)  # ray node id -> router handle
    router_ids: dict[str, str] = field(default_factory=dict)  # ray node id -> router node id
    killed: list[str] = field(default_factory=list)  # router node ids
    records: list[Submitted] = field(default_factory=list)
    failover: dict[str, float] = field(default_factory=dict)

    def label(self, node_id: str | None) -> str:
        """`n<index>/<incarnation>` for a router node id (index: the Ray node, head = n0)."""
        if not node_id:
            return "?"
        ray_node, _, incarnation = node_id.partition("/")
        index = self.ray_nodes.index(ray_node) if ray_node in self.ray_nodes else -1
        return f"n{index}/{incarnation[:4]}"

    def router(self, index: int) -> tuple[Any, str]:
        """The handle and node id of the router on the index-th Ray node."""
        ray_node = self.ray_nodes[index % len(self.ray_nodes)]
        return self.handles[ray_node], self.router_ids[ray_node]

    async def refresh(self) -> None:
        """Look the routers up again (after the reconciler replaced one)."""
        from . import routers

        self.handles = routers(self.namespace)
        pings = await asyncio.gather(*(h.ping.remote() for h in self.handles.values()))
        self.router_ids = {p["ray_node_id"]: p["node_id"] for p in pings}

    def request(self, session_id: str, text: str, **extra: Any) -> dict[str, Any]:
        options = {"delay": self.token_delay, **extra.pop("submit_options", {})}
        return {
            "session_id": session_id,
            "agent_ref": AGENT_REF,
            "input": text,
            "submit_options": options,
            **extra,
        }

    async def submit(
        self, index: int, session_id: str, text: str, label: str, **extra: Any
    ) -> tuple[Any, Submitted]:
        """Submit through the router of Ray node `index`; print where it went."""
        handle, via = self.router(index)
        ticket = await handle.submit.remote(self.request(session_id, text, **extra))
        record = Submitted(session_id, label, via, ticket.kind, ticket.turn_id)
        self.records.append(record)
        self.console.line(
            "submit",
            f"{session_id:<11} {label:<7} via {self.label(via):<8} -> {ticket.kind:<17}"
            f" turn {ticket.turn_id[:8]}",
        )
        return handle, record

    async def outcome(self, handle: Any, record: Submitted) -> TurnResult | None:
        """Await a submit's result on the router it went through; print it."""
        try:
            result: TurnResult = await handle.result.remote(record.turn_id)
        except TurnFailedError as exc:
            record.outcome = exc.code.value
            self.console.line(
                "failed",
                f"{record.session_id:<11} {record.label:<7} via {self.label(record.via):<8} -> "
                f"TurnFailedError(code={exc.code.value})",
            )
            return None
        record.outcome = "ok"
        record.executed_by = result.executed_by
        self.console.line(
            "result",
            f"{record.session_id:<11} {record.label:<7} via {self.label(record.via):<8} -> "
            f"ran on {self.label(result.executed_by):<8} {result.text[:40]!r}",
        )
        return result

    async def committed(self, session_id: str) -> int:
        """How many transcript entries the session has committed (read from Redis)."""
        from ..backends.redis import RedisBackends

        backends = RedisBackends.from_url(self.redis_url, namespace=self.namespace)
        try:
            view = await backends.records.load(session_id)
            return len(view.entries) if view is not None else 0
        finally:
            await backends.aclose()


async def _frames(handle: Any, session_id: str, turn_id: str) -> AsyncIterator[Event]:
    """One turn's frames through a router's Ray streaming generator (replayed from the event
    log if they came before the subscription; the stream ends after the terminal frame)."""
    stream = handle.events.remote(session_id, after="0-0", turn_id=turn_id)
    async for ref in stream:
        event: Event = await ref
        yield event


# ====================================================================== scenes


async def scene_submits(demo: RayDemo) -> None:
    """Several sessions, several messages each, submitted concurrently through every router."""
    demo.console.line(
        "note",
        "3 sessions x 3 messages at once; each session's messages enter through different "
        "routers (different Ray nodes)",
    )
    sessions = ["chat-1", "chat-2", "chat-3"]
    plan = [(s + m, sid, m) for m in range(3) for s, sid in enumerate(sessions)]
    submitted = await asyncio.gather(
        *(demo.submit(i, sid, f"message {m + 1} for {sid}", f"msg {m + 1}") for i, sid, m in plan)
    )
    await asyncio.gather(*(demo.outcome(handle, record) for handle, record in submitted))
    for _, record in submitted:
        if record.outcome != "ok":
            raise RayDemoError(f"{record.session_id} {record.label} failed: {record.outcome}")
        if record.kind == "FORWARDED" and record.executed_by == record.via:
            raise RayDemoError(f"a forwarded turn ran on its submitting router {record.via}")
        if record.kind == "EXECUTED_LOCALLY" and record.executed_by != record.via:
            raise RayDemoError(f"a local turn ran on {record.executed_by}, not {record.via}")
    forwarded = sum(1 for _, r in submitted if r.kind == "FORWARDED")
    if forwarded == 0:
        raise RayDemoError("no submit was forwarded")
    for sid in sessions:
        ran_on = sorted({demo.label(r.executed_by) for _, r in submitted if r.session_id == sid})
        demo.console.line("check", f"{sid:<11} 3 turns, all on {', '.join(ran_on)}")
    demo.console.line("check", f"{forwarded} of {len(submitted)} submits were forwarded")


async def scene_stream(demo: RayDemo) -> None:
    """A subscriber on another router receives the text a turn streams."""
    sid = "chat-stream"
    handle, record = await demo.submit(0, sid, "tell me something", "msg 1")
    watcher, watcher_id = demo.router(1)
    demo.console.line(
        "subscribe", f"{sid:<11} {demo.label(watcher_id)} streams it (Ray streaming generator)"
    )
    deltas, ran_on, terminal = 0, "", ""
    async for event in _frames(watcher, sid, record.turn_id):
        if isinstance(event, TurnStarted):
            ran_on = event.executed_by
            demo.console.begin(
                "stream", f"{demo.label(watcher_id)} <- turn on {demo.label(ran_on)}: "
            )
        elif isinstance(event, TextDelta):
            deltas += 1
            demo.console.more(event.text)
        if is_terminal(event):
            terminal = event.type
    demo.console.end(f"[{terminal}]")
    await demo.outcome(handle, record)
    if not ran_on or ran_on == watcher_id:
        raise RayDemoError("the subscriber's router ran the turn itself")
    if deltas == 0:
        raise RayDemoError("the subscriber received no text")
    demo.console.line(
        "check",
        f"router {demo.label(watcher_id)} relayed {deltas} text deltas of a turn that ran on "
        f"{demo.label(ran_on)}",
    )


async def scene_interrupt(demo: RayDemo) -> None:
    """Interrupt a long turn from a router that does not hold the session."""
    sid = "chat-long"
    handle, record = await demo.submit(
        0, sid, "tell me a long story", "story", submit_options={"story": True}
    )
    watcher, watcher_id = demo.router(1)
    interrupter, interrupter_id = demo.router(2 if len(demo.ray_nodes) > 2 else 1)
    words: list[str] = []
    frames: list[Event] = []
    enough = asyncio.Event()

    async def watch() -> None:
        async for event in _frames(watcher, sid, record.turn_id):
            frames.append(event)
            if isinstance(event, TextDelta):
                words.append(event.text.strip())
                if len(words) == 6:
                    enough.set()

    watching = asyncio.create_task(watch())
    await asyncio.wait_for(enough.wait(), 20)
    holder = next((f.executed_by for f in frames if isinstance(f, TurnStarted)), "")
    demo.console.line(
        "stream", f"{demo.label(watcher_id)} has seen {len(words)} words: {' '.join(words)!r} ..."
    )
    demo.console.line(
        "interrupt",
        f"{sid:<11} interrupt(reason='USER') sent from {demo.label(interrupter_id)} "
        f"(holder is {demo.label(holder)})",
    )
    sent = time.monotonic()
    await interrupter.interrupt.remote(sid, reason="USER")
    try:
        await handle.result.remote(record.turn_id)
    except TurnFailedError as exc:
        record.outcome, record.executed_by = exc.code.value, holder
        demo.console.line(
            "failed",
            f"{sid:<11} caller via {demo.label(record.via)} got TurnFailedError(code="
            f"{exc.code.value}) {time.monotonic() - sent:.2f}s after the interrupt",
        )
        if exc.code is not FailureCode.INTERRUPTED:
            raise RayDemoError(f"expected INTERRUPTED, got {exc.code.value}") from exc
    else:
        raise RayDemoError("the interrupted turn succeeded")
    await asyncio.wait_for(watching, 10)
    last = frames[-1] if frames else None
    if not isinstance(last, Interrupted):
        raise RayDemoError(f"the subscriber's last frame was {last!r}, not Interrupted")
    demo.console.line(
        "event",
        f"subscriber on {demo.label(watcher_id)} saw Interrupted(reason={last.reason!r}) "
        f"after {len(words)} of {len(_STORY.split())} words",
    )
    if interrupter_id == holder:
        raise RayDemoError("the interrupt came from the holder itself")
    demo.console.line(
        "check", f"{sid:<11} the interrupted turn committed {await demo.committed(sid)} entries"
    )


async def scene_retry(demo: RayDemo) -> None:
    """A retry with the same idempotency key through another router is answered from cache."""
    sid = "chat-retry"
    key = "order-42"
    handle, record = await demo.submit(0, sid, "book a table for two", "order", idempotency_key=key)
    await demo.outcome(handle, record)
    if record.outcome != "ok":
        raise RayDemoError(f"the original turn failed: {record.outcome}")
    before = await demo.committed(sid)
    handle, again = await demo.submit(1, sid, "book a table for two", "retry", idempotency_key=key)
    again.cached = True
    await demo.outcome(handle, again)
    after = await demo.committed(sid)
    same = again.turn_id == record.turn_id
    demo.console.line(
        "cache",
        f"{sid:<11} same turn id: {'yes' if same else 'NO'}; committed entries "
        f"{before} -> {after} (the agent did not run again)",
    )
    demo.console.line("note", f"a cache answer reports {again.kind}: no turn was placed anywhere")
    if not same or after != before or again.outcome != "ok":
        raise RayDemoError("the retry was not answered from the cache")
    try:
        await demo.submit(2, sid, "book a table for ten", "misuse", idempotency_key=key)
    except IdempotencyConflictError:
        demo.console.line(
            "rejected",
            f"{sid:<11} same key, different input -> IdempotencyConflictError (HTTP 409)",
        )
    else:
        raise RayDemoError("reusing the key with another input was accepted")


async def scene_kill(demo: RayDemo) -> None:
    """`ray.kill` the router holding a session mid-turn: the caller gets HOLDER_LOST, the next
    turn runs on a survivor, and the reconciler gives the node a new router."""
    import ray

    sid = "chat-crash"
    last = len(demo.ray_nodes) - 1
    handle, record = await demo.submit(last, sid, "remember this", "warm-up")
    await demo.outcome(handle, record)
    if record.outcome != "ok" or record.executed_by is None:
        raise RayDemoError(f"the warm-up turn failed: {record.outcome}")
    holder_id = record.executed_by
    holder_node = holder_id.partition("/")[0]
    holder = demo.handles[holder_node]
    caller_index = next(i for i, n in enumerate(demo.ray_nodes) if n != holder_node)
    caller, record = await demo.submit(
        caller_index, sid, "tell me a long story", "story", submit_options={"story": True}
    )
    if record.kind != "FORWARDED":
        raise RayDemoError(f"the story was {record.kind}, not forwarded to the holder")
    record.executed_by = holder_id
    watcher_index = next(
        (i for i, n in enumerate(demo.ray_nodes) if n != holder_node and i != caller_index),
        caller_index,
    )
    watcher, watcher_id = demo.router(watcher_index)
    words: list[str] = []
    frames: list[Event] = []
    enough = asyncio.Event()
    killed_at = 0.0

    async def watch() -> None:
        async for event in _frames(watcher, sid, record.turn_id):
            frames.append(event)
            if isinstance(event, TextDelta):
                words.append(event.text.strip())
                if len(words) == 6:
                    enough.set()
            if isinstance(event, Interrupted):
                demo.console.line(
                    "event",
                    f"subscriber on {demo.label(watcher_id)} saw Interrupted(reason="
                    f"{event.reason!r}) {time.monotonic() - killed_at:.2f}s after the kill",
                )

    watching = asyncio.create_task(watch())
    await asyncio.wait_for(enough.wait(), 20)
    demo.console.line(
        "stream", f"{demo.label(watcher_id)} has seen {len(words)} words: {' '.join(words)!r} ..."
    )
    demo.console.line(
        "kill",
        f"ray.kill(router {demo.label(holder_id)}) mid-turn; the caller waits via "
        f"{demo.label(record.via)}",
    )
    killed_at = time.monotonic()
    ray.kill(holder)
    demo.killed.append(holder_id)
    try:
        await asyncio.wait_for(caller.result.remote(record.turn_id), 20)
    except TurnFailedError as exc:
        record.outcome = exc.code.value
        lost = time.monotonic() - killed_at
        demo.failover["holder_lost"] = lost
        demo.console.line(
            "failed",
            f"{sid:<11} caller via {demo.label(record.via)} got TurnFailedError(code="
            f"{exc.code.value}) {lost:.2f}s after the kill",
        )
        if exc.code is not FailureCode.HOLDER_LOST:
            raise RayDemoError(f"expected HOLDER_LOST, got {exc.code.value}") from exc
    else:
        raise RayDemoError("the turn on the killed router succeeded")
    await asyncio.wait_for(watching, 10)
    committed = await demo.committed(sid)
    demo.console.line("check", f"{sid:<11} {committed} committed entries after the kill")
    following, record = await demo.submit(
        caller_index, sid, "are you still there?", "next", submit_options={"recall": True}
    )
    placed = time.monotonic() - killed_at
    result = await demo.outcome(following, record)
    if result is None:
        raise RayDemoError(f"the turn after the kill failed: {record.outcome}")
    served = time.monotonic() - killed_at
    demo.failover["next_placed"], demo.failover["next_served"] = placed, served
    if result.executed_by == holder_id:
        raise RayDemoError("the next turn ran on the killed router")
    if result.data.get("history") != committed:
        raise RayDemoError(f"the survivor saw {result.data.get('history')} entries")
    demo.console.line(
        "check",
        f"{sid:<11} next turn served by survivor {demo.label(result.executed_by)}: placed "
        f"{placed:.2f}s, answered {served:.2f}s after the kill; it saw the {committed} "
        "committed entries",
    )
    fresh = await _recreated(demo, holder_node, holder_id)
    recreated = time.monotonic() - killed_at
    demo.failover["recreated"] = recreated
    demo.console.line(
        "reconcile",
        f"the reconciler started router {demo.label(fresh)} on the same Ray node "
        f"{recreated:.2f}s after the kill (a new incarnation)",
    )


async def scene_summary(demo: RayDemo) -> None:
    """Per-session and per-router tables."""
    records = demo.records
    rows: list[list[object]] = []
    for sid in sorted({r.session_id for r in records}):
        mine = [r for r in records if r.session_id == sid]
        ran = [r for r in mine if not r.cached]
        rows.append(
            [
                sid,
                len(mine),
                sum(1 for r in mine if r.kind == "FORWARDED"),
                sum(1 for r in mine if r.cached),
                sum(1 for r in ran if r.outcome == "ok"),
                sum(1 for r in ran if r.outcome not in ("ok", "pending")),
                await demo.committed(sid),
                ",".join(sorted({demo.label(r.executed_by) for r in ran if r.executed_by})),
            ]
        )
    demo.console.table(
        ["session", "submits", "forwarded", "cached", "ok", "failed", "entries", "ran on"], rows
    )
    sys.stdout.write("\n")
    routers_seen = sorted(
        {r.via for r in records} | {r.executed_by for r in records if r.executed_by},
        key=lambda n: (demo.label(n), n),
    )
    router_rows = [
        [
            demo.label(node),
            "killed" if node in demo.killed else "alive",
            sum(1 for r in records if r.via == node),
            sum(1 for r in records if r.via == node and r.kind == "EXECUTED_LOCALLY"),
            sum(1 for r in records if r.via == node and r.kind == "FORWARDED"),
            sum(1 for r in records if r.executed_by == node and not r.cached),
        ]
        for node in routers_seen
    ]
    demo.console.table(
        ["router", "state", "received", "executed locally", "forwarded", "turns run here"],
        router_rows,
    )
    times = demo.failover
    demo.console.line(
        "failover",
        f"ray.kill -> caller's HOLDER_LOST {times['holder_lost']:.2f}s; -> next turn placed "
        f"{times['next_placed']:.2f}s, answered {times['next_served']:.2f}s (it streams for a "
        f"while); -> router recreated {times['recreated']:.2f}s",
    )


SCENES = [
    ("submits through different routers", scene_submits),
    ("streaming to a subscriber on another router", scene_stream),
    ("interrupt from a router that does not hold the session", scene_interrupt),
    ("idempotent retry answered from the cache", scene_retry),
    ("the holder's router actor is killed mid-turn", scene_kill),
    ("summary", scene_summary),
]


# ====================================================================== runner


def run_ray_demo(
    nodes: int, token_delay: float, redis_url: str | None, timeout: float, console: Console
) -> int:
    """Run the scenes on a fresh local Ray cluster; 0 when all showed what they should."""
    from . import deploy, undeploy

    with contextlib.ExitStack() as stack:
        try:
            if redis_url is None:
                redis_url = stack.enter_context(private_redis())
                where = f"a private redis-server at {redis_url}"
            else:
                where = f"Redis at {redis_url.rpartition('@')[2]}"
            console.line("ray", f"starting a local Ray cluster: {nodes} nodes on 127.0.0.1")
            ray_nodes = stack.enter_context(local_ray_cluster(nodes))
        except RayDemoError as exc:
            console.line("FAILED", str(exc))
            return 1
        namespace = f"demo-{uuid.uuid4().hex[:6]}"
        deployed = time.monotonic()
        deploy(redis_url, "stickless.ray._demo:make_opener", namespace, **RAY_DEMO_CONFIG)
        stack.callback(undeploy, namespace, 1.0)
        demo = RayDemo(console, namespace, redis_url, ray_nodes, token_delay)

        async def scenes() -> None:
            await demo.refresh()
            await _armed(demo)
            console.line(
                "deploy",
                f"{len(demo.handles)} routers (one per Ray node, num_cpus=0) over {where}, "
                f"namespace {namespace!r}, in {time.monotonic() - deployed:.1f}s",
            )
            for ray_node in ray_nodes:
                router_id = demo.router_ids[ray_node]
                console.line("router", f"{demo.label(router_id):<8} = {router_id}")
            for number, (title, scene) in enumerate(SCENES, start=1):
                console.header(f"Scene {number}/{len(SCENES)}: {title}")
                await scene(demo)

        try:
            asyncio.run(asyncio.wait_for(scenes(), timeout))
        except RayDemoError as exc:
            console.line("FAILED", str(exc))
            return 1
        except TimeoutError:
            console.line("FAILED", f"the scenes did not finish within {timeout:.0f}s")
            return 1
    console.line("done", f"demo finished in {console.elapsed():.2f}s (Ray and Redis stopped)")
    return 0


async def _armed(demo: RayDemo) -> None:
    """Wait (bounded) until every router watches its peers, so a kill is noticed at once."""
    deadline = time.monotonic() + 30
    everyone = set(demo.router_ids.values())
    while True:
        nodes = list(demo.handles)
        watching = await asyncio.gather(*(demo.handles[n].watching.remote() for n in nodes))
        if all(
            everyone - {demo.router_ids[node]} <= set(seen)
            for node, seen in zip(nodes, watching, strict=True)
        ):
            return
        if time.monotonic() > deadline:
            raise RayDemoError("the routers did not start watching each other")
        await asyncio.sleep(0.1)


async def _recreated(demo: RayDemo, ray_node: str, old: str) -> str:
    """Wait (bounded) until the reconciler has a new router on `ray_node`; its node id."""
    from ray.exceptions import RayActorError

    from . import routers

    deadline = time.monotonic() + 60
    while True:
        handle = routers(demo.namespace).get(ray_node)
        if handle is not None:
            try:
                current = str((await handle.ping.remote())["node_id"])
            except RayActorError:  # the old incarnation's name is not released yet
                current = old
            if current != old:
                demo.handles[ray_node], demo.router_ids[ray_node] = handle, current
                return current
        if time.monotonic() > deadline:
            raise RayDemoError("the reconciler did not recreate the killed router")
        await asyncio.sleep(0.1)
