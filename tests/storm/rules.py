"""What callers of one environment may legitimately be told, for the storms' checker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stickless import FailureCode, RouterClosedError, TurnResult

from .records import Call, Control

#: Names of reservations in the idempotency store (client keys / per-turn internal keys).
CLIENT_KEY, TURN_KEY = "c:", "t:"
#: Failures that say "this turn committed nothing": a turn's commit and its outcome are one
#: store write, so a turn answered HOLDER_LOST committed nothing either (a FAILED answer may
#: report a superseded reservation, so it is not listed).
NOTHING_COMMITTED = {
    FailureCode.HOLDER_LOST,
    FailureCode.INTERRUPTED,
    FailureCode.SHUTDOWN,
    FailureCode.EVICTED,
    FailureCode.LEASE_LOST,
    FailureCode.NOT_HOLDER,
    FailureCode.BACKEND_UNAVAILABLE,
}
#: What a caller may be told where interrupts, releases and crashes happen. FORWARD_TIMEOUT is
#: not among them: every loss is detected within lease TTL + secondary TTL, far below
#: forward_ttl, so a forward timing out means a message vanished. UNREADABLE and
#: CONFLICTING_AGENT cannot occur; FAILED and BACKEND_UNAVAILABLE (a store call inside the turn
#: that failed) only with a detail the environment's rules allow.
CHAOS_CODES = frozenset(
    {
        FailureCode.HOLDER_LOST,
        FailureCode.INTERRUPTED,
        FailureCode.SHUTDOWN,
        FailureCode.EVICTED,
        FailureCode.LEASE_LOST,
        FailureCode.NOT_HOLDER,
        FailureCode.FAILED,
        FailureCode.BACKEND_UNAVAILABLE,
    }
)
#: Answers after which a committed turn's key may legitimately run again: its holder was lost.
LOST_HOLDER = {FailureCode.HOLDER_LOST.value, "RouterClosedError"}


@dataclass(frozen=True)
class Rules:
    """What a caller of one environment may legitimately get."""

    #: Failure codes a caller may get.
    allowed_codes: frozenset[FailureCode]
    #: How long a caller waited before its answer counted as hung.
    answer_within: float
    #: Whether a FAILED answer's detail is one the run explains.
    failed_ok: Callable[[str], bool] = lambda detail: False
    #: Whether a submit or a control that raised `error` had a reason the run explains beyond a
    #: store restart or a crash (e.g. a fault on its node's own path to the store).
    excused: Callable[[BaseException, Call | Control], bool] = lambda error, what: False
    #: What a killed node's submits and controls may raise.
    killed_may_raise: tuple[type[BaseException], ...] = (RouterClosedError,)
    #: The text a successful answer carries (None: not checked).
    answer_text: Callable[[Call], str | None] = lambda call: None
    #: The node a result names as its executor, as executions name nodes (None: unknown).
    executor: Callable[[TurnResult], str | None] = lambda result: result.executed_by
    #: Nothing but a crash takes a lease away: every execution that returned normally on a
    #: node never killed is a success, only a crash excuses a key's second commit, and every
    #: HOLDER_LOST answer follows a crash.
    only_crashes_lose_holders: bool = False
    #: The nodes' lease TTL, when the history records outages (`History.outages`): an overlap
    #: of two turns of a session is allowed when the earlier one's node was kept from the store
    #: longer than this while it ran, and it committed nothing; a release may fail with
    #: SessionBusyError when its node or the session's holder was (tests/storm/overlaps.py).
    #: None: neither is allowed.
    lease_ttl: float | None = None
    #: A turn whose holder was lost runs again (`on_holder_lost="retry"`): one turn may return
    #: normally once per attempt (an attempt kept from the store past its lease finishes after
    #: the next attempt began); `commits_per_key` still allows it one commit.
    attempts_rerun: bool = False
    #: An answer that took this long counts as slow (a diagnostic count, not a bound).
    slow_after: float = float("inf")
    #: How long inboxes may take to drain, and reservations to settle, after the run.
    drain_within: float = 15.0
    settle_within: float = 10.0
    #: Longest a session may stay unserved while a healthy node exists (tests/storm/liveness.py;
    #: None: not checked).
    serve_within: float | None = None
