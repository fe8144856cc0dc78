"""The small cluster protocol the scenes are written against, and what it hands back.

Nodes are named by their node id (a string); a `DemoCluster` maps ids to whatever it drives:
routers in this process (`local.LocalDemoCluster`) or router actors on Ray
(`on_ray.RayDemoCluster`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .._events import Event
from .._types import TurnResult
from ..router import ClusterSessionStatus
from .agent import AgentLedger
from .narration import Narration


class DemoError(Exception):
    """A scene saw something other than what stickless promises."""


@dataclass(frozen=True)
class Ticket:
    """A submit's answer: where the turn runs, its id, and how to await its result."""

    #: "EXECUTED_LOCALLY" or "FORWARDED", as seen from the submitting node.
    kind: str
    turn_id: str
    #: The turn's result through the node it was submitted to (raises TurnFailedError): the
    #: awaitable the node hands out, so awaiting it adds no task of its own.
    result: Callable[[], Awaitable[TurnResult]]
    #: Whether the result was already there when submit returned (None: cannot tell).
    ready: bool | None = None


class Subscription(Protocol):
    """A subscriber on one node to one session's frames."""

    def frames(self, turn_id: str) -> AsyncIterator[Event]:
        """That turn's frames, from its start; ends after its terminal frame."""
        ...


class DemoCluster(Protocol):
    """What the scenes need from a cluster."""

    #: How the scenes are told on this cluster.
    narration: Narration
    #: What the agents did, when they run in this process (None: they run elsewhere).
    ledger: AgentLedger | None
    #: Factor on the scenes' waits (a slower cluster gets longer bounds).
    patience: float

    def nodes(self) -> list[str]:
        """Ids of the live nodes, in a fixed order (killed ones drop out)."""
        ...

    def roster(self) -> list[str]:
        """Nodes the summary lists even if no submit touched them (killed ones included)."""
        ...

    def label(self, node_id: str | None) -> str:
        """How a node is named in the output."""
        ...

    async def submit(self, node: str, session_id: str, text: str, **extra: Any) -> Ticket:
        """Submit a turn of the demo agent through `node` (`extra`: SubmitRequest fields)."""
        ...

    async def subscribe(self, node: str, session_id: str) -> Subscription:
        """Subscribe on `node` to the session's frames (call before the turn is submitted)."""
        ...

    async def interrupt(self, node: str, session_id: str, reason: str) -> None: ...

    async def status(self, node: str, session_id: str) -> ClusterSessionStatus: ...

    async def kill(self, node: str) -> None:
        """Crash the node: no release, no announcement."""
        ...

    async def replacement(self, node: str) -> str | None:
        """The node started in place of the killed `node` (waited for, bounded); None when this
        cluster does not replace killed nodes."""
        ...

    async def committed(self, session_id: str) -> int:
        """How many transcript entries the session has committed."""
        ...
