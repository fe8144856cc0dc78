"""Invariant 3 of the storms' checker: at most once per key (see tests/storm/checker.py)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from stickless import FailureCode

from .records import Call, Execution
from .rules import LOST_HOLDER, NOTHING_COMMITTED
from .verdicts import CheckerBase


class KeyChecks(CheckerBase):
    """Every caller of a turn hears the same story; a key succeeds and commits once (but for
    a commit whose holder was lost)."""

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
                self.known("REFUSED_BUT_RAN_BUG", "3 idempotency", message)
            else:
                tagged = [c for c in calls if (c.session_id, c.tag) == (session_id, tag)]
                story = self.story(tagged[0]) if tagged else "no call of that tag"
                self.fail("3 idempotency", f"{message}?? no submit of it was refused; {story}")
        answers = told_per_turn(calls)

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
                self.known("REFUSED_BUT_RAN_BUG", "3 idempotency", message)
            else:
                self.reruns.append(message)
                recommitted += len(turns) - 1
        self.counts["reruns_after_holder_loss"] = len(self.reruns)
        self.counts["recommitted_after_holder_loss"] = recommitted
        self.counts["abandoned_runs"] = len(abandoned)


def told_per_turn(calls: list[Call]) -> dict[str, set[str]]:
    """What the callers of each turn (and of each attempt) were told: "ok" or the failure."""
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
    return answers
