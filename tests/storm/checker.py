"""The one checker of the storms' invariants, over a run's `History` and the stores it left.

1. Serialization and fencing: a session's turns never run at the same time (but for the
   overlap the README allows, see `overlaps`), a turn runs at most once, committed transcripts
   never interleave, carry non-decreasing fencing tokens and hold only what a turn that
   returned normally staged.
2. One answer per submit: every submit is refused for a reason the run explains or answered
   exactly once (a result for its own turn, a failure the run allows, RouterClosedError only from
   a killed node), within its bound; a killed node answers its own callers only with
   RouterClosedError.
3. At most once per key: every caller of a turn hears the same story, a turn said to have
   committed nothing did not, a key succeeds once and never runs again after a caller saw it
   succeed, and it commits again only after the commit's holder was lost.
4. Nothing silently lost: inboxes drain and every reservation settles, agreeing with what the
   callers were told.
5. Liveness (where the rules give a bound): no session stays unserved longer than it while a
   healthy node exists (see `liveness`).
6. Stream completeness (for a run that kept streams open, see `streams`): every frame logged
   for a turn reached every stream open on its session, once, in order, or the stream reported
   a gap.

What an environment may legitimately answer (failure codes, refusals during a store restart,
bounds) comes with it as `rules.Rules`. Symptoms of the bugs in `known_bugs` are listed as known-bug
hits while their switch stands, else they fail the run like any other violation.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from typing import Any

from stickless import (
    BackendUnavailableError,
    FailureCode,
    IdempotencyConflictError,
    RouterClosedError,
    SessionBusyError,
    TurnFailedError,
    TurnResult,
)
from stickless.backends.base import Backends, ReservationState

from . import known_bugs, liveness, overlaps
from .records import Call, Control, Execution, History, parse
from .rules import CLIENT_KEY, LOST_HOLDER, NOTHING_COMMITTED, TURN_KEY, Rules
from .streams import stream_violations


class Checker:
    """Checks the invariants over a `History`; collects violations, counts what it saw."""

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
            self.fail(invariant, message)

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

    # ------------------------------------------------------------ the checks

    async def check(self, backends: Backends) -> None:
        await self.fenced_transcripts(backends)
        self.serialization()
        self.one_answer_per_submit()
        self.at_most_once_per_key()
        await self.nothing_lost(backends)
        if self.rules.serve_within is not None:
            for message in liveness.liveness(self.history, self.rules.serve_within):
                self.fail("5 liveness", message)
        await self.streams_complete(backends)

    async def streams_complete(self, backends: Backends) -> None:
        """Every frame logged for a turn reached every stream kept open on its session, once,
        in order, or the stream reported a gap (tests/storm/streams.py)."""
        for message in await stream_violations(self.history.streams, backends):
            self.known("STREAM_COMPLETENESS_BUG", "stream_completeness", message)
        self.counts["streams"] = len(self.history.streams)
        self.counts["streamed_frames"] = sum(len(r.frames) for r in self.history.streams)

    def serialization(self) -> None:
        """A session's turns never run at the same time but for the window the README allows
        (tests/storm/overlaps.py); a turn runs at most once. Needs `fenced_transcripts` first
        (an overlap is allowed only for an earlier turn that committed nothing)."""
        verdict = overlaps.serialization(
            self.history, self.committed, self.rules.lease_ttl, self.rules.attempts_rerun
        )
        for invariant, message in verdict.violations:
            self.fail(invariant, message)
        self.allowed_overlaps = verdict.allowed
        self.counts["executions"] = len(self.history.executions)
        self.counts["executions_cut_by_kill"] = sum(
            1 for e in self.history.executions if e.end is None and e.node in self.killed
        )
        self.counts["max_concurrency"] = verdict.max_concurrency
        self.counts["allowed_overlaps"] = len(verdict.allowed)

    async def fenced_transcripts(self, backends: Backends) -> None:
        """Committed transcripts: tokens never decrease, a turn's entries are contiguous, and
        only a turn that returned normally committed, and only what it (or a message taken
        into it) staged."""
        may_commit: dict[str, set[str]] = defaultdict(set)
        for execution in self.history.executions:
            may_commit[execution.turn_id].update(execution.staged)
        for injection in self.history.injections:
            may_commit[injection.host_turn_id].add(injection.text)
        entries = 0
        for session_id in self.history.sessions:
            record = await backends.records.load(session_id)
            if record is None:
                continue
            entries += len(record.entries)
            blocks: list[str] = []
            last_token = 0
            for entry in record.entries:
                turn_id = entry.turn_id
                if entry.token < last_token:
                    self.fail(
                        "1 fencing",
                        f"{session_id}: token {entry.token} after {last_token} ({turn_id})",
                    )
                last_token = max(last_token, entry.token)
                if not blocks or blocks[-1] != turn_id:
                    blocks.append(turn_id)
                self.committed.setdefault(turn_id, []).append(entry.content)
                if parse(entry.content.removeprefix("echo:"))[0] != session_id:
                    self.fail("1 fencing", f"{session_id} holds {entry.content!r}")
                elif turn_id in self.executed and entry.content not in may_commit[turn_id]:
                    self.fail(
                        "1 fencing", f"{session_id}: {entry.content!r} committed by {turn_id}"
                    )
            for turn_id, times in Counter(blocks).items():
                if times > 1:
                    self.fail("1 interleaving", f"{session_id}: turn {turn_id} split in {times}")
            for turn_id in dict.fromkeys(blocks):
                if turn_id not in self.returned:
                    self.fail(
                        "1 fencing", f"{session_id}: turn {turn_id} committed but never returned"
                    )
                else:
                    self.commits[(session_id, self.executed[turn_id].tag)].append(turn_id)
        self.counts["transcript_entries"] = entries
        self.counts["committed_turns"] = len(self.committed)

    def one_answer_per_submit(self) -> None:
        rules, calls = self.rules, self.history.calls
        codes: Counter[str] = Counter()
        answered = 0
        for call in calls:
            who, killed = call.who(), call.node_id in self.killed
            if call.refused is not None:
                kind = type(call.refused).__name__
                conflict = call.conflict and isinstance(call.refused, IdempotencyConflictError)
                if conflict or self.excused(call.refused, call):
                    codes[f"refused:{kind}"] += 1
                else:
                    self.fail("2 answer", f"{who}: submit raised {call.refused!r}")
                continue
            if call.conflict:
                self.fail("3 idempotency", f"{who}: a different input on a DONE key was accepted")
            if call.hung:
                self.fail("2 answer", f"{who}: no answer within {rules.answer_within}s")
                continue
            answered += 1
            if call.pending_at_kill and not isinstance(call.error, RouterClosedError):
                answer = call.result.text if call.result else repr(call.error)
                self.killed_node_answered(call, f"answered {answer} instead of RouterClosedError")
            if call.result is not None:
                codes["ok"] += 1
                self.check_result(call, call.result)
            elif isinstance(call.error, TurnFailedError):
                code, detail = call.error.code, call.error.detail
                codes[code.value] += 1
                if code is FailureCode.FAILED:
                    codes[f"FAILED:{detail.split(':')[0]}"] += 1
                odd_failure = (
                    code in (FailureCode.FAILED, FailureCode.BACKEND_UNAVAILABLE)
                    and not rules.failed_ok(detail)
                    and not call.pending_at_kill  # (that is KILLED_NODE_ANSWERS_BUG's case)
                )
                if code is FailureCode.FORWARD_TIMEOUT:
                    self.vanished(call, "2 answer", "FORWARD_TIMEOUT: its message vanished")
                elif code not in rules.allowed_codes or odd_failure:
                    self.fail("2 answer", f"{who}: failed with {call.error!r}; {self.story(call)}")
                if call.error.turn_id and call.error.turn_id != call.turn_id:
                    self.fail("2 answer", f"{who}: failure names turn {call.error.turn_id}")
            elif isinstance(call.error, RouterClosedError):
                codes["RouterClosedError"] += 1
                if not killed:
                    self.fail("2 answer", f"{who}: RouterClosedError on a node never killed")
            else:
                self.fail("2 answer", f"{who}: unexpected answer {call.error!r}")
        for control in self.history.controls:
            error = control.error
            if error is not None and not self.excused(error, control):
                where = f"{control.what} of {control.session_id} via {control.node_id}"
                self.fail("2 answer", f"{where} raised {error!r}")
        if rules.only_crashes_lose_holders:
            self.holder_loss_follows_a_crash()
        self.counts["submits"] = len(calls)
        self.counts["results"] = answered
        self.counts["answers"] = dict(sorted(codes.items()))
        self.counts["repeats"] = sum(1 for c in calls if c.repeat)
        self.counts["retries"] = sum(c.retries for c in calls)
        self.counts["retried_ok"] = sum(1 for c in calls if c.retries and c.result is not None)
        # (diagnostic, not a bound: answers that came only from a forward deadline or a
        # holderless reservation's stale sweep take about forward_ttl)
        self.counts["slow_answers"] = sum(
            1 for c in calls if c.refused is None and c.done - c.sent >= rules.slow_after
        )

    def check_result(self, call: Call, result: TurnResult) -> None:
        who = call.who()
        if (result.turn_id, result.session_id) != (call.turn_id, call.session_id):
            self.fail("2 answer", f"{who}: answered for another turn: {result!r}")
        expected = self.rules.answer_text(call)
        # (a message taken into a running turn is answered with that turn's result)
        injected = (call.session_id, call.tag) in self.injected
        if expected is not None and not injected and result.text != expected:
            self.fail("2 answer", f"{who}: got {result.text!r}")
        execution = self.executed.get(result.turn_id)
        executor = self.rules.executor(result)
        ran_on = execution.node if execution is not None else None
        if self.rules.attempts_rerun:  # the answer names the node of one of the attempts
            ran_on = executor if executor in self.attempt_nodes[result.turn_id] else ran_on
        if None not in (ran_on, executor) and executor != ran_on:
            self.fail("2 answer", f"{who}: executed_by {executor}, ran on {ran_on}")

    def holder_loss_follows_a_crash(self) -> None:
        """HOLDER_LOST reaches a caller only after a crash (the delay is measured, not bounded)."""
        lost_after: list[float] = []
        for call in self.history.calls:
            if call.code is not FailureCode.HOLDER_LOST:
                continue
            before = [k.at for k in self.history.kills if k.at <= call.done]
            if not before:
                self.fail("2 answer", f"{call.who()}: HOLDER_LOST before any crash")
                continue
            lost_after.append(call.done - max(before))
        self.slowest_holder_lost = max(lost_after, default=0.0)

    def at_most_once_per_key(self) -> None:
        calls, history = self.history.calls, self.history
        # Every caller of one turn hears the same story.
        by_turn: dict[str, list[Call]] = defaultdict(list)
        for call in calls:
            if call.turn_id is not None and (call.ok or call.code is not None):
                by_turn[call.turn_id].append(call)
        for turn_id, group in by_turn.items():
            texts = {c.result.text for c in group if c.ok and c.result is not None}
            failures = {c.code for c in group if c.code is not None}
            if len(texts) > 1 or (texts and failures):
                story = [(c.index, c.node_id, c.result.text if c.ok else c.code) for c in group]
                message = f"turn {turn_id} answered inconsistently: {story}"
                told = [c for c in group if c.code is not None]
                if len(texts) > 1:
                    self.fail("3 idempotency", message)
                elif failures == {FailureCode.HOLDER_LOST}:
                    self.known("STALE_SUCCESS_BUG", "3 idempotency", message)
                else:
                    self.contradicted(message, told)
        # A turn its callers were told committed nothing did not commit; a success committed.
        for call in calls:
            if call.code in NOTHING_COMMITTED and call.turn_id in self.committed:
                message = f"{call.who()}: told {call.code} but it committed; {self.story(call)}"
                self.contradicted(message, [call])
            if call.ok and call.result is not None and call.result.turn_id not in self.committed:
                if call.result.turn_id in self.executed:
                    self.fail("3 idempotency", f"{call.who()}: succeeded but never committed")
                elif (call.session_id, call.tag) not in self.injected:
                    self.fail("3 idempotency", f"{call.who()}: succeeded but never ran")
        self.runs_per_key()
        self.commits_per_key()
        # Conflicting inputs never reach the agent.
        conflicts = {c.text for c in calls if c.conflict}
        ran = [e.text for e in history.executions] + [i.text for i in history.injections]
        for text in ran:
            if text in conflicts:
                self.fail("3 idempotency", f"conflicting input ran: {text!r}")
        keyed = [c for c in calls if c.key and not c.conflict]
        self.counts["keys"] = len({(c.session_id, c.key) for c in keyed})
        self.counts["key_reuses"] = len(keyed) - self.counts["keys"]
        self.counts["conflicts"] = sum(1 for c in calls if c.conflict)
        self.counts["injections"] = len(history.injections)

    def runs_per_key(self) -> None:
        """Per (session, tag): successes agree, one execution succeeded, and nothing ran
        again after a caller saw it succeed."""
        history = self.history
        successes: dict[tuple[str, str], list[Call]] = defaultdict(list)
        for call in history.calls:
            if call.ok:
                successes[(call.session_id, call.tag)].append(call)
        ok_turns = {c.turn_id for group in successes.values() for c in group}
        runs: dict[tuple[str, str], list[Execution]] = defaultdict(list)
        for execution in history.executions:
            runs[(execution.session_id, execution.tag)].append(execution)
        joins: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for injection in history.injections:
            joins[(injection.session_id, injection.tag)].append(injection)
        for ref, group in successes.items():
            where = "/".join(ref)
            answers = {(c.result.turn_id, c.result.text) for c in group if c.result is not None}
            if len(answers) > 1:
                self.fail("3 idempotency", f"{where}: several successes {answers}")
            first_success = min(c.answered_at for c in group)
            late = [e.turn_id for e in runs[ref] if e.start > first_success]
            late += [f"injected into {i.host_turn_id}" for i in joins[ref] if i.at > first_success]
            if late:
                message = f"{where} ran again after a caller saw it succeed: {late}"
                self.fail("3 idempotency", f"{message}; {self.story(group[0])}")
            ok_runs = [e.turn_id for e in runs[ref] if e.how == "ok" and e.turn_id in ok_turns]
            # Attempts of one turn answer as one: the store takes only one attempt's answer.
            good = len(set(ok_runs)) if self.rules.attempts_rerun else len(ok_runs)
            good += sum(1 for i in joins[ref] if i.host_turn_id in ok_turns)
            if good > 1:
                self.fail("3 idempotency", f"{where} completed successfully {good} times")
        if self.rules.only_crashes_lose_holders:
            for ref, executions in runs.items():
                survived = [e for e in executions if e.how == "ok" and e.node not in self.killed]
                if len(survived) > 1:
                    self.fail("3 idempotency", f"{'/'.join(ref)} succeeded {len(survived)} times")
        self.counts["keys_executed_more_than_once"] = sum(1 for r in runs.values() if len(r) > 1)

    def commits_per_key(self) -> None:
        """Per (session, tag): one commit, but for earlier ones whose holder was lost (every
        caller of it was told HOLDER_LOST or that its own node died; where only crashes take a
        lease away, it also ran on a node that crashed), and ones that ran although their
        submit was refused."""
        calls = self.history.calls
        ticketed = {turn for c in calls for turn in (c.turn_id, *c.attempts) if turn}
        tag_of = {e.turn_id: (e.session_id, e.tag) for e in self.history.executions}
        #: (session, tag) of calls whose node died under them: resubmitted, or told (by the
        #: RouterClosedError of a killed node) that the turn may still run elsewhere.
        retried = {(c.session_id, c.tag) for c in calls if c.retries}
        retried |= {
            (c.session_id, c.tag)
            for c in calls
            if c.node_id in self.killed
            and isinstance(c.refused or c.error, self.rules.killed_may_raise)
        }
        orphans: set[str] = set()  # ran, but no submit of theirs was accepted
        abandoned: set[str] = set()  # ...because the submitter's node died before answering
        for turn_id in sorted(t for t in tag_of if t not in ticketed):
            session_id, tag = tag_of[turn_id]
            if (session_id, tag) in retried:
                abandoned.add(turn_id)
                continue
            orphans.add(turn_id)
            message = f"{session_id}/{tag}: turn {turn_id} ran but its submit was refused"
            if (session_id, tag) in self.refused_tags:
                self.known("REFUSED_BUT_QUEUED_BUG", "3 idempotency", message)
            else:
                tagged = [c for c in calls if (c.session_id, c.tag) == (session_id, tag)]
                story = self.story(tagged[0]) if tagged else "no call of that tag"
                self.fail("3 idempotency", f"{message}?? no submit of it was refused; {story}")
        answers: dict[str, set[str]] = defaultdict(set)
        for call in calls:
            if call.turn_id is not None:
                answers[call.turn_id].add(
                    "ok"
                    if call.result is not None
                    else (call.code.value if call.code else type(call.error).__name__)
                )
            for turn_id in call.attempts:
                if turn_id != call.turn_id:
                    # (its caller's node died under it: what a killed node's callers are told)
                    answers[turn_id].add("RouterClosedError")

        def lost(turn_id: str) -> bool:
            told = answers[turn_id]
            holder_lost = turn_id in abandoned or bool(told and told <= LOST_HOLDER)
            crashed = self.executed[turn_id].node in self.killed
            return holder_lost and (crashed or not self.rules.only_crashes_lose_holders)

        recommitted = 0
        for (session_id, tag), turns in self.commits.items():
            if len(turns) < 2:
                continue
            example = next((c for c in calls if (c.session_id, c.tag) == (session_id, tag)), None)
            message = (
                f"{session_id}/{tag} committed {len(turns)} times: "
                f"{ {t: sorted(answers[t]) for t in turns} }"
                + (f"; {self.story(example)}" if example is not None else "")
            )
            plain = [t for t in turns if t not in orphans and not lost(t)]
            after = turns[turns.index(plain[0]) + 1 :] if plain else []
            if len(plain) > 1:
                self.fail("3 idempotency", message)
            elif set(after) - orphans:
                self.fail("3 idempotency", f"{message} (again after a commit not lost)")
            elif orphans & set(turns):
                self.known("REFUSED_BUT_QUEUED_BUG", "3 idempotency", message)
            else:
                self.reruns.append(message)
                recommitted += len(turns) - 1
        self.counts["reruns_after_holder_loss"] = len(self.reruns)
        self.counts["recommitted_after_holder_loss"] = recommitted
        self.counts["abandoned_runs"] = len(abandoned)

    async def nothing_lost(self, backends: Backends) -> None:
        rules, calls, sessions = self.rules, self.history.calls, self.history.sessions
        # Orphan scans and re-rung doorbells may still be draining: poll, bounded.
        deadline = time.monotonic() + rules.drain_within
        while True:
            left = [s for s in sessions if not await backends.inbox.is_empty(s)]
            if not left or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for session_id in left:
            # (after quiescing, reading what was left behind is the last thing anyone does)
            purged = await backends.inbox.purge(session_id)
            for entry in purged.unreadable:
                self.fail("4 loss", f"inbox of {session_id} holds an unreadable entry {entry}")
            for message in purged.messages:
                env = message.envelope
                text = env.input.as_text()
                what = f"inbox of {session_id} still holds {text!r} ({env.turn_id})"
                found = await backends.idempotency.find(session_id, env.key)
                if found is None or found.turn_id != env.turn_id or found.outcome is not None:
                    # Answered (or superseded): a later holder would answer it without running
                    # it; left over only because its acknowledgement was lost.
                    self.counts["unacknowledged"] = self.counts.get("unacknowledged", 0) + 1
                elif (session_id, parse(text)[1]) in self.refused_tags:
                    self.known("REFUSED_BUT_QUEUED_BUG", "4 loss", what)
                else:
                    self.fail("4 loss", what)
            if not purged.messages and not purged.unreadable:
                self.fail("4 loss", f"inbox of {session_id} did not drain in time")
        # Every reservation settles (DONE or FAILED) and agrees with what callers were told.
        reservations: dict[tuple[str, str], Call] = {}
        by_turn: dict[str, list[Call]] = defaultdict(list)
        for call in calls:
            if call.turn_id is not None:
                key = CLIENT_KEY + call.key if call.key else TURN_KEY + call.turn_id
                reservations[(call.session_id, key)] = call
                by_turn[call.turn_id].append(call)
        deadline = time.monotonic() + rules.settle_within
        pending = dict(reservations)
        while pending and time.monotonic() <= deadline:
            for ref in list(pending):
                found = await backends.idempotency.find(*ref)
                if found is None or found.state is not ReservationState.IN_FLIGHT:
                    del pending[ref]
            if pending:
                await asyncio.sleep(0.05)
        for (session_id, key), call in reservations.items():
            found = await backends.idempotency.find(session_id, key)
            if found is None:
                # (an internal per-turn key may outlive its primary TTL of 2 x forward_ttl; a
                # refused submit discards its reservation, and whoever attached to it meanwhile
                # is told to retry)
                if key.startswith(CLIENT_KEY) and (session_id, call.tag) not in self.refused_tags:
                    message = f"{session_id}/{key}: reservation missing; {self.story(call)}"
                    self.fail("4 loss", message)
                continue
            if found.state is ReservationState.IN_FLIGHT:
                stuck = next((c for c in by_turn[found.turn_id]), call)
                self.vanished(stuck, "4 loss", f"{session_id}/{key} stays IN_FLIGHT ({found})")
                continue
            if found.outcome is None:
                continue
            stored = f"{found.outcome.code or 'DONE'}: {found.outcome.message}"
            for told in by_turn[found.turn_id]:
                where = f"{session_id}/{key}: {told.who()}"
                if told.code is not None and found.outcome.ok:
                    self.contradicted(f"{where} was told {told.code}; store: {stored}", [told])
                if told.result is not None and not found.outcome.ok:
                    message = f"{where} got a TurnResult; store: {stored}"
                    if not told.ok:
                        self.killed_node_answered(told, f"a TurnResult the store lost ({stored})")
                    elif found.outcome.code == FailureCode.HOLDER_LOST.value:
                        self.known("STALE_SUCCESS_BUG", "3 idempotency", message)
                    else:
                        self.fail("3 idempotency", message)
        self.counts["sessions"] = len(sessions)
        self.counts["reservations"] = len(reservations)

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

    def report(self) -> str:
        lines = []
        for invariant, messages in sorted(self.violations.items()):
            lines.append(f"invariant {invariant}: {len(messages)} violation(s)")
            lines.extend(f"    {m}" for m in messages[:10])
        return "\n".join(lines)
