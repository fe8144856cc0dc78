"""Invariant 2 of the storms' checker: one answer per submit (see tests/storm/checker.py)."""

from __future__ import annotations

from collections import Counter

from stickless import (
    FailureCode,
    IdempotencyConflictError,
    RouterClosedError,
    TurnFailedError,
    TurnResult,
)

from .records import Call
from .verdicts import CheckerBase


class AnswerChecks(CheckerBase):
    """Every submit is refused for a reason the run explains or answered exactly once."""

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
        self.controls_explained()
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

    def controls_explained(self) -> None:
        """An interrupt or a release raised only for a reason the run explains."""
        for control in self.history.controls:
            error = control.error
            if error is not None and not self.excused(error, control):
                where = f"{control.what} of {control.session_id} via {control.node_id}"
                self.fail("2 answer", f"{where} raised {error!r}")

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
