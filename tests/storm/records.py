"""What a storm records: the callers' submits and answers, the controls, the crashes, and the
agent's executions, in the same form whatever ran the cluster."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stickless import FailureCode, Priority, TurnFailedError, TurnResult

from .known_bugs import KILLED_NODE_ANSWERS_BUG
from .streams import StreamRecord


def request_text(session_id: str, tag: str, spec: str = "") -> str:
    """A request's input: it names its session and its tag (its idempotency key, or a unique
    name for a keyless request), so the agent's journal maps each execution back to it. The
    spec says how the agent works the turn (see the agents of each storm)."""
    return f"{session_id}|{tag}|{spec}"


def parse(text: str) -> tuple[str, str]:
    """(session, tag) of a request's input text."""
    session_id, tag, *_ = [*text.split("|", 2), ""]
    return session_id, tag


@dataclass
class Call:
    """One submit and the one answer its caller got."""

    index: int
    session_id: str
    #: The node handle the submit went through (None: chosen afresh for every attempt).
    node: Any
    tag: str
    text: str
    key: str | None
    priority: Priority | None = None
    conflict: bool = False  # a deliberate reuse of a DONE key with a different input
    probe: bool = False  # a held turn whose holder the storm crashes
    repeat: bool = False  # repeats an earlier request of its client (same key, same input)
    #: What the driver submits (for drivers that resubmit it elsewhere).
    payload: Any = None
    #: The environment's own ticket of the submit (a SubmitDisposition, a ticket dict...).
    ticket: Any = None
    sent: float = 0.0  # time.monotonic() when submitted
    done: float = 0.0  # time.monotonic() when its answer (or refusal) came
    #: When the caller saw its answer, on the clock of the executions (see `Execution.start`).
    answered_at: float = 0.0
    turn_id: str | None = None
    kind: str | None = None  # how submit() placed it (EXECUTED_LOCALLY, FORWARDED, ...)
    #: Turn ids of every accepted attempt (a retried submit may get a new turn each time).
    attempts: list[str] = field(default_factory=list)
    refused: BaseException | None = None  # submit() itself raised
    result: TurnResult | None = None
    error: BaseException | None = None
    hung: bool = False
    #: The caller was still waiting for its answer when its node was killed.
    pending_at_kill: bool = False
    #: How often the caller's node died under it and the submit was retried elsewhere.
    retries: int = 0

    @property
    def node_id(self) -> str:
        return str(self.node.node_id) if self.node is not None else "-"

    @property
    def code(self) -> FailureCode | None:
        return self.error.code if isinstance(self.error, TurnFailedError) else None

    @property
    def ok(self) -> bool:
        """A success the checker trusts: a TurnResult not handed out by a node being killed
        (while KILLED_NODE_ANSWERS_BUG stands, such a result may never have been recorded)."""
        return self.result is not None and not (KILLED_NODE_ANSWERS_BUG and self.pending_at_kill)

    def who(self) -> str:
        return f"call #{self.index} {self.text!r} via {self.node_id}"


@dataclass
class Control:
    """An interrupt or a release, and what it raised."""

    what: str  # "interrupt", "interrupt_turn" or "release"
    node: Any
    session_id: str
    sent: float = 0.0
    done: float = 0.0
    #: The same two instants on the executions' clock (see `Execution.start`).
    sent_at: float = 0.0
    done_at: float = 0.0
    error: BaseException | None = None

    @property
    def node_id(self) -> str:
        return str(self.node.node_id)


@dataclass
class Kill:
    """A node crashed by the storm."""

    #: The node as the executions name it (`Execution.node`) and as calls reach it.
    node: str
    at: float  # time.monotonic() of the crash
    #: Until when (on the executions' clock) a turn the crash cut short counts as running.
    stamp: float = 0.0
    mid_turn: bool = False


@dataclass(frozen=True)
class Outage:
    """A span during which a node could not renew its leases: its process was stopped, its
    whole path to the store stalled, or the replies of its lease renewals held."""

    node: str  # as `Execution.node` names it
    what: str  # the fault ("sigstop", "stall", "hold:lease_renew", ...)
    #: When it began and ended, on the executions' clock.
    start: float
    end: float
    #: How long it lasted, in seconds.
    seconds: float

    def __str__(self) -> str:
        return f"{self.what} on {self.node} for {self.seconds:.2f}s"


@dataclass
class Execution:
    """One run of a turn by the agent, as its journal recorded it."""

    session_id: str
    turn_id: str
    tag: str
    #: The input it ran (None when the journal does not record it).
    text: str | None
    #: The node that ran it, named as in `Kill.node` (None when the journal does not know).
    node: str | None
    #: When it started and ended, on the executions' clock (end None: it never ended).
    start: float
    end: float | None = None
    #: How it ended: "ok" (returned normally with its entries staged), "interrupted", ...
    how: str | None = None
    #: The transcript entries it staged (what its turn may commit).
    staged: tuple[str, ...] = ()


@dataclass
class Injection:
    """A NOW message the agent took into its running turn."""

    at: float  # on the executions' clock
    session_id: str
    tag: str
    text: str
    host_turn_id: str


@dataclass
class History:
    """Everything one storm observed, for the checker."""

    seed: int
    sessions: list[str]
    calls: list[Call] = field(default_factory=list)
    controls: list[Control] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    #: (start, end) in time.monotonic() of every restart of the store.
    restarts: list[tuple[float, float]] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    injections: list[Injection] = field(default_factory=list)
    #: Sessions whose inbox collects failed, as the nodes logged it (evidence of a known bug).
    collect_failures: Counter[str] = field(default_factory=Counter)
    #: Spans during which a node could not renew its leases (the fault storm's driver records
    #: them: they explain the one overlap of turns the README allows).
    outages: list[Outage] = field(default_factory=list)
    #: The session streams kept open through the storm (tests/storm/streams.py), if any.
    streams: list[StreamRecord] = field(default_factory=list)
