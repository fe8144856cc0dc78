"""The storms' checker's state and verdicts: what every invariant family
(tests/storm/answers.py, keys.py, loss.py, checker.py) records its findings with, the known-bug
triage and the violation reports."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from stickless import BackendUnavailableError, FailureCode, SessionBusyError

from . import known_bugs, overlaps
from .records import Call, Control, Execution, History
from .rules import Rules


class CheckerBase:
    """A history, its rules, and the violations, known-bug hits and counts found in it."""

    def __init__(self, history: History, rules: Rules) -> None:
        self.history = history
        self.rules = rules
        self.violations: dict[str, list[str]] = defaultdict(list)
        #: Symptoms of the known bugs (listed, not failed, while their switch stands).
        self.known_bug: list[str] = []
        #: Keys that committed again after the holder of their commit was lost (allowed).
        self.reruns: list[str] = []
        #: Overlapping turns of a holder kept from the store past its lease (allowed).
        self.allowed_overlaps: list[str] = []
        self.counts: dict[str, Any] = {}
        self.slowest_holder_lost = 0.0
        #: turn id -> what it committed; (session, tag) -> committed turns in transcript order.
        self.committed: dict[str, list[str]] = {}
        self.commits: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.killed = {kill.node for kill in history.kills}
        self.executed: dict[str, Execution] = {}
        #: The nodes each turn ran on (one per attempt where attempts run again).
        self.attempt_nodes: dict[str, set[str | None]] = defaultdict(set)
        for execution in history.executions:
            self.executed.setdefault(execution.turn_id, execution)
            self.attempt_nodes[execution.turn_id].add(execution.node)
        self.returned = {e.turn_id for e in history.executions if e.how == "ok"}
        self.injected = {(i.session_id, i.tag) for i in history.injections}
        first_caller: dict[str, int] = {}
        for call in history.calls:
            if call.turn_id is not None:
                first_caller.setdefault(call.turn_id, call.index)
        #: Calls that attached to a turn another caller started (or read it from the store).
        self.attached = {
            call.index
            for call in history.calls
            if call.turn_id is not None and first_caller[call.turn_id] < call.index
        }
        #: (session, tag) of submits refused with BackendUnavailableError.
        self.refused_tags = {
            (c.session_id, c.tag)
            for c in history.calls
            if isinstance(c.refused, BackendUnavailableError)
        }

    # ------------------------------------------------------------ verdicts

    def fail(self, invariant: str, message: str) -> None:
        self.violations[invariant].append(message)

    def known(self, flag: str, invariant: str, message: str) -> None:
        """A symptom of a known bug: listed while its switch stands, else a violation."""
        if getattr(known_bugs, flag):
            self.known_bug.append(f"{flag}: {message}")
        else:
            self.fail(invariant, f"{message} ({flag})")

    def killed_node_answered(self, call: Call, what: str) -> None:
        """A caller on a node being killed got something other than RouterClosedError."""
        message = f"call #{call.index} on {call.node_id}: {what}"
        self.known("KILLED_NODE_ANSWERS_BUG", "2 answer", message)

    def wrongly_evicted(self, call: Call) -> bool:
        """An attached caller told EVICTED (ATTACHED_EVICT_BUG); whoever asks has established
        that the turn was not in fact evicted."""
        return (
            known_bugs.ATTACHED_EVICT_BUG
            and call.code is FailureCode.EVICTED
            and call.index in self.attached
        )

    def contradicted(self, message: str, told: list[Call]) -> None:
        """Callers told a failure that the turn's commit (or the store) contradicts."""
        codes = {c.code for c in told}
        if told and all(self.wrongly_evicted(c) for c in told):
            self.known_bug.append(f"ATTACHED_EVICT_BUG: {message}")
        elif codes == {FailureCode.EVICTED}:
            self.known("LATE_DELIVERY_EVICT_BUG", "3 idempotency", message)
        else:
            self.fail("3 idempotency", message)

    def in_restart(self, sent: float, done: float) -> bool:
        return any(sent <= end and done >= start for start, end in self.history.restarts)

    def vanished(self, call: Call, invariant: str, what: str) -> None:
        """A turn answered late or never: name the known bug it shows, or fail."""
        message = f"{call.who()}: {what}; {self.story(call)}"
        if call.turn_id in self.executed:
            self.fail(invariant, message)
        elif (call.session_id, call.tag) in self.refused_tags and call.key is not None:
            self.known("GHOST_RESERVATION_BUG", invariant, message)
        elif self.history.collect_failures[call.session_id]:
            self.known("LOST_COLLECT_BUG", invariant, message)
        else:
            self.known("VANISHED_FORWARD_BUG", invariant, message)

    def excused(self, error: BaseException, what: Call | Control) -> bool:
        """A submit or a control that raised for a reason the run explains."""
        if what.node_id in self.killed and isinstance(error, self.rules.killed_may_raise):
            return True
        if isinstance(error, BackendUnavailableError) and self.in_restart(what.sent, what.done):
            return True
        if isinstance(error, SessionBusyError) and isinstance(what, Control):
            return (
                overlaps.busy_release_explained(self.history, what, self.rules.lease_ttl)
                is not None
            )
        return self.rules.excused(error, what)

    # ------------------------------------------------------------ reports

    def story(self, call: Call) -> str:
        """What every call of the same session and key (or turn) got, for a violation report."""
        calls = self.history.calls
        start = calls[0].sent if calls else 0.0
        lines = [f"restart {a - start:.3f}-{b - start:.3f}s" for a, b in self.history.restarts]
        for other in calls:
            same = other.key is not None and other.key == call.key
            if other.session_id != call.session_id or not (same or other is call):
                continue
            answer = other.refused or other.result or other.error or "hung"
            lines.append(
                f"#{other.index} via {other.node_id} sent {other.sent - start:.3f}s "
                f"done {other.done - start:.3f}s {other.kind or '-'} turn {other.turn_id}: "
                f"{answer!r}"
            )
        for control in self.history.controls:
            if control.session_id == call.session_id:
                lines.append(
                    f"{control.what} via {control.node_id} sent {control.sent - start:.3f}s "
                    f"done {control.done - start:.3f}s: {control.error!r}"
                )
        for execution in self.history.executions:
            if execution.session_id == call.session_id:
                lines.append(f"ran {execution}")
        return "\n        ".join(lines)

    def story_of(self, session_id: str, tag: str) -> str:
        """The story of the first call of a (session, tag), for a violation report."""
        calls = [c for c in self.history.calls if (c.session_id, c.tag) == (session_id, tag)]
        return self.story(calls[0]) if calls else f"no call of {session_id}/{tag}"

    def report(self) -> str:
        lines = []
        for invariant, messages in sorted(self.violations.items()):
            lines.append(f"invariant {invariant}: {len(messages)} violation(s)")
            lines.extend(f"    {m}" for m in messages[:10])
        return "\n".join(lines)
