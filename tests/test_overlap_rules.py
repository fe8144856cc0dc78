"""The storm checker's overlap rule on synthetic histories (tests/storm/overlaps.py): where
attempts run again, an attempt that a later attempt of its turn followed committed nothing, so
its overlap with another turn is the allowed past-lease window; elsewhere it is a violation."""

from __future__ import annotations

import pytest

from .storm.overlaps import serialization
from .storm.records import Execution, History, Outage

LEASE_TTL = 1.5
S = 1_000_000  # the executions' clock counts microseconds


def _history() -> History:
    """Attempt 1 of turn t on node A, kept from the store past its lease; attempt 2 on B; the
    next turn u on B while attempt 1 (still paused) has not ended."""
    history = History(seed=0, sessions=["s"])
    history.executions = [
        Execution("s", "t", "k", "s|k|", "A", start=1 * S, end=5 * S, how="ok"),
        Execution("s", "t", "k", "s|k|", "B", start=3 * S, end=3 * S + 10, how="ok"),
        Execution("s", "u", "u", "s|u|", "B", start=3 * S + 20, end=3 * S + 30, how="ok"),
    ]
    history.outages = [Outage("A", "sigstop", 1 * S + 5, 4 * S + 5, 3.0)]
    return history


@pytest.mark.parametrize("attempts_rerun", [True, False])
def test_a_given_up_attempt_overlapping_the_next_turn_is_allowed_only_where_attempts_rerun(
    attempts_rerun: bool,
) -> None:
    verdict = serialization(_history(), {"t", "u"}, LEASE_TTL, attempts_rerun)
    overlaps = [message for invariant, message in verdict.violations if invariant == "1 overlap"]
    if attempts_rerun:
        assert overlaps == [] and len(verdict.allowed) == 2
    else:
        assert overlaps  # t committed, and without attempts its run on A is the one that did


def test_an_attempt_no_later_attempt_followed_is_still_held_to_its_commit() -> None:
    # Given the same history without attempt 2: the run on A is t's only one, and t committed
    history = _history()
    del history.executions[1]
    verdict = serialization(history, {"t", "u"}, LEASE_TTL, attempts_rerun=True)
    # Then u starting while it ran is a violation
    assert [m for i, m in verdict.violations if i == "1 overlap"] == [
        "s: turn u started while t ran"
    ]
