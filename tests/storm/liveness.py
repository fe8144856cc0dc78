"""The storms' liveness invariant: no session stays unserved longer than a bound while a
healthy node exists (README, "Guarantees under faults": a crashed, stopped or stalled holder's
sessions are served elsewhere once its liveness runs out and a sweep notices).

A session is *unserved* while a caller waits on it through a healthy node (accepted, not
answered yet), no turn of it runs, and nothing happens to it: no turn of it starts or ends and
no such caller of it is answered. A caller counts only while its own node is healthy (not
killed, not under an `Outage`): one whose node is cut off waits on that node, not on the
cluster, and its answer says nothing about the session. Nor does a cached answer (a key that
already held its outcome: nothing waited). A span that overlaps a store restart is no violation
(no node is healthy then). A turn a crash cut short counts as running until the crash.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from dataclasses import dataclass

from .records import Call, History

#: How a submit answered from the key's stored outcome is placed (`SubmitKind.CACHED`).
CACHED = "CACHED"


@dataclass(frozen=True)
class Unserved:
    """A span during which a session waited with nothing happening to it."""

    session_id: str
    #: On the executions' clock (microseconds).
    start: float
    end: float
    #: The calls waiting throughout.
    waiting: tuple[int, ...]

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e6

    def __str__(self) -> str:
        calls = ", ".join(f"#{index}" for index in self.waiting)
        return f"{self.session_id} unserved for {self.seconds:.2f}s (waiting: {calls})"


def _sent_at(call: Call) -> float:
    """When the call was submitted, on the executions' clock."""
    return call.answered_at - (call.done - call.sent) * 1e6


def _healthy_waits(history: History) -> dict[str, list[tuple[float, float, int]]]:
    """Per session, (from, until, call index) of every accepted caller while its node was
    healthy (until its answer, its node's crash, or the start of an outage of its node)."""
    crashes = {kill.node: kill.stamp for kill in history.kills}
    waits: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for call in history.calls:
        if call.turn_id is None or not call.answered_at or call.kind == CACHED:
            continue
        start, end = _sent_at(call), call.answered_at
        end = min(end, crashes.get(call.node_id, end))
        for outage in history.outages:
            if outage.node != call.node_id or outage.end <= start:
                continue
            # (a node cut off when the call was sent: it never waited on a healthy node)
            end = start if outage.start <= start else min(end, outage.start)
        if end > start:
            waits[call.session_id].append((start, end, call.index))
    return waits


def unserved_spans(history: History) -> list[Unserved]:
    """Every maximal span during which a session was unserved (see the module docstring)."""
    crashes = {kill.node: kill.stamp for kill in history.kills}
    runs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    progress: dict[str, set[float]] = defaultdict(set)
    for run in history.executions:
        end = run.end if run.end is not None else crashes.get(run.node or "", float("inf"))
        runs[run.session_id].append((run.start, end))
        progress[run.session_id].update((run.start, end))
    healthy = _healthy_waits(history)
    answered = {call.index: call.answered_at for call in history.calls}
    for session_id, waits in healthy.items():
        progress[session_id].update(end for _, end, index in waits if end == answered[index])
    found: list[Unserved] = []
    for session_id, waits in healthy.items():
        instants = sorted(
            progress[session_id] | {t for start, end, _ in waits for t in (start, end)}
        )
        open_span: Unserved | None = None
        for start, end in itertools.pairwise(instants):
            waiting = tuple(i for s, e, i in waits if s <= start and e >= end)
            running = any(s <= start and e >= end for s, e in runs[session_id])
            if waiting and not running:
                if open_span is not None and start not in progress[session_id]:
                    open_span = Unserved(session_id, open_span.start, end, open_span.waiting)
                else:
                    if open_span is not None:
                        found.append(open_span)
                    open_span = Unserved(session_id, start, end, waiting)
            elif open_span is not None:
                found.append(open_span)
                open_span = None
        if open_span is not None:
            found.append(open_span)
    return found


def liveness(history: History, within: float) -> list[str]:
    """Violations: sessions unserved for longer than `within` seconds outside store restarts."""
    offset = (time.time() - time.monotonic()) * 1e6
    restarts = [(start * 1e6 + offset, end * 1e6 + offset) for start, end in history.restarts]
    return [
        f"{span} (bound {within:.2f}s)"
        for span in unserved_spans(history)
        if span.seconds > within
        and not any(span.start < end and span.end > start for start, end in restarts)
    ]
