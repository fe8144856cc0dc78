"""Command line entry point: `stickless demo` (more subcommands such as bench/node later)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import (
    Event,
    FailureCode,
    IdempotencyConflictError,
    Interrupted,
    SessionRouter,
    SubmitDisposition,
    SubmitKind,
    SubmitRequest,
    TextDelta,
    TranscriptEntry,
    TurnContext,
    TurnFailedError,
    TurnOutput,
    TurnResult,
    TurnStarted,
    is_terminal,
)
from .testing import LocalCluster

#: Agent name every demo session is bound to.
AGENT_REF = "demo-agent"

#: Short cluster timings so every scene settles in well under a second.
DEMO_CONFIG: dict[str, Any] = {
    "lease_ttl": 3.0,
    "lease_extend_interval": 1.0,
    "idempotency_secondary_ttl": 3.0,
    "holder_loss_sweep_interval": 1.0,
    "status_heartbeat_interval": 1.0,
    "forward_ttl": 20.0,
    "release_interrupt_timeout": 2.0,
    "interrupt_grace": 0.5,
}

_LONG_STORY = (
    "Once upon a time a request landed on a node that did not hold its session, so the node "
    "forwarded it to the holder, which streamed every word back to whoever was listening, "
    "anywhere in the cluster, until somebody pressed stop"
)


class DemoError(Exception):
    """A scene saw something other than what stickless promises."""


# ====================================================================== output


class Console:
    """Timestamped, labelled lines written to stdout as things happen."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the demo started."""
        return time.monotonic() - self._t0

    def _stamp(self) -> str:
        return f"[{self.elapsed():6.2f}s]"

    def line(self, tag: str, text: str = "") -> None:
        """Print one labelled line at once."""
        sys.stdout.write(f"{self._stamp()} {tag:<10} {text}".rstrip() + "\n")
        sys.stdout.flush()

    def begin(self, tag: str, text: str) -> None:
        """Start a line that later `more` calls extend (used for streamed text)."""
        sys.stdout.write(f"{self._stamp()} {tag:<10} {text}")
        sys.stdout.flush()

    def more(self, text: str) -> None:
        """Append to the line opened by `begin`."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def end(self, text: str = "") -> None:
        """Finish the line opened by `begin`."""
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def header(self, title: str) -> None:
        """Print a scene banner."""
        bar = "=" * max(0, 78 - len(title) - 4)
        sys.stdout.write(f"\n== {title} {bar}\n")
        sys.stdout.flush()

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """Print rows as aligned plain-text columns."""
        cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        rule = "  ".join("-" * w for w in widths)
        for index, row in enumerate(cells):
            sys.stdout.write(
                "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            )
            sys.stdout.write("\n")
            if index == 0:
                sys.stdout.write("  " + rule + "\n")
        sys.stdout.flush()


def _short(turn_id: str) -> str:
    return turn_id[:8]


# ====================================================================== the scripted agent


@dataclass
class AgentLedger:
    """What the scripted agents did, shared by every node (they all live in this process)."""

    executions: collections.Counter[str] = field(default_factory=collections.Counter)
    running: collections.Counter[str] = field(default_factory=collections.Counter)
    max_parallel: collections.Counter[str] = field(default_factory=collections.Counter)
    interrupts: list[tuple[str, str]] = field(default_factory=list)
    opened: collections.Counter[str] = field(default_factory=collections.Counter)


class ScriptedAgent:
    """A LiveSession that streams a scripted reply word by word and stops when interrupted."""

    def __init__(self, session_id: str, ledger: AgentLedger, token_delay: float) -> None:
        self._session_id = session_id
        self._ledger = ledger
        self._delay = token_delay
        self._turns = 0

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        """Stream the reply, then stage the user and assistant transcript entries."""
        ledger = self._ledger
        ledger.executions[self._session_id] += 1
        ledger.running[self._session_id] += 1
        ledger.max_parallel[self._session_id] = max(
            ledger.max_parallel[self._session_id], ledger.running[self._session_id]
        )
        self._turns += 1
        try:
            text = turn.input.as_text()
            data: dict[str, int] = {}
            if turn.submit_options.get("story"):
                reply = _LONG_STORY
            elif turn.submit_options.get("recall"):
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
                await asyncio.sleep(self._delay)
            await turn.transcript.append(
                TranscriptEntry(role="user", content=text),
                TranscriptEntry(role="assistant", content=reply),
            )
            return TurnOutput(text=reply, data={**data, "words": len(sent)})
        finally:
            ledger.running[self._session_id] -= 1

    async def interrupt(self, reason: str) -> None:
        """Record the interrupt; the turn itself watches `turn.interrupted`."""
        self._ledger.interrupts.append((self._session_id, reason))

    async def aclose(self) -> None:
        """Nothing to release: the agent holds no outside resources."""


# ====================================================================== demo state


@dataclass
class SubmitRecord:
    """One submit as the demo saw it: where it entered, what happened, where it ran."""

    session_id: str
    label: str
    via: str
    kind: SubmitKind
    turn_id: str
    executed_by: str | None = None
    outcome: str = "pending"
    cached: bool = False


@dataclass
class Demo:
    """Everything scenes share: the cluster, the agents' ledger, the console and the records."""

    cluster: LocalCluster
    ledger: AgentLedger
    console: Console
    records: list[SubmitRecord] = field(default_factory=list)

    @property
    def nodes(self) -> list[SessionRouter]:
        """Nodes still running (killed or closed ones drop out)."""
        return self.cluster.alive

    def node(self, node_id: str) -> SessionRouter:
        """The live router with this id."""
        for router in self.nodes:
            if router.node_id == node_id:
                return router
        raise DemoError(f"no live node {node_id}")

    def others(self, *node_ids: str | None) -> list[SessionRouter]:
        """Live routers other than the given ones."""
        return [n for n in self.nodes if n.node_id not in node_ids]

    async def submit(
        self,
        via: SessionRouter,
        session_id: str,
        text: str,
        label: str,
        **extra: object,
    ) -> tuple[SubmitDisposition, SubmitRecord]:
        """Submit through `via`, print where it went, and keep a record."""
        request = SubmitRequest(session_id=session_id, agent_ref=AGENT_REF, input=text, **extra)
        disp = await via.submit(request)
        record = SubmitRecord(session_id, label, via.node_id, disp.kind, disp.turn_id)
        self.records.append(record)
        self.console.line(
            "submit",
            f"{session_id:<11} {label:<7} via {via.node_id:<7} -> {disp.kind.value:<17}"
            f" turn {_short(disp.turn_id)}",
        )
        return disp, record

    async def outcome(self, disp: SubmitDisposition, record: SubmitRecord) -> TurnResult | None:
        """Await a submit's result, print it as it lands, and complete the record."""
        try:
            result = await disp.result
        except TurnFailedError as exc:
            record.outcome = exc.code.value
            self.console.line(
                "failed",
                f"{record.session_id:<11} {record.label:<7} via {record.via:<7} -> "
                f"TurnFailedError(code={exc.code.value})",
            )
            return None
        record.outcome = "ok"
        record.executed_by = result.executed_by
        self.console.line(
            "result",
            f"{record.session_id:<11} {record.label:<7} via {record.via:<7} -> "
            f"ran on {result.executed_by:<7} {result.text[:44]!r}",
        )
        return result


Scene = Callable[[Demo], Awaitable[None]]


# ====================================================================== scenes


async def scene_concurrent_submits(demo: Demo) -> None:
    """Scene: several sessions, several messages each, submitted concurrently via every node."""
    demo.console.line(
        "note",
        "3 sessions x 3 messages, submitted all at once; each session's messages enter "
        "through different nodes",
    )
    sessions = ["chat-1", "chat-2", "chat-3"]
    nodes = demo.nodes
    plan = [
        (nodes[(s + m) % len(nodes)], sid, m) for m in range(3) for s, sid in enumerate(sessions)
    ]
    submitted = await asyncio.gather(
        *(
            demo.submit(node, sid, f"message {m + 1} for {sid}", f"msg {m + 1}")
            for node, sid, m in plan
        )
    )
    await asyncio.gather(*(demo.outcome(disp, record) for disp, record in submitted))
    for _, record in submitted:
        if record.outcome != "ok":
            raise DemoError(f"{record.session_id} {record.label} failed: {record.outcome}")
        if record.kind is SubmitKind.FORWARDED and record.executed_by == record.via:
            raise DemoError(f"a forwarded turn ran on its submitting node {record.via}")
        if record.kind is SubmitKind.EXECUTED_LOCALLY and record.executed_by != record.via:
            raise DemoError(f"a local turn ran on {record.executed_by}, not {record.via}")
    forwarded = sum(1 for _, r in submitted if r.kind is SubmitKind.FORWARDED)
    if forwarded == 0:
        raise DemoError("no submit was forwarded")
    for sid in sessions:
        ran_on = {r.executed_by for _, r in submitted if r.session_id == sid}
        demo.console.line(
            "check",
            f"{sid:<11} 3 turns, all on {', '.join(sorted(str(n) for n in ran_on))}; "
            f"at most {demo.ledger.max_parallel[sid]} at a time",
        )
    demo.console.line("check", f"{forwarded} of {len(submitted)} submits were forwarded")


async def scene_remote_stream(demo: Demo) -> None:
    """Scene: a subscriber on one node receives the text streamed by a turn on another node."""
    sid = "chat-stream"
    runner, subscriber_node, *_ = demo.nodes
    stream = subscriber_node.events(sid)
    await stream.ready()
    demo.console.line("subscribe", f"{sid:<11} subscriber opened on {subscriber_node.node_id}")
    disp, record = await demo.submit(runner, sid, "tell me something", "msg 1")
    deltas = 0
    ran_on = ""
    terminal = ""
    async with stream:
        async for event in stream:
            if event.turn_id != disp.turn_id:
                continue
            if isinstance(event, TurnStarted):
                ran_on = event.executed_by
                demo.console.begin(
                    "stream",
                    f"{subscriber_node.node_id} <- turn on {ran_on}: ",
                )
            elif isinstance(event, TextDelta):
                deltas += 1
                demo.console.more(event.text)
            if is_terminal(event):
                terminal = event.type
                break
    demo.console.end(f"[{terminal}]")
    await demo.outcome(disp, record)
    if ran_on == subscriber_node.node_id or not ran_on:
        raise DemoError("the subscriber was not on a different node from the turn")
    if deltas == 0:
        raise DemoError("the remote subscriber received no text")
    demo.console.line(
        "check",
        f"subscriber on {subscriber_node.node_id} got {deltas} text deltas from a turn "
        f"that ran on {ran_on} (a remote subscriber)",
    )


async def scene_interrupt(demo: Demo) -> None:
    """Scene: interrupt a long turn from a node that does not hold the session."""
    sid = "chat-long"
    runner, watcher, interrupter, *_ = demo.nodes
    stream = watcher.events(sid)
    await stream.ready()
    seen_words = asyncio.Event()
    words: list[str] = []
    frames: list[Event] = []

    async def watch() -> None:
        async with stream:
            async for event in stream:
                frames.append(event)
                if isinstance(event, TextDelta):
                    words.append(event.text.strip())
                    if len(words) == 6:
                        seen_words.set()
                if is_terminal(event):
                    return

    watching = asyncio.create_task(watch())
    disp, record = await demo.submit(
        runner, sid, "tell me a long story", "story", submit_options={"story": True}
    )
    await asyncio.wait_for(seen_words.wait(), 10)
    demo.console.line(
        "stream", f"{watcher.node_id} has seen {len(words)} words: {' '.join(words)!r} ..."
    )
    demo.console.line(
        "interrupt",
        f"{sid:<11} interrupt(reason='USER') sent from {interrupter.node_id} "
        f"(holder is {runner.node_id})",
    )
    sent_at = time.monotonic()
    await interrupter.interrupt(sid, reason="USER")
    try:
        await disp.result
    except TurnFailedError as exc:
        record.outcome = exc.code.value
        record.executed_by = runner.node_id
        demo.console.line(
            "failed",
            f"{sid:<11} caller on {runner.node_id} got TurnFailedError(code={exc.code.value}) "
            f"{time.monotonic() - sent_at:.2f}s after the interrupt",
        )
        if exc.code is not FailureCode.INTERRUPTED:
            raise DemoError(f"expected INTERRUPTED, got {exc.code.value}") from exc
    else:
        raise DemoError("the interrupted turn succeeded")
    await asyncio.wait_for(watching, 5)
    last = frames[-1] if frames else None
    if not isinstance(last, Interrupted):
        raise DemoError(f"the subscriber's last frame was {last!r}, not Interrupted")
    started = next((f for f in frames if isinstance(f, TurnStarted)), None)
    if started is not None:
        record.executed_by = started.executed_by
    demo.console.line(
        "event",
        f"subscriber on {watcher.node_id} saw Interrupted(reason={last.reason!r}) after "
        f"{len(words)} of {len(_LONG_STORY.split())} words",
    )
    record_view = await demo.cluster.backends.records.load(sid)
    committed = len(record_view.entries) if record_view is not None else 0
    demo.console.line("check", f"{sid:<11} the interrupted turn committed {committed} entries")


async def scene_idempotent_retry(demo: Demo) -> None:
    """Scene: a retry with the same idempotency key is answered from the cache, not re-run."""
    sid = "chat-1"
    holder = next((r.executed_by for r in demo.records if r.session_id == sid), None)
    first, retry, *_ = demo.others(holder) + demo.nodes
    key = "order-42"
    disp, record = await demo.submit(
        first, sid, "book a table for two", "order", idempotency_key=key
    )
    await demo.outcome(disp, record)
    if record.outcome != "ok":
        raise DemoError(f"the original turn failed: {record.outcome}")
    before = demo.ledger.executions[sid]
    demo.console.line(
        "note", f"{sid:<11} agent executions so far: {before}; retrying on {retry.node_id}"
    )
    again, again_record = await demo.submit(
        retry, sid, "book a table for two", "retry", idempotency_key=key
    )
    again_record.cached = True
    answered_at_once = again.result.done()
    await demo.outcome(again, again_record)
    after = demo.ledger.executions[sid]
    same_turn = again.turn_id == disp.turn_id
    demo.console.line(
        "cache",
        f"{sid:<11} same turn id: {'yes' if same_turn else 'NO'}; result ready at submit: "
        f"{'yes' if answered_at_once else 'no'}; agent executions {before} -> {after}",
    )
    demo.console.line(
        "note", f"a cache answer reports {again.kind.value}: no turn was placed anywhere"
    )
    if not same_turn or after != before or again_record.outcome != "ok":
        raise DemoError("the retry was not answered from the cache")
    demo.console.line("check", "cache hit: the retry got the original result, no second run")
    try:
        await demo.submit(retry, sid, "book a table for ten", "misuse", idempotency_key=key)
    except IdempotencyConflictError:
        demo.console.line(
            "rejected",
            f"{sid:<11} same key, different input -> IdempotencyConflictError (HTTP 409)",
        )
    else:
        raise DemoError("reusing the key with another input was accepted")


async def scene_holder_lost(demo: Demo) -> None:
    """Scene: the holder crashes mid-turn; the forwarded caller and a remote subscriber are told
    HOLDER_LOST, and the next turn runs on a survivor over the committed transcript."""
    sid = "chat-crash"
    disp, record = await demo.submit(demo.nodes[0], sid, "remember this", "warm-up")
    await demo.outcome(disp, record)
    if record.outcome != "ok" or record.executed_by is None:
        raise DemoError(f"the warm-up turn failed: {record.outcome}")
    holder = demo.node(record.executed_by)
    caller, watcher, *_ = demo.others(holder.node_id)
    status = await caller.status(sid)
    demo.console.line(
        "holder",
        f"{sid:<11} held by {holder.node_id} (status seen from {caller.node_id}: "
        f"holder={status.holder}, lease token {status.token})",
    )
    stream = watcher.events(sid)
    await stream.ready()
    demo.console.line("subscribe", f"{sid:<11} subscriber opened on {watcher.node_id}")
    disp, record = await demo.submit(
        caller, sid, "tell me a long story", "story", submit_options={"story": True}
    )
    if disp.kind is not SubmitKind.FORWARDED:
        raise DemoError(f"the submit via {caller.node_id} was {disp.kind.value}, not forwarded")
    record.executed_by = holder.node_id
    seen_words = asyncio.Event()
    words: list[str] = []
    frames: list[Event] = []
    killed_at = 0.0

    async def watch() -> None:
        async with stream:
            async for event in stream:
                if event.turn_id != disp.turn_id:
                    continue
                frames.append(event)
                if isinstance(event, TextDelta):
                    words.append(event.text.strip())
                    if len(words) == 6:
                        seen_words.set()
                if isinstance(event, Interrupted):
                    demo.console.line(
                        "event",
                        f"subscriber on {watcher.node_id} saw Interrupted(reason="
                        f"{event.reason!r}) {time.monotonic() - killed_at:.2f}s after the kill",
                    )
                if is_terminal(event):
                    return

    watching = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(seen_words.wait(), 10)
        demo.console.line(
            "stream", f"{watcher.node_id} has seen {len(words)} words: {' '.join(words)!r} ..."
        )
        demo.console.line(
            "kill",
            f"{holder.node_id} crashes mid-turn (no release, no announcement); "
            f"caller waits on {caller.node_id}",
        )
        killed_at = time.monotonic()
        await demo.cluster.kill(holder)
        try:
            await asyncio.wait_for(disp.result, 15)
        except TurnFailedError as exc:
            record.outcome = exc.code.value
            demo.console.line(
                "failed",
                f"{sid:<11} caller on {caller.node_id} got TurnFailedError(code="
                f"{exc.code.value}) {time.monotonic() - killed_at:.2f}s after the kill",
            )
            if exc.code is not FailureCode.HOLDER_LOST:
                raise DemoError(f"expected HOLDER_LOST, got {exc.code.value}") from exc
        except TimeoutError as exc:
            raise DemoError("the caller got no answer after the holder was killed") from exc
        else:
            raise DemoError("the turn on the killed holder succeeded")
        await asyncio.wait_for(watching, 10)
    except TimeoutError as exc:
        raise DemoError("the subscriber never saw the turn end") from exc
    finally:
        if not watching.done():
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    last = frames[-1] if frames else None
    if not isinstance(last, Interrupted) or last.reason != FailureCode.HOLDER_LOST.value:
        raise DemoError(f"the subscriber's last frame was {last!r}, not Interrupted(HOLDER_LOST)")
    view = await demo.cluster.backends.records.load(sid)
    committed = len(view.entries) if view is not None else 0
    demo.console.line(
        "check", f"{sid:<11} {committed} committed entries in the record store after the crash"
    )
    survivors = {n.node_id for n in demo.nodes}
    disp, record = await demo.submit(
        watcher, sid, "are you still there?", "next", submit_options={"recall": True}
    )
    result = await demo.outcome(disp, record)
    if result is None:
        raise DemoError(f"the turn after the crash failed: {record.outcome}")
    if result.executed_by not in survivors or result.executed_by == holder.node_id:
        raise DemoError(f"the turn after the crash ran on {result.executed_by}, not a survivor")
    history = result.data.get("history")
    if history != committed:
        raise DemoError(f"the new holder saw {history} entries, not the {committed} committed")
    view = await demo.cluster.backends.records.load(sid)
    after = len(view.entries) if view is not None else 0
    demo.console.line(
        "check",
        f"{sid:<11} next turn served by survivor {result.executed_by}; it saw {history} "
        f"committed entries of earlier turns; {after} committed now",
    )


async def scene_summary(demo: Demo) -> None:
    """Scene: per-session and per-node tables of what happened."""
    records = demo.records
    sessions = sorted({r.session_id for r in records})
    rows: list[list[object]] = []
    for sid in sessions:
        mine = [r for r in records if r.session_id == sid]
        ran = [r for r in mine if not r.cached]
        view = await demo.cluster.backends.records.load(sid)
        rows.append(
            [
                sid,
                len(mine),
                sum(1 for r in mine if r.kind is SubmitKind.FORWARDED),
                sum(1 for r in mine if r.cached),
                demo.ledger.executions[sid],
                sum(1 for r in ran if r.outcome == "ok"),
                sum(1 for r in ran if r.outcome != "ok"),
                demo.ledger.max_parallel[sid],
                demo.ledger.opened[sid],
                len(view.entries) if view is not None else 0,
                ",".join(sorted({r.executed_by for r in ran if r.executed_by})),
            ]
        )
    demo.console.table(
        [
            "session",
            "submits",
            "forwarded",
            "cached",
            "turns run",
            "ok",
            "failed",
            "parallel",
            "handles",
            "entries",
            "ran on",
        ],
        rows,
    )
    sys.stdout.write(
        "  (turns run = agent executions; parallel = most turns of the session running at once;\n"
        "   handles = live sessions opened; entries = committed transcript entries)\n\n"
    )
    node_rows: list[list[object]] = []
    for router in demo.cluster.nodes:
        node_id = router.node_id
        node_rows.append(
            [
                node_id,
                "killed" if demo.cluster.is_killed(router) else "alive",
                sum(1 for r in records if r.via == node_id),
                sum(
                    1
                    for r in records
                    if r.via == node_id and r.kind is SubmitKind.EXECUTED_LOCALLY and not r.cached
                ),
                sum(1 for r in records if r.via == node_id and r.kind is SubmitKind.FORWARDED),
                sum(1 for r in records if r.via == node_id and r.cached),
                sum(1 for r in records if r.executed_by == node_id and not r.cached),
            ]
        )
    demo.console.table(
        [
            "node",
            "state",
            "received",
            "executed locally",
            "forwarded",
            "cache hits",
            "turns run here",
        ],
        node_rows,
    )
    if any(demo.ledger.max_parallel[sid] > 1 for sid in sessions):
        raise DemoError("some session ran two turns at once")
    demo.console.line("check", "no session ever ran two turns at the same time")


#: The demo's story, scene by scene; the summary always runs last. The holder-lost scene kills a
#: node, so it stays last here: later scenes would have one node fewer.
SCENES: list[tuple[str, Scene]] = [
    ("concurrent submits through different nodes", scene_concurrent_submits),
    ("streaming to a subscriber on another node", scene_remote_stream),
    ("interrupt from a node that does not hold the session", scene_interrupt),
    ("idempotent retry answered from the cache", scene_idempotent_retry),
    ("the holder is killed mid-turn", scene_holder_lost),
]


# ====================================================================== runner


async def run_demo(nodes: int = 3, token_delay: float = 0.02, redis_url: str | None = None) -> int:
    """Run every scene on a fresh LocalCluster (in memory, or over Redis when `redis_url` is
    given); 0 when all of them showed what they should."""
    console = Console()
    ledger = AgentLedger()

    def factory(session_id: str, agent_ref: str) -> ScriptedAgent:
        ledger.opened[session_id] += 1
        return ScriptedAgent(session_id, ledger, token_delay)

    if redis_url is None:
        cluster = LocalCluster(0, session_factory=factory, **DEMO_CONFIG)
        shared = "one shared in-memory backend"
    else:
        cluster = LocalCluster.over_redis(redis_url, 0, session_factory=factory, **DEMO_CONFIG)
        shared = f"Redis at {redis_url.rpartition('@')[2]} (each node with its own connections)"
    await cluster.start()
    try:
        for index in range(nodes):
            await cluster.add_node(f"node-{chr(ord('a') + index)}")
        console.line(
            "cluster",
            f"{nodes} nodes ({', '.join(n.node_id for n in cluster.nodes)}) over {shared}",
        )
        demo = Demo(cluster, ledger, console)
        scenes = [*SCENES, ("summary", scene_summary)]
        for number, (title, scene) in enumerate(scenes, start=1):
            console.header(f"Scene {number}/{len(scenes)}: {title}")
            await scene(demo)
    except DemoError as exc:
        console.line("FAILED", str(exc))
        return 1
    finally:
        await cluster.aclose()
    console.line("done", f"demo finished in {console.elapsed():.2f}s")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo under an overall time bound."""
    if args.ray is not None:
        return _cmd_demo_ray(args)

    async def bounded() -> int:
        try:
            return await asyncio.wait_for(
                run_demo(args.nodes, args.token_delay, args.redis), args.timeout
            )
        except TimeoutError:
            sys.stdout.write(f"\ndemo did not finish within {args.timeout:.0f}s\n")
            return 1

    return asyncio.run(bounded())


def _add_demo(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "demo",
        help="run the scripted multi-node demo on an in-process cluster",
        description="Show forwarding, cross-node streaming, interrupts, idempotent retries and "
        "a holder crashing mid-turn on a simulated cluster of nodes sharing in-memory backends.",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=3,
        choices=range(3, 10),
        metavar="N",
        help="number of nodes, 3-9 (default 3)",
    )
    parser.add_argument(
        "--token-delay",
        type=float,
        default=0.02,
        metavar="SECONDS",
        help="pause between streamed words (default 0.02)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="fail if the demo takes longer (default 30)",
    )
    parser.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="run the nodes over this Redis (redis:// or rediss://) instead of in memory",
    )
    parser.add_argument(
        "--ray",
        type=int,
        default=None,
        choices=range(2, 10),
        metavar="N",
        help="run on a local N-node Ray cluster (2-9) on 127.0.0.1, one router actor per node, "
        "over --redis or a private redis-server started for the demo (needs the ray and redis "
        "extras)",
    )
    parser.set_defaults(handler=_cmd_demo)


def _cmd_demo_ray(args: argparse.Namespace) -> int:
    """The demo on a local Ray cluster (stickless.ray._demo)."""
    import os

    # Before Ray is imported: keep it on 127.0.0.1 (else it advertises the machine's external
    # address) and do not report usage.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        from .ray._demo import run_ray_demo
    except ImportError as exc:
        sys.stdout.write(f"{exc}\n")
        return 1
    # Cluster start-up is bounded by Ray itself; --timeout bounds the scenes.
    return run_ray_demo(args.ray, args.token_delay, args.redis, args.timeout, Console())


def _cmd_ray_deploy(args: argparse.Namespace) -> int:
    """Connect to a running Ray cluster and deploy (or undeploy) the routers."""
    import json

    try:
        import ray

        from .ray import deploy, undeploy
    except ImportError as exc:
        sys.stdout.write(f"{exc}\n")
        return 1
    overrides: dict[str, Any] = json.loads(args.config) if args.config else {}
    if not isinstance(overrides, dict):
        sys.stdout.write("--config must be a JSON object of RouterConfig fields\n")
        return 2
    ray.init(address=args.address, namespace=args.namespace, logging_level="WARNING")
    try:
        if args.command == "ray-undeploy":
            undeploy(args.namespace, grace=args.grace)
            sys.stdout.write(f"UNDEPLOYED namespace {args.namespace}\n")
            return 0
        handles = deploy(
            args.redis,
            args.opener,
            args.namespace,
            fast_failover=not args.no_fast_failover,
            reconcile_interval=args.reconcile_interval,
            timeout=args.timeout,
            **overrides,
        )
        pings = ray.get([h.ping.remote() for h in handles.values()], timeout=args.timeout)
        for ping in pings:
            sys.stdout.write(f"router {ping['node_id']} on Ray node {ping['ray_node_id']}\n")
        sys.stdout.write(f"DEPLOYED {len(pings)} router(s) in namespace {args.namespace}\n")
        return 0
    finally:
        ray.shutdown()


def _add_ray_deploy(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "ray-deploy",
        help="deploy one router actor per node of a running Ray cluster (kept so by a reconciler)",
        description="Connect to a running Ray cluster and place one stickless router actor on "
        "every node (detached; a detached reconciler on the head node keeps one per node as "
        "nodes join and leave). Returns once every router answers; the routers outlive this "
        "command. Used by cluster.yaml's head start commands.",
    )
    parser.add_argument("--redis", required=True, metavar="URL", help="redis:// or rediss:// URL")
    parser.add_argument(
        "--opener",
        required=True,
        metavar="MODULE:ATTR",
        help="import path of a LiveSessionOpener (or a zero-argument factory of one), "
        "importable on every node",
    )
    parser.add_argument(
        "--namespace", default="stickless", help="Ray namespace and Redis key prefix"
    )
    parser.add_argument(
        "--address", default="auto", help="Ray cluster address (default: auto, the local one)"
    )
    parser.add_argument(
        "--config", default=None, metavar="JSON", help="RouterConfig overrides as a JSON object"
    )
    parser.add_argument(
        "--no-fast-failover",
        action="store_true",
        help="do not watch peer routers; rely on lease and reservation TTLs only",
    )
    parser.add_argument(
        "--reconcile-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often the reconciler checks every node has a router (default 2)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="fail if the routers do not all answer within this (default 120)",
    )
    parser.set_defaults(handler=_cmd_ray_deploy)
    undeploy = subcommands.add_parser(
        "ray-undeploy",
        help="stop the reconciler and close every router of a namespace gracefully",
        description="Connect to a running Ray cluster, stop the stickless reconciler and close "
        "every router of the namespace gracefully (their sessions are handed back).",
    )
    undeploy.add_argument(
        "--namespace", default="stickless", help="Ray namespace and Redis key prefix"
    )
    undeploy.add_argument(
        "--address", default="auto", help="Ray cluster address (default: auto, the local one)"
    )
    undeploy.add_argument(
        "--grace", type=float, default=5.0, help="graceful-shutdown grace in seconds"
    )
    undeploy.set_defaults(handler=_cmd_ray_deploy, config=None)


def _cmd_node(args: argparse.Namespace) -> int:
    """Run one router as this process, over Redis, until SIGTERM."""
    from .node._main import main_node

    return main_node(args)


def _add_node(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "node",
        help="run one node (a router over Redis) as this process, served on loopback",
        description="Run a SessionRouter over Redis in DISTRIBUTED mode and serve it on "
        "127.0.0.1 for clients (stickless.node.NodeClient). Prints 'READY <port>' when up; "
        "SIGTERM closes it gracefully.",
    )
    parser.add_argument("--redis", required=True, metavar="URL", help="redis:// or rediss:// URL")
    parser.add_argument("--node-id", required=True, help="this node's unique id")
    parser.add_argument(
        "--opener",
        required=True,
        metavar="MODULE:ATTR",
        help="import path of a LiveSessionOpener, or of a zero-argument factory of one",
    )
    parser.add_argument("--namespace", default="stickless", help="Redis key prefix")
    parser.add_argument("--port", type=int, default=0, help="loopback port (0 = any free port)")
    parser.add_argument(
        "--grace", type=float, default=5.0, help="graceful-shutdown grace in seconds"
    )
    parser.add_argument(
        "--config", default=None, metavar="JSON", help="RouterConfig overrides as a JSON object"
    )
    parser.set_defaults(handler=_cmd_node)


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks: JSON results file plus a table on stdout."""
    from .bench._runner import main_bench

    return main_bench(args)


def _add_bench(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .bench import SCENARIOS

    parser = subcommands.add_parser(
        "bench",
        help="run the benchmarks (each against its baseline, interleaved in one run)",
        description="Run the benchmark scenarios against a private redis-server on loopback "
        "and node processes started for the run; write a JSON result file and print a table. "
        f"Scenarios: {', '.join(SCENARIOS)}.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds per scenario (CI smoke runs); numbers are rough",
    )
    parser.add_argument(
        "--only",
        default=None,
        metavar="SCENARIO[,...]",
        help="run only these scenarios (comma separated)",
    )
    parser.add_argument(
        "--output",
        default="stickless-bench.json",
        metavar="PATH",
        help="where to write the JSON results (default ./stickless-bench.json)",
    )
    parser.add_argument(
        "--redis-server",
        default=None,
        metavar="PATH",
        help="redis-server executable to start privately (default: redis-server on PATH)",
    )
    parser.set_defaults(handler=_cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="stickless",
        description="stickless: serialize AI-agent session turns across a cluster.",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level on stderr (default WARNING)",
    )
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo(subcommands)
    _add_node(subcommands)
    _add_ray_deploy(subcommands)
    _add_bench(subcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the chosen command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return handler(args)
