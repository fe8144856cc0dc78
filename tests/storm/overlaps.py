"""Serialization of a session's turns, with the one overlap the README allows.

A session's turns never run at the same time, and a turn runs at most once. The one exception
(README, "Guarantees under faults"): a holder kept from the store past its lease (its process
stopped, or its whole path to the store stalled or its lease renewals held) may still be running
its turn while the next holder starts one; its late commit is refused by fencing, so the overlap
never reaches the transcript. An overlap is allowed exactly when

- the earlier turn ran on a node with an `Outage` longer than the lease TTL that began before
  the later turn started and while the earlier turn ran (or before it, lasting into it),
- the later turn ran on another node, and
- the earlier turn committed nothing (none of its entries is in the committed record).

Every other overlap is a violation, also two that belong to the same window as the README
words it ("overlaps the next holder until it notices"): a turn the kept-away holder starts after
its outage ended and before it noticed its loss, and one under an outage a little shorter than
the lease that still outlasted it (the lease was renewed up to a renewal interval before). The
same outages explain a release that could not end its session in time
(`busy_release_explained`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

from .records import Control, Execution, History, Outage, parse


@dataclass
class Verdict:
    """What `serialization` found."""

    #: (invariant, message) of every violation.
    violations: list[tuple[str, str]] = field(default_factory=list)
    #: The allowed overlaps, described (a run's report lists them).
    allowed: list[str] = field(default_factory=list)
    #: Most turns of one session running at one instant (allowed overlaps included).
    max_concurrency: int = 0


def kept_past_lease(
    earlier: Execution,
    earlier_end: float,
    later: Execution,
    outages: list[Outage],
    lease_ttl: float,
) -> Outage | None:
    """The outage of the earlier turn's node that explains `later` starting while `earlier`
    still ran (see the module docstring; the commit condition is the caller's); None if none."""
    if earlier.node is None or later.node == earlier.node:
        return None
    found = kept_away(outages, {earlier.node}, earlier.start, earlier_end, lease_ttl)
    return next((outage for outage in found if outage.start < later.start), None)


def kept_away(
    outages: list[Outage], nodes: Collection[str], start: float, end: float, lease_ttl: float
) -> list[Outage]:
    """The outages longer than the lease TTL of any of `nodes` that overlap [start, end]."""
    return [
        outage
        for outage in outages
        if outage.node in nodes
        and outage.seconds > lease_ttl
        and outage.start < end
        and outage.end > start
    ]


def busy_release_explained(
    history: History, control: Control, lease_ttl: float | None
) -> Outage | None:
    """Why a release refused with SessionBusyError could not end its session in time
    (release_interrupt_timeout + interrupt_grace + lease_ttl, see docs/architecture.md): the
    releasing node, or a holder of the session (a node that ran its latest turn started
    before the release ended, or one during it), was kept from the store past the lease
    while the release waited. None when nothing explains it."""
    start, end = control.sent_at, control.done_at
    if lease_ttl is None or not end:
        return None
    runs = [e for e in history.executions if e.session_id == control.session_id]
    before = [e for e in runs if e.start <= start]
    holders = {e.node for e in runs if start < e.start <= end and e.node is not None}
    if before and (last := max(before, key=lambda e: e.start)).node is not None:
        holders.add(last.node)
    found = kept_away(history.outages, {control.node_id, *holders}, start, end, lease_ttl)
    return found[0] if found else None


def serialization(
    history: History,
    committed: Collection[str],
    lease_ttl: float | None,
    attempts_rerun: bool = False,
) -> Verdict:
    """Check that a session's turns never overlap but for the allowed window (`lease_ttl`:
    the nodes' lease TTL; None allows no overlap at all) and that a turn runs at most once
    (`attempts_rerun`: once per attempt, the attempts in sequence like turns).
    `committed`: the turn ids with entries in the committed record. A turn a crash cut short
    counts as running until the crash (its kill's stamp)."""
    verdict = Verdict()

    def fail(invariant: str, message: str) -> None:
        verdict.violations.append((invariant, message))

    stamps = {kill.node: kill.stamp for kill in history.kills}
    starts: dict[str, list[float]] = defaultdict(list)
    for run in history.executions:
        starts[run.turn_id].append(run.start)
    superseded = {
        id(run)
        for run in history.executions
        if attempts_rerun and any(start > run.start for start in starts[run.turn_id])
    }
    for turn_id, times in Counter(e.turn_id for e in history.executions).items():
        if times > 1 and not attempts_rerun:
            fail("3 idempotency", f"turn {turn_id} executed {times} times")
    runs: dict[str, list[tuple[float, float, Execution]]] = defaultdict(list)
    for run in history.executions:
        if run.text is not None and parse(run.text)[0] != run.session_id:
            fail("1 overlap", f"a session ran another session's input: {run}")
        if run.end is not None:
            runs[run.session_id].append((run.start, run.end, run))
        elif run.node in stamps:
            runs[run.session_id].append((run.start, stamps[run.node], run))
        else:
            fail("1 overlap", f"{run.session_id}: turn {run.turn_id} never ended")
    for session_id, spans in runs.items():
        spans.sort(key=lambda span: span[0])
        for index, (start, _, later) in enumerate(spans):
            # (at one instant, an end comes before a start: the turns did not overlap)
            running = [(end, run) for _, end, run in spans[:index] if end > start]
            verdict.max_concurrency = max(verdict.max_concurrency, len(running) + 1)
            refused = []
            for end, earlier in running:
                outage = None
                # An attempt that a later attempt of its turn followed committed nothing: the
                # next one began only after it was given up, and a given-up attempt's commit is
                # refused (commits_per_key checks the turn committed once).
                given_up = id(earlier) in superseded
                if lease_ttl is not None and (earlier.turn_id not in committed or given_up):
                    outage = kept_past_lease(earlier, end, later, history.outages, lease_ttl)
                if outage is None:
                    refused.append(earlier.turn_id)
                else:
                    verdict.allowed.append(
                        f"{session_id}: turn {later.turn_id} on {later.node} started while "
                        f"{earlier.turn_id} ran on {earlier.node}, kept from the store by {outage}"
                        f" (it committed nothing)"
                    )
            if refused:
                ran = ", ".join(refused)
                fail("1 overlap", f"{session_id}: turn {later.turn_id} started while {ran} ran")
    return verdict
