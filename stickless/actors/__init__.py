"""Session actors: mailbox, live handle, turn execution and event relay."""

from ._actor import RunningTurn, SessionActor
from ._host import ActorHost, StopReason
from ._relay import EventRelay, RankedQueue, Subscriber, SubscriberHub, drain_subscriber
from ._work import PendingEntry, TurnWork

__all__ = [
    "ActorHost",
    "EventRelay",
    "RankedQueue",
    "RunningTurn",
    "PendingEntry",
    "SessionActor",
    "StopReason",
    "Subscriber",
    "SubscriberHub",
    "TurnWork",
    "drain_subscriber",
]
