"""Giving sessions up and ending them: idle, LRU, shutdown, lost lease, hand-off, release,
delete and EVICT, with the unstarted work of each stopped actor re-queued or answered."""

from __future__ import annotations

import asyncio
import contextlib
import time

from .._errors import FailureCode, SessionBusyError
from ..actors import SessionActor, StopReason, TurnWork
from ..backends.base import HeldElsewhere, Lease
from ..wire import EvictPayload, Outcome, SignalKind, YieldPayload
from ._background import io, log, quiet
from ._callers import Forward
from ._keys import queued_staleness
from ._session_part import SessionPart

#: Backoff (seconds) of retaking a session to end it while its holder is asked to.
_END_POLL_FIRST = 0.01
_END_POLL_CAP = 0.25


class Handover(SessionPart):
    """Stops actors and hands their sessions back to the cluster, or ends the sessions."""

    def _init_part(self) -> None:
        self._evict_waiters: dict[str, list[asyncio.Event]] = {}

    # ------------------------------------------------------------ giving a session back

    def give_up_later(self, actor: SessionActor, reason: StopReason) -> None:
        """Hand the session back in the background, under its lock."""
        self._bg.spawn(self.give_up_locked(actor, reason), reason.name.lower())

    async def give_up_locked(self, actor: SessionActor, reason: StopReason) -> None:
        async with self._sessions.locks.hold(actor.session_id):
            if not self._sessions.holds(actor):
                return
            if reason in (StopReason.IDLE, StopReason.LRU) and (actor.busy or actor.queued):
                return
            await self.give_up(actor, reason)

    async def give_up(self, actor: SessionActor, reason: StopReason) -> None:
        """Hand a session back (idle, LRU, shutdown, lost lease) without ending it."""
        lease = actor.lease
        requeued = await self._retire(actor, reason)
        if lease is not None and reason is not StopReason.LEASE_LOST:
            await quiet(self._backends.leases.release(lease))
        if requeued or await quiet(self._backends.inbox.is_empty(actor.session_id)) is False:
            await self._control.ring_doorbell(actor.session_id, None)

    def settled(self, actor: SessionActor) -> None:
        """An actor's state changed: an idle actor marked for closing (or with nothing to do)
        goes back now."""
        if actor.busy or not actor.accepting or actor.running is not None:
            return
        if actor.close_requested:
            self.give_up_later(actor, StopReason.LRU)
        elif not actor.has_handle and actor.queued == 0:
            # A doorbell claim that found nothing to run: hand the session straight back.
            self.give_up_later(actor, StopReason.IDLE)

    def lease_lost(self, actor: SessionActor) -> None:
        """The actor lost its lease; hand the session back (queued work re-queued)."""
        if not self._bg.closed:
            self._bg.spawn(self._give_up_lost(actor), "lease-lost")

    def renewal_failed(self, session_id: str, token: int) -> None:
        """The renewer could not extend a lease: the actor under it loses the lease now."""
        actor = self._sessions.get(session_id)
        if actor is not None and actor.token == token and not self._bg.closed:
            self._metrics.emit("on_lease_extend_failed", session_id)
            actor.lose_lease()

    async def _give_up_lost(self, actor: SessionActor) -> None:
        async with self._sessions.locks.hold(actor.session_id):
            if self._sessions.holds(actor):
                await self.give_up(actor, StopReason.LEASE_LOST)

    async def _retire(self, actor: SessionActor, reason: StopReason) -> int:
        """Stop an actor and dispose of its unstarted work; returns how many were re-delivered."""
        pending = await actor.stop(reason)
        self._sessions.drop(actor)
        self._metrics.emit("on_evict", actor.session_id, reason.name)
        self._bg.spawn(self._control.publish_signals([self._board.gone(actor, time.time())]))
        if reason.ends_queue:
            for work in pending:
                await self._outcomes.fail(
                    work,
                    FailureCode.EVICTED,
                    f"session ended ({reason.value}) before the message ran",
                )
            return 0
        return await self._requeue(pending, actor.token)

    async def _requeue(self, works: list[TurnWork], token: int) -> int:
        """Put collected-but-unstarted work back in the inbox in order (else NOT_HOLDER)."""
        requeued = 0
        why = "this node gave the session up and could not re-queue the message"
        for work in works:
            try:
                if work.owned:
                    await self._backends.idempotency.release_holder(
                        work.session_id, work.key, self._node_id, queued_staleness(self._config)
                    )
            except Exception as exc:  # still ours, and not queued: it never runs
                log.warning("re-delivery of %s failed: %s", work.turn_id, exc)
                await self._outcomes.fail(work, FailureCode.NOT_HOLDER, why)
                continue
            handed = await self._outcomes.hand_on(work, FailureCode.NOT_HOLDER, why)
            if handed is not None:  # queued anew, or withdrawn: this copy is done with
                await self._outcomes.ack(work.session_id, work.pending)
            if isinstance(handed, Outcome):  # withdrawn: it never runs
                await self._outcomes.announce_unrun(work.session_id, work.key, handed, work.trace)
                continue
            requeued += 1
            if self._callers.waiting(work.turn_id):
                self._callers.track(
                    Forward(
                        work.session_id, work.key, work.turn_id, self._deadline(), token, work.trace
                    )
                )
        return requeued

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self._config.forward_ttl

    # ------------------------------------------------------------ ending a session

    async def release(self, session_id: str) -> None:
        """End the session (EVICTED to its queued messages), keeping its history.

        Raises:
            SessionBusyError: neither this node nor the holder could end it in time.
        """
        await self._end_everywhere(session_id, delete=False)

    async def delete(self, session_id: str) -> None:
        """End the session and delete its history.

        Raises:
            SessionBusyError: neither this node nor the holder could end it in time.
        """
        await self._end_everywhere(session_id, delete=True)

    async def _end_everywhere(self, session_id: str, *, delete: bool) -> None:
        """End the session here if this node holds it or can take it; else ask its holder
        (YIELD, asked again every `interrupt_grace`), which ends it and broadcasts EVICT. A holder
        that died is outlived: its liveness runs out within `lease_ttl` and this node takes it.

        The holder does the ending itself, so no other node can claim the session between a
        hand-over and the ending, and no turn is stopped for an end that does not happen.
        """
        config = self._config
        loop = asyncio.get_running_loop()
        bound = config.release_interrupt_timeout + config.interrupt_grace + config.lease_ttl
        deadline = loop.time() + bound
        evicted = asyncio.Event()
        self._evict_waiters.setdefault(session_id, []).append(evicted)
        payload = YieldPayload(purpose="delete" if delete else "release", requester=self._node_id)
        next_ask, delay = loop.time(), _END_POLL_FIRST
        asked: tuple[str, int] | None = None
        try:
            while not evicted.is_set():
                async with self._sessions.locks.hold(session_id):
                    held = await self._holder_lease(session_id)
                    if isinstance(held, Lease):
                        await self._end_session(session_id, held, delete=delete)
                        return
                now = loop.time()
                if (held.holder, held.token) != asked:
                    # A holder that took the session meanwhile gets its own time to end it
                    # (or, if it died, for its lease to run out), and is asked at once.
                    asked, next_ask = (held.holder, held.token), now
                    deadline = max(deadline, now + bound)
                if now >= deadline:
                    raise SessionBusyError(
                        f"session {session_id} is held by another node that did not end it "
                        f"within {bound:.1f}s"
                    )
                if now >= next_ask:
                    await io(
                        self._control.publish(SignalKind.YIELD, session_id, payload.model_dump())
                    )
                    next_ask = now + config.interrupt_grace
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(evicted.wait(), min(delay, max(0.0, deadline - now)))
                delay = min(delay * 2, _END_POLL_CAP)
        finally:
            waiters = self._evict_waiters.get(session_id)
            if waiters is not None and evicted in waiters:
                waiters.remove(evicted)
                if not waiters:
                    del self._evict_waiters[session_id]

    async def _holder_lease(self, session_id: str) -> Lease | HeldElsewhere:
        """This node's lease on the session (taken if free), or who holds it elsewhere."""
        actor = self._sessions.get(session_id)
        if actor is not None and actor.lease is not None:
            return actor.lease
        if actor is not None:
            await self._retire(actor, StopReason.LEASE_LOST)
        won, _ = await self._sessions.acquire(session_id)
        return won

    async def _end_session(self, session_id: str, lease: Lease, *, delete: bool) -> None:
        """Release/delete on the holder: stop, purge (EVICTED), release, broadcast EVICT."""
        actor = self._sessions.get(session_id)
        if actor is not None:
            await self._retire(actor, StopReason.DELETE if delete else StopReason.RELEASE)
        if delete:
            await io(self._backends.records.delete(session_id))
            await quiet(self._backends.events.delete(session_id))
        purged = await quiet(self._backends.inbox.purge(session_id))
        if purged is not None:
            for message in purged.messages:
                await self._outcomes.answer_evicted(message)
            for entry in purged.unreadable:
                await self._outcomes.answer_unreadable(session_id, entry)
        await quiet(self._backends.leases.release(lease))
        await self._control.publish_quiet(
            SignalKind.EVICT, session_id, EvictPayload(token=lease.token).model_dump()
        )
        self._apply_evict(session_id, lease.token)

    # ------------------------------------------------------------ signals from other nodes

    async def on_evict(self, session_id: str, token: int) -> None:
        """Another node ended the session under lease `token`: stop ours if not newer."""
        async with self._sessions.locks.hold(session_id):
            actor = self._sessions.get(session_id)
            if actor is not None and actor.token <= token:
                await self._retire(actor, StopReason.EVICTED)
        self._apply_evict(session_id, token)

    async def on_yield(self, session_id: str, purpose: str) -> None:
        """Another node asks to end the session: the holder releases or deletes it for them."""
        async with self._sessions.locks.hold(session_id):
            actor = self._sessions.get(session_id)
            if actor is None or actor.lease is None:
                return
            await self._end_session(session_id, actor.lease, delete=purpose == "delete")

    def _apply_evict(self, session_id: str, token: int) -> None:
        """Node-local consequences of an EVICT: fail forwards, finish subscribers, drop status."""
        for forward in self._callers.forwards(session_id):
            if forward.token <= token:
                self._bg.spawn(self._settle_evicted_forward(forward), "evicted-forward")
        self._control.finish_subscribers(session_id)
        self._board.forget(session_id)
        for waiter in self._evict_waiters.pop(session_id, []):
            waiter.set()

    async def _settle_evicted_forward(self, forward: Forward) -> None:
        """Answer a forward of an evicted session EVICTED only once its message can no longer
        run: a message delivered after the purge must not run under the next lease while its
        caller was told it was evicted. Otherwise follow what the store says."""
        evicted = Outcome.failure(
            forward.turn_id,
            FailureCode.EVICTED,
            f"session {forward.session_id} was evicted",
            self._node_id,
        )
        idem = self._backends.idempotency
        try:
            if await idem.compare_and_reset(forward.session_id, forward.key, None, evicted):
                self._callers.resolve(evicted)
                return
            found = await idem.find(forward.session_id, forward.key)
        except Exception as exc:
            log.warning("settling evicted forward %s failed: %s", forward.turn_id, exc)
            return  # the poll keeps following it, bounded by the forward deadline
        if found is not None and found.turn_id == forward.turn_id and found.outcome is not None:
            self._callers.resolve(found.outcome)
