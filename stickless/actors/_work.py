"""Units of work in a session actor's mailbox."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from .._trace import TraceContext
from .._types import PrimitiveMap, Principal, Priority, SubmitRequest, UserInput
from ..wire import Envelope

_order = itertools.count()


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """Where a collected message waits in its session's pending set until it is answered."""

    token: int
    message_id: str


@dataclass
class TurnWork:
    """One message to run as a turn on the holder."""

    session_id: str
    turn_id: str
    key: str
    agent_ref: str
    input: UserInput
    priority: Priority
    submit_options: PrimitiveMap = field(default_factory=dict)
    initiator: Principal | None = None
    context_discriminator: str | None = None
    #: Handle options and open attributes (checked wire values): the live handle is opened with
    #: them when this work is the first turn on the holder, local or forwarded alike.
    options: PrimitiveMap = field(default_factory=dict)
    open_attributes: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    enqueued_at: float = 0.0
    #: The inbox entry this work came from (None: submitted on this node), acknowledged once
    #: the work's answer is recorded.
    pending: PendingEntry | None = None
    #: Whether this node holds the work's reservation: from the submit for work submitted here,
    #: from the take-over right before it starts for collected work.
    owned: bool = False
    #: The incarnation (`LeaseRenewer.epoch`) of this node the reservation was made under, for
    #: work submitted here (-1: none).
    epoch: int = -1
    #: Submitted here when the session's inbox held nothing and nothing was pending under an
    #: older lease (read by the reserve itself): its turn needs no collect before it.
    inbox_quiet: bool = False
    #: The attempt this work runs as (0: not started; set when it is taken over, 1 when its
    #: submitter runs it).
    attempt: int = 0
    #: Why the turn is cancelled before it starts (an interrupt that came before it), if it is.
    cancelled: str | None = None
    #: The span the turn's span is a child of: its submit's (None: no trace reached it).
    trace: TraceContext | None = None
    #: Seconds its last attempt ran here (set when it concludes; 0: it never started here).
    ran: float = 0.0
    #: The transcript's version after its commit, once its answer is recorded with one.
    committed_version: int | None = None
    order: int = field(default_factory=lambda: next(_order))

    @classmethod
    def from_request(cls, req: SubmitRequest, turn_id: str, key: str, origin: str) -> TurnWork:
        return cls(
            session_id=req.session_id,
            turn_id=turn_id,
            key=key,
            agent_ref=req.agent_ref,
            input=req.input,
            priority=req.priority,
            submit_options=dict(req.submit_options),
            initiator=req.initiator,
            context_discriminator=req.context_discriminator,
            options=dict(req.options),
            open_attributes=dict(req.open_attributes),
            origin=origin,
            owned=True,
            trace=req.trace,
        )

    @classmethod
    def from_envelope(cls, env: Envelope, pending: PendingEntry | None = None) -> TurnWork:
        return cls(
            session_id=env.session_id,
            turn_id=env.turn_id,
            key=env.key,
            agent_ref=env.agent_ref,
            input=env.input,
            priority=env.priority,
            submit_options=dict(env.submit_options),
            initiator=env.initiator,
            context_discriminator=env.context_discriminator,
            options=dict(env.options),
            open_attributes=dict(env.open_attributes),
            origin=env.origin,
            enqueued_at=env.enqueued_at,
            pending=pending,
            trace=TraceContext.lenient(env.traceparent),
        )

    def to_envelope(self) -> Envelope:
        return Envelope(
            session_id=self.session_id,
            turn_id=self.turn_id,
            agent_ref=self.agent_ref,
            input=self.input,
            priority=self.priority,
            key=self.key,
            context_discriminator=self.context_discriminator,
            submit_options=self.submit_options,
            initiator=self.initiator,
            origin=self.origin,
            enqueued_at=self.enqueued_at,
            options=self.options,
            open_attributes=self.open_attributes,
            traceparent=self.trace.traceparent if self.trace is not None else "",
        )

    def span_attributes(self, node_id: str) -> dict[str, str | int | bool]:
        """What a span of this work names: its session, turn, attempt and the node."""
        return {
            "stickless.session_id": self.session_id,
            "stickless.turn_id": self.turn_id,
            "stickless.attempt": self.attempt,
            "stickless.node_id": node_id,
        }

    @property
    def sort_key(self) -> tuple[int, int]:
        return (int(self.priority), self.order)
