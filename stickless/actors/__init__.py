"""Session actors: mailbox, live handle, turn execution and event relay."""

from ._actor import SessionActor
from ._ending import RunningTurn
from ._host import ActorHost, Later, StopReason
from ._relay import EventRelay, LastFrames, Queued, RankedQueue
from ._work import PendingEntry, TurnWork

__all__ = [
    "ActorHost",
    "EventRelay",
    "LastFrames",
    "Later",
    "RankedQueue",
    "RunningTurn",
    "PendingEntry",
    "Queued",
    "SessionActor",
    "StopReason",
    "TurnWork",
]
