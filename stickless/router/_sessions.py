"""The sessions this node holds: their actors, per-session locks, and claiming a free session."""

from __future__ import annotations

import time
from collections.abc import Callable

from .._errors import ConflictingAgentError, SticklessError
from ..actors import SessionActor
from ..backends.base import FencedOut, HeldElsewhere, Lease, NotLive
from ._background import KeyedLocks, io, log, quiet
from ._context import NodeContext, RouterPart

#: Builds the actor of a session this node just claimed: its lease, the session's binding and
#: whether the record was provisioned under that lease already (the binding is then known).
ActorFactory = Callable[[str, Lease, "str | None", bool], SessionActor]


#: How many named interrupts of turns not running here a node remembers.
_REMEMBERED_INTERRUPTS = 1024


class LocalSessions(RouterPart):
    """Actors by session id; a session's actor exists exactly while this node holds its lease."""

    def __init__(
        self,
        ctx: NodeContext,
        new_actor: ActorFactory,
        on_claimed: Callable[[], None],
    ) -> None:
        super().__init__(ctx)
        self._new_actor = new_actor
        self._on_claimed = on_claimed
        self._actors: dict[str, SessionActor] = {}
        #: Named interrupts of turns no actor here ran when they came: (session, turn) ->
        #: reason, the oldest forgotten past `_REMEMBERED_INTERRUPTS`; an actor made for the
        #: session later cancels such a turn when it reaches it (its next attempt, say).
        self._interrupts: dict[tuple[str, str], str] = {}
        self.locks = KeyedLocks()

    def remember_interrupt(self, session_id: str, turn_id: str, reason: str) -> None:
        """Keep a named interrupt that found no actor of the session here, for one made later."""
        self._interrupts[(session_id, turn_id)] = reason
        while len(self._interrupts) > _REMEMBERED_INTERRUPTS:
            del self._interrupts[next(iter(self._interrupts))]

    def get(self, session_id: str) -> SessionActor | None:
        return self._actors.get(session_id)

    def holds(self, actor: SessionActor) -> bool:
        """Whether `actor` is still the one serving its session here."""
        return self._actors.get(actor.session_id) is actor

    def actors(self) -> list[SessionActor]:
        return list(self._actors.values())

    def ids(self) -> list[str]:
        return list(self._actors)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._actors

    def __len__(self) -> int:
        return len(self._actors)

    def drop(self, actor: SessionActor) -> bool:
        """Forget a stopped actor (and stop renewing its lease); False if it was already gone."""
        if self._actors.get(actor.session_id) is not actor:
            return False
        del self._actors[actor.session_id]
        self._renewer.untrack(actor.session_id)
        return True

    def clear(self) -> None:
        """Crash path: forget every actor at once."""
        self._actors.clear()

    async def acquire(self, session_id: str) -> tuple[Lease | HeldElsewhere, int]:
        """The session's lease, taken under this node's live incarnation (a dead one is
        replaced first: see `LeaseRenewer.revive`), with that incarnation's epoch.

        Raises:
            BackendUnavailableError: a backend failed (or the node could not register).
        """
        epoch = self._renewer.epoch
        try:
            return await io(self._backends.leases.acquire(session_id, self._node_id)), epoch
        except NotLive:
            await io(self._renewer.revive(self._backends, epoch))
            epoch = self._renewer.epoch
            return await io(self._backends.leases.acquire(session_id, self._node_id)), epoch

    async def claim(self, session_id: str, agent_ref: str | None) -> SessionActor | HeldElsewhere:
        """Lease first, then (for a submit's `agent_ref`) the record provisioned and its binding
        checked; a loser touches no record. Nothing is bound here: the actor binds an agent
        once its opener accepted it.

        Raises:
            ConflictingAgentError: the record is bound to another agent (lease given back).
            BackendUnavailableError: a backend failed (lease given back).
            FencedOut: the lease was won under an incarnation of this node that ended before
                the answer came (a pause, a reply held back): another node may hold the
                session by now. Or a newer lease provisioned the record meanwhile.
        """
        started = time.monotonic()
        won, epoch = await self.acquire(session_id)
        took = time.monotonic() - started
        self._metrics.emit("on_lock_acquire", session_id, isinstance(won, Lease), took)
        if isinstance(won, HeldElsewhere):
            return won
        if not self._renewer.track(won, epoch):
            raise FencedOut(f"lease of {session_id} won under an incarnation that has ended")
        bound: str | None = None
        if agent_ref is not None:
            try:
                bound = await io(self._backends.records.provision(session_id, None, won.token))
            except BaseException:
                self._renewer.untrack(session_id)
                await quiet(self._backends.leases.release(won))
                raise
            if bound is not None and bound != agent_ref:
                self._renewer.untrack(session_id)
                await quiet(self._backends.leases.release(won))
                raise ConflictingAgentError(
                    f"session {session_id} is bound to agent {bound!r}, not {agent_ref!r}"
                )
        actor = self._new_actor(session_id, won, bound, agent_ref is not None)
        for (session, turn_id), reason in self._interrupts.items():
            if session == session_id:
                actor.remember_cancel(turn_id, reason)
        self._actors[session_id] = actor
        self._metrics.emit("on_cache_miss", session_id)
        self._on_claimed()
        return actor

    async def claim_and_drain(self, session_id: str) -> bool:
        """Make sure someone here drains the session's inbox: ring our actor, or claim it free."""
        async with self.locks.hold(session_id):
            if self._bg.closed:
                return False
            actor = self._actors.get(session_id)
            if actor is None:
                try:
                    claimed = await self.claim(session_id, None)
                except (SticklessError, FencedOut) as exc:
                    log.info("doorbell claim of %s failed: %s", session_id, exc)
                    return False
                if not isinstance(claimed, SessionActor):
                    return False
                actor = claimed
            if actor.accepting:
                actor.ring()
            return True

    async def on_doorbell(self, session_id: str, held_by: str | None) -> None:
        """The session's inbox has work: the holder drains; when nobody holds the session,
        whoever claims it drains."""
        actor = self._actors.get(session_id)
        if actor is not None:
            if actor.accepting:
                actor.ring()
            return
        if held_by is not None and held_by != self._node_id:
            return
        await self.claim_and_drain(session_id)

    async def claim_unheld(self, session_id: str) -> None:
        """Claim and drain a session that is not held here (its inbox is known to hold work)."""
        if session_id not in self._actors:
            await self.claim_and_drain(session_id)
