"""The demo's scenes, written once against `DemoCluster` and told in its `Narration`.

1. several sessions submitted concurrently through different nodes (some forwarded);
2. a subscriber on one node streaming a turn that runs on another;
3. an interrupt sent from a node that does not hold the session;
4. an idempotent retry answered from the cache, and the key reused with another input;
5. the holder killed mid-turn: the caller and a subscriber hear HOLDER_LOST, the next turn runs
   on a survivor over the committed transcript;
6. a summary per session and per node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._errors import FailureCode, IdempotencyConflictError, TurnFailedError
from .._events import Event, Interrupted, TextDelta, TurnFailed, TurnStarted, is_terminal
from .cluster import DemoCluster, DemoError
from .console import Console
from .state import EXECUTED_LOCALLY, FORWARDED, Demo, SubmitRecord, watch_turn
from .summary import scene_summary

Scene = Callable[[Demo], Awaitable[None]]


def _story(demo: Demo) -> dict[str, Any]:
    return {"submit_options": {"story": demo.says.story}}


async def scene_submits(demo: Demo) -> None:
    """Several sessions, several messages each, submitted concurrently through every node."""
    says, console, ledger = demo.says, demo.console, demo.cluster.ledger
    console.line("note", says.submits_note)
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
    await asyncio.gather(*(demo.outcome(record) for record in submitted))
    for record in submitted:
        if record.outcome != "ok":
            raise DemoError(f"{record.session_id} {record.label} failed: {record.outcome}")
        if record.kind == FORWARDED and record.executed_by == record.via:
            raise DemoError(f"a forwarded turn ran on its submitting {says.noun} {record.via}")
        if record.kind == EXECUTED_LOCALLY and record.executed_by != record.via:
            raise DemoError(f"a local turn ran on {record.executed_by}, not {record.via}")
    forwarded = sum(1 for r in submitted if r.kind == FORWARDED)
    if forwarded == 0:
        raise DemoError("no submit was forwarded")
    for sid in sessions:
        ran_on = sorted({demo.label(r.executed_by) for r in submitted if r.session_id == sid})
        at_once = f"; at most {ledger.max_parallel[sid]} at a time" if ledger is not None else ""
        console.line("check", f"{sid:<11} 3 turns, all on {', '.join(ran_on)}{at_once}")
    console.line("check", f"{forwarded} of {len(submitted)} submits were forwarded")


async def scene_stream(demo: Demo) -> None:
    """A subscriber on one node receives the text streamed by a turn on another node."""
    says, console = demo.says, demo.console
    sid = "chat-stream"
    runner, watcher, *_ = demo.nodes
    subscription = await demo.cluster.subscribe(watcher, sid)
    if says.subscribed:
        console.line("subscribe", says.subscribed.format(sid=sid, node=demo.label(watcher)))
    record = await demo.submit(runner, sid, "tell me something", "msg 1")
    if says.streams_it:
        console.line("subscribe", says.streams_it.format(sid=sid, node=demo.label(watcher)))
    deltas, ran_on, terminal = 0, "", ""
    async for event in subscription.frames(record.turn_id):
        if isinstance(event, TurnStarted):
            ran_on = event.executed_by
            console.begin("stream", f"{demo.label(watcher)} <- turn on {demo.label(ran_on)}: ")
        elif isinstance(event, TextDelta):
            deltas += 1
            console.more(event.text)
        if is_terminal(event):
            terminal = event.type
    console.end(f"[{terminal}]")
    await demo.outcome(record)
    if not ran_on or ran_on == watcher:
        raise DemoError(f"the subscriber was not on a different {says.noun} from the turn")
    if deltas == 0:
        raise DemoError("the remote subscriber received no text")
    relayed = says.relayed.format(
        node=demo.label(watcher), deltas=deltas, ran_on=demo.label(ran_on)
    )
    console.line("check", relayed)


async def scene_interrupt(demo: Demo) -> None:
    """Interrupt a long turn from a node that does not hold the session."""
    says, console, cluster = demo.says, demo.console, demo.cluster
    sid = "chat-long"
    nodes = demo.nodes
    runner, watcher, interrupter = nodes[0], nodes[1], nodes[2 if len(nodes) > 2 else 1]
    subscription = await cluster.subscribe(watcher, sid)
    record = await demo.submit(runner, sid, "tell me a long story", "story", **_story(demo))
    frames: list[Event] = []
    words: list[str] = []
    watching, enough = watch_turn(subscription, record.turn_id, frames, words)
    await asyncio.wait_for(enough.wait(), 10 * cluster.patience)
    holder = next((f.executed_by for f in frames if isinstance(f, TurnStarted)), "")
    console.line(
        "stream", f"{demo.label(watcher)} has seen {len(words)} words: {' '.join(words)!r} ..."
    )
    console.line(
        "interrupt",
        f"{sid:<11} interrupt(reason='USER') sent from {demo.label(interrupter)} "
        f"(holder is {demo.label(holder)})",
    )
    sent_at = time.monotonic()
    await cluster.interrupt(interrupter, sid, "USER")
    try:
        await record.ticket.result()
    except TurnFailedError as exc:
        record.outcome, record.executed_by = exc.code.value, holder
        console.line(
            "failed",
            f"{sid:<11} {says.caller.format(node=demo.label(record.via))} got TurnFailedError("
            f"code={exc.code.value}) {time.monotonic() - sent_at:.2f}s after the interrupt",
        )
        if exc.code is not FailureCode.INTERRUPTED:
            raise DemoError(f"expected INTERRUPTED, got {exc.code.value}") from exc
    else:
        raise DemoError("the interrupted turn succeeded")
    await asyncio.wait_for(watching, 5 * cluster.patience)
    last = frames[-1] if frames else None
    if not isinstance(last, Interrupted):
        raise DemoError(f"the subscriber's last frame was {last!r}, not Interrupted")
    console.line(
        "event",
        f"subscriber on {demo.label(watcher)} saw Interrupted(reason={last.reason!r}) after "
        f"{len(words)} of {len(says.story.split())} words",
    )
    if interrupter == holder:
        raise DemoError("the interrupt came from the holder itself")
    committed = await cluster.committed(sid)
    console.line("check", f"{sid:<11} the interrupted turn committed {committed} entries")


async def scene_retry(demo: Demo) -> None:
    """A retry with the same idempotency key through another node is answered from the cache,
    not run again; the same key with another input is rejected."""
    says, console, cluster, ledger = demo.says, demo.console, demo.cluster, demo.cluster.ledger
    sid = says.retry_session
    key = "order-42"
    holder = next((r.executed_by for r in demo.records if r.session_id == sid), None)
    first, retry, *_ = demo.others(holder) + demo.nodes

    async def runs() -> int:  # agent executions when the agents are here, else entries
        return ledger.executions[sid] if ledger is not None else await cluster.committed(sid)

    record = await demo.submit(first, sid, "book a table for two", "order", idempotency_key=key)
    await demo.outcome(record)
    if record.outcome != "ok":
        raise DemoError(f"the original turn failed: {record.outcome}")
    before = await runs()
    if ledger is not None:
        console.line(
            "note", f"{sid:<11} agent executions so far: {before}; retrying on {demo.label(retry)}"
        )
    again = await demo.submit(retry, sid, "book a table for two", "retry", idempotency_key=key)
    again.cached = True
    await demo.outcome(again)
    after = await runs()
    same_turn = again.turn_id == record.turn_id
    seen = [f"same turn id: {'yes' if same_turn else 'NO'}"]
    if again.ticket.ready is not None:
        seen.append(f"result ready at submit: {'yes' if again.ticket.ready else 'no'}")
    if ledger is not None:
        seen.append(f"agent executions {before} -> {after}")
    else:
        seen.append(f"committed entries {before} -> {after} (the agent did not run again)")
    console.line("cache", f"{sid:<11} {'; '.join(seen)}")
    console.line("note", f"a cache answer reports {again.kind}: no turn was placed anywhere")
    if not same_turn or after != before or again.outcome != "ok":
        raise DemoError("the retry was not answered from the cache")
    if ledger is not None:
        console.line("check", "cache hit: the retry got the original result, no second run")
    try:
        await demo.submit(retry, sid, "book a table for ten", "misuse", idempotency_key=key)
    except IdempotencyConflictError:
        console.line(
            "rejected",
            f"{sid:<11} same key, different input -> IdempotencyConflictError (HTTP 409)",
        )
    else:
        raise DemoError("reusing the key with another input was accepted")


async def scene_kill(demo: Demo) -> None:
    """The holder crashes mid-turn; the forwarded caller and a remote subscriber are told
    HOLDER_LOST, and the next turn runs on a survivor over the committed transcript."""
    says, console, cluster = demo.says, demo.console, demo.cluster
    sid = "chat-crash"
    record = await demo.submit(demo.nodes[says.crash_index], sid, "remember this", "warm-up")
    await demo.outcome(record)
    if record.outcome != "ok" or record.executed_by is None:
        raise DemoError(f"the warm-up turn failed: {record.outcome}")
    holder = record.executed_by
    others = demo.others(holder)
    caller, watcher = others[0], others[1] if len(others) > 1 else others[0]
    if says.holder_status:
        status = await cluster.status(caller, sid)
        console.line(
            "holder",
            f"{sid:<11} held by {demo.label(holder)} (status seen from {demo.label(caller)}: "
            f"holder={status.holder}, lease token {status.token})",
        )
    subscription = await cluster.subscribe(watcher, sid)
    if says.subscribed:
        console.line("subscribe", says.subscribed.format(sid=sid, node=demo.label(watcher)))
    record = await demo.submit(caller, sid, "tell me a long story", "story", **_story(demo))
    if record.kind != FORWARDED:
        raise DemoError(f"the submit via {caller} was {record.kind}, not forwarded")
    record.executed_by = holder
    frames: list[Event] = []
    words: list[str] = []
    killed_at = 0.0

    def heard(event: Event) -> None:
        if isinstance(event, TurnFailed):
            console.line(
                "event",
                f"subscriber on {demo.label(watcher)} saw TurnFailed(code={event.code.value!r}) "
                f"{time.monotonic() - killed_at:.2f}s after the kill",
            )

    watching, enough = watch_turn(subscription, record.turn_id, frames, words, heard)
    try:
        await asyncio.wait_for(enough.wait(), 10 * cluster.patience)
        console.line(
            "stream", f"{demo.label(watcher)} has seen {len(words)} words: {' '.join(words)!r} ..."
        )
        console.line("kill", says.kill.format(holder=demo.label(holder), caller=demo.label(caller)))
        killed_at = time.monotonic()
        await cluster.kill(holder)
        demo.killed.append(holder)
        await _holder_lost(demo, record, killed_at)
        await asyncio.wait_for(watching, 10)
    except TimeoutError as exc:
        raise DemoError("the subscriber never saw the turn end") from exc
    finally:
        if not watching.done():
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    last = frames[-1] if frames else None
    if not isinstance(last, TurnFailed) or last.code is not FailureCode.HOLDER_LOST:
        raise DemoError(f"the subscriber's last frame was {last!r}, not TurnFailed(HOLDER_LOST)")
    committed = await cluster.committed(sid)
    console.line("check", f"{sid:<11} " + says.crash_committed.format(committed=committed))
    via = watcher if says.next_via_watcher else caller
    await _next_turn(demo, sid, via, holder, committed, killed_at)
    fresh = await cluster.replacement(holder)
    if fresh is not None:
        demo.failover["recreated"] = recreated = time.monotonic() - killed_at
        console.line("reconcile", says.reconciled.format(node=demo.label(fresh), after=recreated))


async def _holder_lost(demo: Demo, record: SubmitRecord, killed_at: float) -> None:
    """The caller of the turn on the killed holder must hear HOLDER_LOST."""
    try:
        await asyncio.wait_for(record.ticket.result(), 20)
    except TurnFailedError as exc:
        record.outcome = exc.code.value
        demo.failover["holder_lost"] = lost = time.monotonic() - killed_at
        caller = demo.says.caller.format(node=demo.label(record.via))
        demo.console.line(
            "failed",
            f"{record.session_id:<11} {caller} got TurnFailedError(code={exc.code.value}) "
            f"{lost:.2f}s after the kill",
        )
        if exc.code is not FailureCode.HOLDER_LOST:
            raise DemoError(f"expected HOLDER_LOST, got {exc.code.value}") from exc
    except TimeoutError as exc:
        raise DemoError("the caller got no answer after the holder was killed") from exc
    else:
        raise DemoError("the turn on the killed holder succeeded")


async def _next_turn(
    demo: Demo, sid: str, via: str, holder: str, committed: int, killed_at: float
) -> None:
    """After the crash, the session's next turn runs on a survivor over what was committed."""
    survivors = set(demo.nodes)
    record = await demo.submit(
        via, sid, "are you still there?", "next", submit_options={"recall": True}
    )
    placed = time.monotonic() - killed_at
    result = await demo.outcome(record)
    if result is None:
        raise DemoError(f"the turn after the crash failed: {record.outcome}")
    served = time.monotonic() - killed_at
    demo.failover.update(next_placed=placed, next_served=served)
    if result.executed_by not in survivors or result.executed_by == holder:
        raise DemoError(f"the turn after the crash ran on {result.executed_by}, not a survivor")
    history = result.data.get("history")
    if history != committed:
        raise DemoError(f"the new holder saw {history} entries, not the {committed} committed")
    survivor = demo.says.survivor.format(
        survivor=demo.label(result.executed_by),
        history=history,
        now=await demo.cluster.committed(sid),
        committed=committed,
        placed=placed,
        served=served,
    )
    demo.console.line("check", f"{sid:<11} {survivor}")


#: The demo's story, scene by scene (titles in the cluster's `Narration`). The kill scene
#: stays last before the summary: later scenes would have one node fewer.
SCENES: list[Scene] = [
    scene_submits,
    scene_stream,
    scene_interrupt,
    scene_retry,
    scene_kill,
    scene_summary,
]


async def play(cluster: DemoCluster, console: Console) -> None:
    """Run every scene on the cluster under its banner.

    Raises:
        DemoError: a scene saw something other than what stickless promises.
    """
    demo = Demo(cluster, console)
    titles = cluster.narration.titles
    for number, (title, scene) in enumerate(zip(titles, SCENES, strict=True), start=1):
        console.header(f"Scene {number}/{len(SCENES)}: {title}")
        await scene(demo)
