"""Invariant 4 of the storms' checker: nothing silently lost (see tests/storm/checker.py)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from stickless import FailureCode
from stickless.backends.base import Backends, ReservationState

from .records import Call, parse
from .rules import CLIENT_KEY, TURN_KEY
from .verdicts import CheckerBase


class LossChecks(CheckerBase):
    """Inboxes drain and every reservation settles, agreeing with what callers were told."""

    async def nothing_lost(self, backends: Backends) -> None:
        await self.inboxes_drained(backends)
        await self.reservations_settled(backends)
        self.counts["sessions"] = len(self.history.sessions)

    async def inboxes_drained(self, backends: Backends) -> None:
        """Every inbox drains, but for messages whose answer is recorded already."""
        rules, sessions = self.rules, self.history.sessions
        # Orphan scans and re-rung doorbells may still be draining: poll, bounded.
        deadline = time.monotonic() + rules.drain_within
        while True:
            left = [s for s in sessions if not await backends.inbox.is_empty(s)]
            if not left or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for session_id in left:
            # (after quiescing, reading what was left behind is the last thing anyone does)
            purged = await backends.inbox.purge(session_id)
            for entry in purged.unreadable:
                self.fail("4 loss", f"inbox of {session_id} holds an unreadable entry {entry}")
            for message in purged.messages:
                env = message.envelope
                text = env.input.as_text()
                what = f"inbox of {session_id} still holds {text!r} ({env.turn_id})"
                found = await backends.idempotency.find(session_id, env.key)
                if found is None or found.turn_id != env.turn_id or found.outcome is not None:
                    # Answered (or superseded): a later holder would answer it without running
                    # it; left over only because its acknowledgement was lost.
                    self.counts["unacknowledged"] = self.counts.get("unacknowledged", 0) + 1
                elif (session_id, parse(text)[1]) in self.refused_tags:
                    self.known("REFUSED_BUT_QUEUED_BUG", "4 loss", what)
                else:
                    self.fail("4 loss", f"{what}; {self.story_of(session_id, parse(text)[1])}")
            if not purged.messages and not purged.unreadable:
                self.fail("4 loss", f"inbox of {session_id} did not drain in time")

    async def reservations_settled(self, backends: Backends) -> None:
        """Every reservation settles (DONE or FAILED) and agrees with what callers were told."""
        rules, calls = self.rules, self.history.calls
        reservations: dict[tuple[str, str], Call] = {}
        by_turn: dict[str, list[Call]] = defaultdict(list)
        for call in calls:
            if call.turn_id is not None:
                key = CLIENT_KEY + call.key if call.key else TURN_KEY + call.turn_id
                reservations[(call.session_id, key)] = call
                by_turn[call.turn_id].append(call)
        deadline = time.monotonic() + rules.settle_within
        pending = dict(reservations)
        while pending and time.monotonic() <= deadline:
            for ref in list(pending):
                found = await backends.idempotency.find(*ref)
                if found is None or found.state is not ReservationState.IN_FLIGHT:
                    del pending[ref]
            if pending:
                await asyncio.sleep(0.05)
        for (session_id, key), call in reservations.items():
            found = await backends.idempotency.find(session_id, key)
            if found is None:
                # (an internal per-turn key may outlive its primary TTL of 2 x forward_ttl; a
                # refused submit discards its reservation, and whoever attached to it meanwhile
                # is told to retry)
                if key.startswith(CLIENT_KEY) and (session_id, call.tag) not in self.refused_tags:
                    message = f"{session_id}/{key}: reservation missing; {self.story(call)}"
                    self.fail("4 loss", message)
                continue
            if found.state is ReservationState.IN_FLIGHT:
                stuck = next((c for c in by_turn[found.turn_id]), call)
                self.vanished(stuck, "4 loss", f"{session_id}/{key} stays IN_FLIGHT ({found})")
                continue
            if found.outcome is None:
                continue
            stored = f"{found.outcome.code or 'DONE'}: {found.outcome.message}"
            for told in by_turn[found.turn_id]:
                where = f"{session_id}/{key}: {told.who()}"
                if told.code is not None and found.outcome.ok:
                    self.contradicted(f"{where} was told {told.code}; store: {stored}", [told])
                if told.result is not None and not found.outcome.ok:
                    message = f"{where} got a TurnResult; store: {stored}"
                    if not told.ok:
                        self.killed_node_answered(told, f"a TurnResult the store lost ({stored})")
                    elif found.outcome.code == FailureCode.HOLDER_LOST.value:
                        self.known("STALE_SUCCESS_BUG", "3 idempotency", message)
                    else:
                        self.fail("3 idempotency", message)
        self.counts["reservations"] = len(reservations)
