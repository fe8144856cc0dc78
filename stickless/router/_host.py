"""What a session actor may ask of its node: a narrow adapter over the router's parts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._config import RouterConfig
from .._errors import BackendUnavailableError, InternalError
from .._events import Event
from .._session import LiveSession, LiveSessionOpener
from .._trace import Tracing
from ..actors import LastFrames, Later, SessionActor, TurnWork
from ..backends.base import Backends, StagedCommit, UnreadableEntry
from ..wire import Outcome
from ._background import io
from ._context import NodeContext, RouterPart
from ._control import ControlChannel
from ._handover import Handover
from ._outcomes import TurnOutcomes
from ._sessions import LocalSessions


class NodeActorHost(RouterPart):
    """The `ActorHost` every actor of one node shares."""

    def __init__(
        self,
        ctx: NodeContext,
        *,
        opener: LiveSessionOpener,
        sessions: LocalSessions,
        control: ControlChannel,
        outcomes: TurnOutcomes,
        handover: Handover,
        state_changed: Callable[[SessionActor], None],
    ) -> None:
        super().__init__(ctx)
        self._opener = opener
        self._sessions = sessions
        self._control = control
        self._outcomes = outcomes
        self._handover = handover
        self._state_changed = state_changed

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def config(self) -> RouterConfig:
        return self._config

    @property
    def backends(self) -> Backends:
        return self._backends

    @property
    def tracing(self) -> Tracing:
        return self._tracing

    async def open_handle(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return await self._opener.open(session_id, agent_ref, attributes)

    async def deliver_frames(self, session_id: str, frames: Sequence[Event]) -> None:
        await self._control.deliver_frames(session_id, frames)

    async def complete(
        self,
        work: TurnWork,
        outcome: Outcome,
        commit: StagedCommit | None = None,
        last: LastFrames | None = None,
        frame: Event | None = None,
        bury: str | None = None,
    ) -> Outcome | None:
        return await self._outcomes.complete(work, outcome, commit, last, frame, bury)

    def answer_unknown(self, turn_ids: Sequence[str]) -> None:
        for turn_id in turn_ids:
            self._outcomes.tell_unknown(turn_id)

    async def take_over(self, work: TurnWork) -> bool | Later:
        return await self._outcomes.take_over(work)

    def taken(self, work: TurnWork, attempt: int) -> None:
        self._outcomes.taken(work, attempt)

    async def hold(self, work: TurnWork, token: int) -> None:
        await self._outcomes.hold(work, token)

    async def schedule_retry(self, work: TurnWork, token: int, reason: str, delay: float) -> bool:
        return await self._outcomes.schedule_retry(work, token, reason, delay)

    async def answer_unreadable(self, session_id: str, entry: UnreadableEntry, token: int) -> None:
        await self._outcomes.answer_unreadable(session_id, entry, token)

    async def holds_lease(self, session_id: str, token: int) -> bool:
        # In doubt (the last liveness renewal was sent a TTL ago or more: a busy store, a
        # pause), the incarnation is renewed now: the answer is then sure, at one round trip.
        if self._renewer.surely_holds(session_id, token):
            return True
        if not self._renewer.holds(session_id, token):
            return False
        try:
            alive = await io(self._renewer.confirm(self._backends))
        except (BackendUnavailableError, InternalError):
            return False
        return alive and self._renewer.holds(session_id, token)

    def lease_lost(self, session_id: str, token: int) -> None:
        actor = self._sessions.get(session_id)
        if actor is not None and actor.token == token:
            self._handover.lease_lost(actor)

    def events_dropped(self, session_id: str, drops: Mapping[str, int]) -> None:
        for rank, count in drops.items():
            self._metrics.emit("on_events_dropped", session_id, count, rank)

    def entries_reclaimed(self, session_id: str, redelivered: int, reclaimed: int) -> None:
        if redelivered:
            self._metrics.emit("on_redelivered", session_id, redelivered)
        if reclaimed:
            self._metrics.emit("on_reclaimed", session_id, reclaimed)

    def actor_state_changed(self, session_id: str, token: int) -> None:
        actor = self._sessions.get(session_id)
        if actor is not None and actor.token == token:
            self._state_changed(actor)
