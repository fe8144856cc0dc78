"""Lease renewal on its own thread, event loop and backend connections (see "Leases" in
docs/architecture.md).

A renewal tick that waits behind a busy turn is indistinguishable from a stolen lease, so the
renewer never shares the node's event loop. One tick renews every lease the node holds and
touches every reservation it owns, one round trip per role. A watchdog stops renewing when the
node's main loop has not ticked for `watchdog_timeout`, so a wedged node lets its sessions go.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from ..backends.base import Backends, Lease, ReservationRef

log = logging.getLogger("stickless.renewal")

#: Called on the renewer thread for each lost lease; must not block (it only schedules work).
LostCallback = Callable[[str, int], None]


class LeaseRenewer:
    """Keeps a node's leases and reservations alive from a dedicated thread."""

    def __init__(
        self,
        backends: Backends,
        node_id: str,
        *,
        lease_ttl: float,
        interval: float,
        secondary_ttl: float,
        watchdog_timeout: float,
        on_lost: LostCallback,
    ) -> None:
        self._backends = backends
        self._node_id = node_id
        self._lease_ttl = lease_ttl
        self._interval = interval
        self._secondary_ttl = secondary_ttl
        self._watchdog_timeout = watchdog_timeout
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._renewed_at: dict[str, float] = {}
        self._reservations: set[tuple[str, str]] = set()
        self._heartbeat = time.monotonic()
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._wedged_logged = False
        self._deaf = False
        self._thread: threading.Thread | None = None
        self.ticks = 0

    # ------------------------------------------------------------ registry (any thread)

    def track(self, lease: Lease, asked_at: float) -> None:
        """Start renewing a lease this node just won by an acquire sent at `asked_at`
        (`time.monotonic()`)."""
        with self._lock:
            self._leases[lease.session_id] = lease
            self._renewed_at[lease.session_id] = asked_at

    def untrack(self, session_id: str) -> None:
        """Stop renewing (the node gave the session up)."""
        with self._lock:
            self._leases.pop(session_id, None)
            self._renewed_at.pop(session_id, None)

    def holds(self, session_id: str, token: int) -> bool:
        """Whether the node still holds the session under `token` (False at once after a loss)."""
        with self._lock:
            lease = self._leases.get(session_id)
            return lease is not None and lease.token == token

    def lease(self, session_id: str) -> Lease | None:
        """The lease this node holds on the session, as last renewed (None: not held)."""
        with self._lock:
            return self._leases.get(session_id)

    def renewed(self, lease: Lease, sent_at: float) -> None:
        """A renewal of `lease` sent at `sent_at` (`time.monotonic()`) outside the renewal
        thread succeeded: the lease is sure for a TTL from then."""
        with self._lock:
            current = self._leases.get(lease.session_id)
            if current is None or current.token != lease.token:
                return
            self._leases[lease.session_id] = lease
            at = self._renewed_at.get(lease.session_id, sent_at)
            self._renewed_at[lease.session_id] = max(at, sent_at)

    def surely_holds(self, session_id: str, token: int) -> bool:
        """Whether the node holds the session under `token` and that lease cannot have run out:
        less than a lease TTL has passed since the acquire or renewal that last extended it was
        sent. A node paused or cut off past its lease learns here, before its next renewal
        fails, that another node may hold the session by now."""
        with self._lock:
            lease = self._leases.get(session_id)
            if lease is None or lease.token != token:
                return False
            since = time.monotonic() - self._renewed_at.get(session_id, -float("inf"))
            return since < self._lease_ttl

    def own(self, session_id: str, key: str) -> None:
        """Touch this reservation on every tick from now on."""
        with self._lock:
            self._reservations.add((session_id, key))

    def disown(self, session_id: str, key: str) -> None:
        with self._lock:
            self._reservations.discard((session_id, key))

    def owned(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._reservations)

    def beat(self) -> None:
        """The node's main loop is alive (called from a task on that loop)."""
        if not self._deaf:
            self._heartbeat = time.monotonic()

    def ignore_heartbeats(self) -> None:
        """Act as if the main loop stopped ticking (tests simulate a wedged node with this)."""
        self._deaf = True

    def pause(self) -> None:
        """Freeze renewals (tests use this to simulate a node paused past its lease)."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    # ------------------------------------------------------------ thread

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"stickless-renewal-{self._node_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (bounded)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_log_without_traceback)
        try:
            while not self._stop.wait(self._interval):
                if self._paused.is_set():
                    continue
                try:
                    loop.run_until_complete(self.tick())
                except Exception as exc:
                    # No traceback formatting on this thread: CPython 3.11 builds ASTs for
                    # traceback carets, and concurrent AST construction across threads can
                    # crash the interpreter's recursion bookkeeping (cpython#106905).
                    log.warning("renewal tick failed on %s: %r", self._node_id, exc)
        finally:
            loop.run_until_complete(self._close_backends())
            loop.close()

    async def _close_backends(self) -> None:
        try:
            await self._backends.aclose()
        except Exception as exc:
            log.warning("closing the renewal connections failed: %r", exc)

    async def tick(self) -> None:
        """Renew every lease and touch every owned reservation (one round trip per role)."""
        silent_for = time.monotonic() - self._heartbeat
        if silent_for > self._watchdog_timeout:
            if not self._wedged_logged:
                log.error(
                    "node %s main loop silent for %.1fs: renewals stopped (watchdog)",
                    self._node_id,
                    silent_for,
                )
                self._wedged_logged = True
            return
        self._wedged_logged = False
        with self._lock:
            leases = list(self._leases.values())
            refs = [ReservationRef(s, k, self._node_id) for s, k in self._reservations]
        if leases:
            await self._renew(leases)
        if refs:
            try:
                await self._backends.idempotency.touch_many(refs, self._secondary_ttl)
            except Exception as exc:
                log.warning("reservation touch failed on %s: %s", self._node_id, exc)
        self.ticks += 1

    async def _renew(self, leases: list[Lease]) -> None:
        now = time.monotonic()
        try:
            renewed = await self._backends.leases.renew_many(leases, self._lease_ttl)
        except Exception as exc:
            log.warning("lease renewal failed on %s: %s", self._node_id, exc)
            # Past a whole TTL without a successful renewal the lease is surely gone.
            lost = [
                lease
                for lease in leases
                if now - self._renewed_at.get(lease.session_id, now) > self._lease_ttl
            ]
        else:
            lost = []
            with self._lock:
                for old, new in zip(leases, renewed, strict=True):
                    current = self._leases.get(old.session_id)
                    if current is None or current.token != old.token:
                        continue  # given up or re-won meanwhile
                    if new is None:
                        lost.append(old)
                    else:
                        self._leases[old.session_id] = new
                        self._renewed_at[old.session_id] = now
        for lease in lost:
            with self._lock:
                current = self._leases.get(lease.session_id)
                if current is None or current.token != lease.token:
                    continue
                del self._leases[lease.session_id]
                self._renewed_at.pop(lease.session_id, None)
            self._on_lost(lease.session_id, lease.token)


def _log_without_traceback(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """Event-loop errors on the renewal thread, logged without formatting a traceback."""
    log.warning("renewal loop: %s (%r)", context.get("message"), context.get("exception"))
