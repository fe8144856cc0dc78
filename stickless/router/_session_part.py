"""Base of the router parts that act on the sessions held here and answer their turns."""

from __future__ import annotations

from ._context import NodeContext, RouterPart
from ._control import ControlChannel
from ._outcomes import TurnOutcomes
from ._sessions import LocalSessions


class SessionPart(RouterPart):
    """A part working with the local sessions, their outcomes and the control channel."""

    def __init__(
        self,
        ctx: NodeContext,
        sessions: LocalSessions,
        outcomes: TurnOutcomes,
        control: ControlChannel,
    ) -> None:
        super().__init__(ctx)
        self._sessions = sessions
        self._outcomes = outcomes
        self._control = control
        self._init_part()

    def _init_part(self) -> None:
        """Set up the part's own state (a part that keeps some overrides this)."""
