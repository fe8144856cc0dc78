"""What the scenes share: the submit records, the demo state around a `DemoCluster`, and a
background collector of one turn's frames."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._errors import TurnFailedError
from .._events import Event, TextDelta
from .._types import TurnResult
from .cluster import DemoCluster, Subscription, Ticket
from .console import Console
from .narration import Narration

FORWARDED = "FORWARDED"
EXECUTED_LOCALLY = "EXECUTED_LOCALLY"


@dataclass
class SubmitRecord:
    """One submit as the demo saw it: where it entered, what happened, where it ran."""

    session_id: str
    label: str
    via: str
    ticket: Ticket
    executed_by: str | None = None
    outcome: str = "pending"
    cached: bool = False

    @property
    def kind(self) -> str:
        return self.ticket.kind

    @property
    def turn_id(self) -> str:
        return self.ticket.turn_id


@dataclass
class Demo:
    """What the scenes share: the cluster, the console, the records and what was measured."""

    cluster: DemoCluster
    console: Console
    records: list[SubmitRecord] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    #: Seconds from the kill in scene 5 to: holder_lost, next_placed, next_served, recreated.
    failover: dict[str, float] = field(default_factory=dict)

    @property
    def says(self) -> Narration:
        return self.cluster.narration

    @property
    def nodes(self) -> list[str]:
        return self.cluster.nodes()

    def label(self, node_id: str | None) -> str:
        return self.cluster.label(node_id)

    def others(self, *node_ids: str | None) -> list[str]:
        """Live nodes other than the given ones."""
        return [n for n in self.nodes if n not in node_ids]

    def _where(self, record: SubmitRecord) -> str:
        via = self.label(record.via)
        return f"{record.session_id:<11} {record.label:<7} via {via:<{self.says.label_width}}"

    async def submit(
        self, via: str, session_id: str, text: str, label: str, **extra: Any
    ) -> SubmitRecord:
        """Submit through `via`, print where it went, and keep a record."""
        record = SubmitRecord(
            session_id, label, via, await self.cluster.submit(via, session_id, text, **extra)
        )
        self.records.append(record)
        self.console.line(
            "submit", f"{self._where(record)} -> {record.kind:<17} turn {record.turn_id[:8]}"
        )
        return record

    async def outcome(self, record: SubmitRecord) -> TurnResult | None:
        """Await a submit's result, print it as it lands, and complete the record."""
        try:
            result = await record.ticket.result()
        except TurnFailedError as exc:
            record.outcome = exc.code.value
            self.console.line(
                "failed", f"{self._where(record)} -> TurnFailedError(code={exc.code.value})"
            )
            return None
        record.outcome = "ok"
        record.executed_by = result.executed_by
        ran_on = f"{self.label(result.executed_by):<{self.says.label_width}}"
        self.console.line(
            "result",
            f"{self._where(record)} -> ran on {ran_on} {result.text[: self.says.excerpt]!r}",
        )
        return result


def watch_turn(
    subscription: Subscription,
    turn_id: str,
    frames: list[Event],
    words: list[str],
    on_frame: Callable[[Event], None] | None = None,
) -> tuple[asyncio.Task[None], asyncio.Event]:
    """Collect a turn's frames and words in the background; the event is set at 6 words."""
    enough = asyncio.Event()

    async def collect() -> None:
        async for event in subscription.frames(turn_id):
            frames.append(event)
            if isinstance(event, TextDelta):
                words.append(event.text.strip())
                if len(words) == 6:
                    enough.set()
            if on_frame is not None:
                on_frame(event)

    return asyncio.create_task(collect()), enough
