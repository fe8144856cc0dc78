"""Node liveness on its own thread, event loop and backend connections (see "Node liveness"
in docs/architecture.md).

A node's leases and held reservations live as long as its incarnation's liveness key, so one
tick renews that one key, however many sessions the node holds. A renewal that waits behind a
busy turn is indistinguishable from a dead node, so the renewer never shares the node's event
loop. A watchdog stops renewing when the node's main loop has not ticked for
`watchdog_timeout`, so a wedged node lets its sessions go. Nor does the renewer vouch for a node
whose own command path is broken: when the store calls the main loop sends over its own
connections (`probing` / `answered`) go unanswered for `path_timeout` while that loop runs, the
node drops every lease at once and stops renewing until one is answered again. When the
incarnation is found dead (expired, retired, replaced), every lease it held is lost at once and
a new incarnation is registered: a lease won under the old one is never taken for the new
one's (`epoch`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

from .._logs import bind, get_logger
from ..backends.base import Backends, Lease

log = get_logger("stickless.renewal")

#: How long (pauses x seconds) a revive waits for a registration the renewer thread has under way.
_REVIVE_WAITS = 50
_REVIVE_PAUSE = 0.02

#: Called on the renewer thread for each lost lease; must not block (it only schedules work).
LostCallback = Callable[[str, int], None]


class LeaseRenewer:
    """Keeps a node's incarnation alive from a dedicated thread, and knows its leases."""

    def __init__(
        self,
        backends: Backends,
        node_id: str,
        *,
        lease_ttl: float,
        interval: float,
        index_ttl: float,
        watchdog_timeout: float,
        path_timeout: float,
        on_lost: LostCallback,
    ) -> None:
        self._backends = backends
        self._node_id = node_id
        self._lease_ttl = lease_ttl
        self._interval = interval
        self._index_ttl = index_ttl
        self._watchdog_timeout = watchdog_timeout
        self._path_timeout = path_timeout
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        #: The live incarnation ("" until registered) and how many it replaced.
        self._incarnation = ""
        self._epoch = 0
        self._registering = False
        #: When (`time.monotonic()`) the registration or renewal that last extended the
        #: incarnation was sent.
        self._beat_sent = -float("inf")
        self._heartbeat = time.monotonic()
        #: When the main loop beat again after a silence (a blocked loop answers nothing).
        self._loop_resumed = -float("inf")
        #: Since when the main loop's store calls over its own connections went unanswered
        #: (None: the last one was answered), and whether the node stopped vouching for it.
        self._unanswered_since: float | None = None
        self._cut_off = False
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._wedged_logged = False
        self._deaf = False
        self._retire_on_stop = False
        self._thread: threading.Thread | None = None
        self.ticks = 0

    # ------------------------------------------------------------ registry (any thread)

    @property
    def epoch(self) -> int:
        """The number of the live incarnation; read it before an acquire, pass it to `track`."""
        with self._lock:
            return self._epoch

    @property
    def incarnation(self) -> str:
        """The live incarnation ("" until the first registration)."""
        with self._lock:
            return self._incarnation

    def track(self, lease: Lease, epoch: int) -> bool:
        """Know a lease this node just won by an acquire sent under incarnation `epoch`; False
        (not tracked) when that incarnation was replaced meanwhile: the lease is dead."""
        with self._lock:
            if epoch != self._epoch:
                return False
            self._leases[lease.session_id] = lease
            return True

    def untrack(self, session_id: str) -> None:
        """Forget a lease (the node gave the session up)."""
        with self._lock:
            self._leases.pop(session_id, None)

    def holds(self, session_id: str, token: int) -> bool:
        """Whether the node still holds the session under `token` (False at once after a loss)."""
        with self._lock:
            lease = self._leases.get(session_id)
            return lease is not None and lease.token == token

    def lease(self, session_id: str) -> Lease | None:
        """The lease this node holds on the session (None: not held)."""
        with self._lock:
            return self._leases.get(session_id)

    def surely_holds(self, session_id: str, token: int) -> bool:
        """Whether the node holds the session under `token` and its incarnation cannot have run
        out: less than a lease TTL has passed since the registration or renewal that last
        extended it was sent. A node paused or cut off past its liveness learns here, before
        its next renewal fails, that another node may hold the session by now."""
        with self._lock:
            lease = self._leases.get(session_id)
            if lease is None or lease.token != token:
                return False
            return time.monotonic() - self._beat_sent < self._lease_ttl

    async def ensure_alive(self, backends: Backends) -> None:
        """Make sure the incarnation has a renewal interval of life left at least, before this
        node writes something held under it (a reservation): confirmed over `backends` when in
        doubt (a pause, a stall), replaced by a new incarnation when it turns out dead.

        Raises:
            BackendUnavailableError: the store could not be reached.
        """
        with self._lock:
            since = time.monotonic() - self._beat_sent
            if self._incarnation and since < self._lease_ttl - self._interval:
                return
            epoch = self._epoch
        if not await self.confirm(backends):
            await self.revive(backends, epoch)

    async def confirm(self, backends: Backends) -> bool:
        """Renew the incarnation now over `backends` (the caller's loop): True when it is alive
        (sure for a lease TTL from now), False when it is dead (the renewer thread then drops
        every lease and registers anew)."""
        with self._lock:
            incarnation = self._incarnation
        if not incarnation:
            return False
        sent = time.monotonic()
        alive = await backends.liveness.renew(
            self._node_id, incarnation, self._lease_ttl, self._index_ttl
        )
        self._answered_over(backends)
        if alive:
            with self._lock:
                if self._incarnation == incarnation:
                    self._beat_sent = max(self._beat_sent, sent)
        return alive

    async def register(self, backends: Backends, replacing: str | None = None) -> None:
        """Start a new incarnation over `backends`; every lease of the old one is lost first.
        `replacing` names the incarnation found dead: when another registration has replaced
        it already (the renewer thread and a claim both found it dead), nothing is done; so is
        a call while another registration is under way.

        Raises:
            BackendUnavailableError: the store could not be reached (the node then holds
                nothing until a later registration succeeds).
        """
        with self._lock:
            if self._registering or (
                replacing is not None and self._incarnation not in ("", replacing)
            ):
                return
            self._registering = True
        try:
            self._abandon()
            incarnation = uuid.uuid4().hex
            sent = time.monotonic()
            await backends.liveness.register(self._node_id, incarnation, self._lease_ttl)
            self._answered_over(backends)
            with self._lock:
                self._incarnation = incarnation
                self._beat_sent = sent
        finally:
            with self._lock:
                self._registering = False

    async def revive(self, backends: Backends, epoch: int) -> None:
        """The store found this node's incarnation `epoch` dead (an acquire refused with
        `NotLive`): register a new one now (or wait for the one under way), unless that
        incarnation was replaced already, instead of leaving the node unable to take anything
        until the renewer's next tick."""
        with self._lock:
            if self._epoch != epoch and self._incarnation:
                return  # replaced already
            dead = self._incarnation if self._epoch == epoch else None
        await self.register(backends, replacing=dead)
        # A registration already under way (the renewer thread's) is waited for, a little.
        for _ in range(_REVIVE_WAITS):
            with self._lock:
                if self._incarnation or not self._registering:
                    return
            await asyncio.sleep(_REVIVE_PAUSE)

    def _abandon(self) -> None:
        """The incarnation is dead (or being replaced): lose every lease it held."""
        with self._lock:
            if not self._incarnation and not self._leases:
                return
            lost = list(self._leases.values())
            self._leases.clear()
            self._incarnation = ""
            self._epoch += 1
        for lease in lost:
            self._on_lost(lease.session_id, lease.token)

    def beat(self) -> None:
        """The node's main loop is alive (called from a task on that loop)."""
        if self._deaf:
            return
        now = time.monotonic()
        if now - self._heartbeat > self._loop_gap:
            self._loop_resumed = now
        self._heartbeat = now

    # ------------------------------------------------------------ command path (main loop)

    @property
    def _loop_gap(self) -> float:
        """A silence of the main loop longer than this makes its unanswered calls no proof of a
        broken path (the loop may not have read their replies): the count starts over."""
        return self._path_timeout / 2

    def probing(self) -> None:
        """A store call over the node's own connections starts now: the command path is in
        doubt until one is answered."""
        with self._lock:
            if self._unanswered_since is None:
                self._unanswered_since = time.monotonic()

    def answered(self) -> None:
        """A store call over the node's own connections was answered: its command path works
        (a node that stopped vouching registers anew at the renewer's next tick)."""
        with self._lock:
            cut_off, self._cut_off = self._cut_off, False
            self._unanswered_since = None
        if cut_off:
            log.warning("node %s reaches the store again: it rejoins", self._node_id)

    def _answered_over(self, backends: Backends) -> None:
        """A call over `backends` was answered: proof of the command path when those are the
        main loop's connections, not the renewer's own."""
        if backends is not self._backends:
            self.answered()

    def _path_lost(self) -> bool:
        """Whether the node stopped vouching for its sessions: its own store calls went
        unanswered for `path_timeout` while its main loop ran (a silent loop is the
        watchdog's). The first time, every lease is dropped at once, as after a crash: the
        incarnation then runs out, and nothing the node commits under it can land."""
        now = time.monotonic()
        with self._lock:
            since, cut_off = self._unanswered_since, self._cut_off
        if since is None:
            return False
        if cut_off:
            return True
        if now - self._heartbeat > self._loop_gap:
            return False
        waited = now - max(since, self._loop_resumed)
        if waited <= self._path_timeout:
            return False
        with self._lock:
            if self._unanswered_since != since:
                return False  # answered meanwhile
            self._cut_off = True
        log.error(
            "node %s: its store calls got no answer for %.1fs: it stops vouching for its "
            "sessions (they are free once its liveness runs out)",
            self._node_id,
            waited,
        )
        self._abandon()
        return True

    def ignore_heartbeats(self) -> None:
        """Act as if the main loop stopped ticking (tests simulate a wedged node with this)."""
        self._deaf = True

    def pause(self) -> None:
        """Freeze renewals (tests use this to simulate a node paused past its liveness)."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    # ------------------------------------------------------------ thread

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"stickless-renewal-{self._node_id}", daemon=True
        )
        self._thread.start()

    def stop(self, retire: bool = False) -> None:
        """Stop the thread and wait for it (bounded); with `retire`, end the incarnation on the
        way out (a graceful close: what it still holds is free at once, not a TTL later)."""
        self._retire_on_stop = retire
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        bind(node_id=self._node_id)  # (a thread starts with a context of its own)
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
                    log.warning("liveness tick failed on %s: %r", self._node_id, exc)
        finally:
            if self._retire_on_stop:
                loop.run_until_complete(self._retire())
            loop.run_until_complete(self._close_backends())
            loop.close()

    async def _retire(self) -> None:
        incarnation = self.incarnation
        if not incarnation:
            return
        try:
            await self._backends.liveness.retire(self._node_id, incarnation)
        except Exception as exc:
            log.warning("retiring %s failed: %r", self._node_id, exc)

    async def _close_backends(self) -> None:
        try:
            await self._backends.aclose()
        except Exception as exc:
            log.warning("closing the renewal connections failed: %r", exc)

    async def tick(self) -> None:
        """Renew the incarnation (one store call), or register a new one when it is dead."""
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
        if self._path_lost():
            return
        if not self.incarnation:
            await self.register(self._backends)
            self.ticks += 1
            return
        renewed = self.incarnation
        sent = time.monotonic()
        try:
            alive = await self.confirm(self._backends)
        except Exception as exc:
            log.warning("liveness renewal failed on %s: %s", self._node_id, exc)
            with self._lock:
                # Past a whole TTL without a successful renewal the incarnation is surely gone.
                alive = sent - self._beat_sent <= self._lease_ttl
        if not alive and self.incarnation == renewed:
            log.warning("node %s lost its liveness: its leases are gone", self._node_id)
            await self.register(self._backends, replacing=renewed)
        self.ticks += 1


def _log_without_traceback(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """Event-loop errors on the renewal thread, logged without formatting a traceback."""
    log.warning("renewal loop: %s (%r)", context.get("message"), context.get("exception"))
