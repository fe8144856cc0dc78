"""The storm checker's liveness rule on synthetic histories (tests/storm/liveness.py): a caller
on a healthy node waiting past the bound with nothing happening to its session is a violation;
a turn of the session is progress; a cached answer, or the answer of a caller whose own node
was cut off, is not."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from .storm.liveness import liveness, unserved_spans
from .storm.records import Call, Execution, History, Outage

S = 1_000_000  # the executions' clock counts microseconds
BOUND = 6.0


@dataclass(frozen=True)
class Node:
    node_id: str


def _call(index: int, node: str, sent: float, answered: float, kind: str = "FORWARDED") -> Call:
    """An accepted submit on session s through `node`, sent and answered at these seconds."""
    call = Call(index, "s", Node(node), f"u{index}", f"s|u{index}|", None)
    call.turn_id, call.kind = f"t{index}", kind
    call.sent, call.done, call.answered_at = sent, answered, answered * S
    return call


def _history(*extra: Call, runs: tuple[Execution, ...] = ()) -> History:
    """Caller 0 on healthy node B waits 8 s on s while its holder A is cut off from the store
    (a command-path stall), plus `extra` calls and `runs` of s."""
    history = History(seed=0, sessions=["s"])
    history.calls = [_call(0, "B", 10.0, 18.0), *extra]
    history.executions = list(runs)
    history.outages = [Outage("A", "command_stall", 9 * S, 19 * S, 10.0)]
    return history


CASES = {
    "nothing happens": (_history(), [8.0]),
    "a turn of the session runs meanwhile": (
        _history(runs=(Execution("s", "t9", "u9", "s|u9|", "C", 13 * S, 13 * S + 10, "ok"),)),
        [3.0, 5.0],
    ),
    # (a key that held its outcome already: nothing waited, nothing was served)
    "a cached answer comes meanwhile": (_history(_call(1, "C", 14.0, 14.0, "CACHED")), [8.0]),
    # (the cut-off holder answering its own caller says nothing about the session)
    "a caller on the cut-off node is answered meanwhile": (
        _history(_call(1, "A", 11.0, 14.0)),
        [8.0],
    ),
}


@pytest.mark.parametrize(("history", "spans"), CASES.values(), ids=CASES.keys())
def test_unserved_spans(history: History, spans: list[float]) -> None:
    assert [round(span.seconds, 3) for span in unserved_spans(history)] == spans


def test_a_caller_on_a_cut_off_node_waits_on_that_node_not_on_the_cluster() -> None:
    # Given only a caller on the node whose command path stalls
    history = _history()
    history.calls = [_call(0, "A", 10.0, 18.0)]
    # Then the session is not unserved for the liveness rule
    assert unserved_spans(history) == []


def test_a_span_past_the_bound_is_a_violation() -> None:
    # Given a caller unserved for 8 s against a bound of 6 s
    history = _history()
    (violation,) = liveness(history, BOUND)
    assert violation.startswith("s unserved for 8.00s (waiting: #0)")
