"""The randomized fault storm's adapter: node processes, each behind a `FaultProxy` of its own,
and a seeded driver that fires faults on one node's path to Redis while the wave storm runs.

`ProxyPool.open` is the `MpCluster(node_url=...)` hook: every node process (replacements too)
gets a new proxy in front of the one redis-server, so a cut, a held reply or a stall hits that
node's path only. The agent's turn log and the checker read Redis directly, never through a
proxy.

`FaultDriver` runs beside `WaveStorm.run`: after every `FaultPlan.every` submits (a seeded
uniform pick) it fires one fault, drawn by `FaultPlan.weights`, at a random live node:

- ``cut:<script>``: the node's next run of that stickless script runs, its reply is lost and
  the connection reset (`cut_after`);
- ``hold``: the reply of the node's next run of a listed script (or of its next command) is
  held for `hold` seconds (a few hundred ms to about twice the lease TTL);
- ``stall``: the node's whole path (every connection, both directions) is held `stall` seconds
  (past its lease);
- ``reset``: every connection of the node's path is reset (`reset_all`);
- ``pubsub_cut`` / ``command_cut``: only the node's pub/sub connection is reset (commands go
  on: what it publishes meanwhile is missed, its open streams catch up from the event log), or
  only its command connections (pub/sub goes on);
- ``sigstop``: the node process is SIGSTOPped for `stop` seconds, then SIGCONTed;
- ``sigkill``: the node process is SIGKILLed (recorded as a crash) and a new one started;
- ``redis_restart``: the redis-server restarts (append-only, same port) like the wave storm's.

A fault armed on a script may never fire (the node never ran it again, or died first): the
driver reports what it armed and what fired, by kind. Into the history it writes the sessions
whose inbox_take reply a cut dropped (`History.collect_failures`) and every span during which a
fault kept a node from renewing its leases (`History.outages`: a stop, a stall, a held reply of
a renewal), which is what the checker needs to tell the overlap the README allows.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from stickless import BackendUnavailableError

from ..faults import Fault, FaultProxy, HoldReply
from ..mp_cluster import MpCluster, NodeProcess
from ..redis_fixture import RedisServer
from .nodes import NodeWaves
from .records import Call, Control, History, Outage
from .waves import WaveStorm

#: The stickless scripts whose reply a `cut` may drop (see stickless/backends/redis/lua/).
#: inbox_take is the one whose lost reply used to lose the batch it took (LOST_COLLECT_BUG, fixed).
CUT_SCRIPTS = (
    "inbox_deliver",
    "turn_finish",
    "idem_put",
    "idem_acquire",
    "idem_reset",
    "lease_acquire",
    "live_renew",
    "inbox_take",
    "inbox_ack",
    "idem_park",
    "idem_requeue",
    "events_relay",
)
#: Faults that reset only some of a node's connections (`FaultProxy.reset_connections`).
CONNECTION_CUTS = {"pubsub_cut": True, "command_cut": False}
#: The script of a node's liveness renewals (`LeaseRenewer.tick`): holding its reply keeps the
#: node's incarnation, so its leases and reservations, from being renewed.
RENEWALS = ("live_renew",)
#: The connection name of a node's command pool (`RedisBackends.from_url`): a command-path
#: stall holds these connections only, not its renewer's nor its pub/sub connection.
COMMAND_POOL = "stickless:commands"


@dataclass(frozen=True)
class FaultPlan:
    """Odds and sizes of the faults of a storm."""

    #: Submits between two faults (a uniform pick between both).
    every: tuple[int, int]
    #: Relative odds of each fault kind ("cut" stands for one of `cut_scripts`).
    weights: dict[str, float]
    #: Scripts a cut may hit.
    cut_scripts: tuple[str, ...]
    #: Seconds a held reply, a stalled path and a stopped process are held (uniform picks).
    hold: tuple[float, float]
    stall: tuple[float, float]
    stop: tuple[float, float]
    #: Most node processes stopped at once (a cluster of 3 keeps 2 going).
    max_stopped: int = 1


class ProxyPool:
    """A `FaultProxy` per node process, all in front of one redis-server."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.proxies: dict[str, FaultProxy] = {}

    def open(self, node_id: str) -> str:
        """A started proxy of `node_id` (the `MpCluster(node_url=...)` hook); its URL."""
        proxy = FaultProxy("127.0.0.1", self.server.port, password=self.server.password)
        self.proxies[node_id] = proxy.start()
        return proxy.url()

    def clear(self) -> None:
        """Disarm every rule of every proxy (held bytes and replies go through)."""
        for proxy in self.proxies.values():
            proxy.clear()

    def close(self) -> list[str]:
        """Stop every proxy; the internal errors they recorded."""
        errors: list[str] = []
        for node_id, proxy in self.proxies.items():
            proxy.stop()
            errors.extend(f"{node_id}: {error}" for error in proxy.errors)
        return errors


@dataclass
class Armed:
    """One fault the driver fired or armed."""

    kind: str
    node: str
    at_submit: int
    #: When it was fired or armed, on the executions' clock (wall clock, microseconds).
    stamp: float = 0.0
    #: When it was fired or armed (time.monotonic()), and how long it holds what it holds.
    at: float = 0.0
    seconds: float = 0.0
    rule: Fault | None = None
    #: Set at once for faults that take effect when fired (reset, signals, restarts).
    took_effect: bool = False
    #: Sessions named by the keys of the commands a rule matched (a cut's evidence).
    sessions: list[str] = field(default_factory=list)
    #: When a stopped process was continued, on the executions' clock.
    until: float | None = None

    @property
    def fired(self) -> bool:
        return self.took_effect or (self.rule is not None and self.rule.count > 0)


class FaultDriver:
    """Fires the seeded faults of `plan` into a `WaveStorm` over `FaultNodes`."""

    def __init__(self, seed: int, plan: FaultPlan, nodes: FaultNodes, storm: WaveStorm) -> None:
        self.rng = random.Random(f"faults:{seed}")
        self.plan = plan
        self.nodes = nodes
        self.storm = storm
        self.armed: list[Armed] = []
        self.tasks: list[asyncio.Task[None]] = []
        #: When the proxies were cleared (what they still held went through), on the
        #: executions' clock.
        self.cleared: float | None = None
        #: Clear while the command-path stall wave runs: no other fault fires meanwhile.
        self.calm = asyncio.Event()
        self.calm.set()
        #: The calls the command-path stall wave aimed at the stalled node's sessions.
        self.aimed: list[Call] = []
        #: Whether the command-path stall wave began (its submit count was reached).
        self.stall_begun = False
        self._kinds = sorted(plan.weights)

    # ------------------------------------------------------------ the run

    async def run(self) -> None:
        """Fire faults until cancelled (when the storm's waves are over)."""
        due = 0
        while True:
            due += self.rng.randint(*self.plan.every)
            await self.nodes.submitted(due)
            await self.calm.wait()
            await self.fire(
                self.rng.choices(self._kinds, [self.plan.weights[k] for k in self._kinds])[0]
            )

    async def stop(self, running: asyncio.Task[None]) -> None:
        """Stop firing, let go of everything held (proxies, stopped processes)."""
        running.cancel()
        (ended,) = await asyncio.gather(running, return_exceptions=True)
        self.cleared = self.nodes.clock()
        self.nodes.pool.clear()
        await asyncio.gather(*self.tasks)
        if isinstance(ended, Exception):  # a fault that could not be fired stopped the driver
            raise ended

    def target(self, *, running: bool = True) -> NodeProcess:
        """A random live node process (`running`: not stopped either)."""
        alive = [n for n in self.nodes.alive() if not (running and n.stopped)]
        return self.rng.choice(alive or self.nodes.alive())

    async def fire(self, kind: str) -> None:
        plan, rng = self.plan, self.rng
        if kind == "cut":
            kind = f"cut:{rng.choice(plan.cut_scripts)}"
        node = self.target()
        entry = Armed(kind, node.node_id, self.nodes.submits, self.nodes.clock(), time.monotonic())
        self.armed.append(entry)
        proxy = self.nodes.pool.proxies[node.node_id]
        if kind.startswith("cut:"):
            script = kind.removeprefix("cut:")
            entry.rule = proxy.cut_after(script=script, match=self.witness(entry))
        elif kind == "hold":
            script = rng.choice((None, *plan.cut_scripts))
            entry.seconds = rng.uniform(*plan.hold)
            entry.rule = proxy.hold_reply(seconds=entry.seconds, script=script)
            entry.kind = f"hold:{script or 'any'}"
        elif kind == "stall":
            entry.seconds = rng.uniform(*plan.stall)
            entry.rule = proxy.stall("both", seconds=entry.seconds)
        elif kind == "reset":
            entry.took_effect = proxy.reset_all() > 0
        elif kind in CONNECTION_CUTS:
            entry.took_effect = proxy.reset_connections(subscribed=CONNECTION_CUTS[kind]) > 0
        elif kind == "sigstop":
            if sum(n.stopped for n in self.nodes.alive()) >= plan.max_stopped:
                entry.kind = "sigstop:skipped"
                return
            node.sigstop()
            entry.took_effect = True
            entry.seconds = rng.uniform(*plan.stop)
            self.tasks.append(asyncio.ensure_future(self.resume(node, entry)))
        elif kind == "sigkill":
            entry.node = (victim := self.target(running=False)).node_id
            await self.nodes.crash(victim, self.storm)
            entry.took_effect = True
        elif kind == "redis_restart":
            await self.storm.restart()
            entry.took_effect = True
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    async def command_path_stall(self, at_submit: int, seconds: float) -> None:
        """The command-path stall wave: once `at_submit` submits went out, no other fault
        fires and those in effect run out; then the command pool of the node holding the most
        sessions stalls for `seconds` while its renewals and its pub/sub connection go on (a
        gray failure: only the node's own check of its command path lets its sessions go),
        and every session it holds gets a caller on another node: those callers wait on a
        healthy node for the stalled node's sessions, which the liveness invariant bounds.
        Other faults fire again once they are answered."""
        await self.nodes.submitted(at_submit)
        self.stall_begun = True
        self.calm.clear()
        try:
            await self.quiet()
            node, held = await self.busiest()
            if not held:  # (every session is free: the node takes some first)
                await self.storm.aimed([(s, node) for s in self.storm.history.sessions[:3]])
                held = (await self.holders())[node.node_id]
            entry = Armed("command_stall", node.node_id, self.nodes.submits, self.nodes.clock())
            entry.at, entry.seconds = time.monotonic(), seconds
            self.armed.append(entry)
            proxy = self.nodes.pool.proxies[node.node_id]
            entry.rule = proxy.stall("both", seconds=seconds, client=COMMAND_POOL)
            others = [n for n in self.nodes.alive() if n is not node and not n.stopped]
            targets = [(session_id, self.rng.choice(others)) for session_id in held]
            self.aimed = await self.storm.aimed(targets)
        finally:
            self.calm.set()

    async def quiet(self) -> None:
        """Let every fault in effect run out (a stopped process is continued, a held reply or
        stall ends, after its own duration) and the store be up."""
        await asyncio.gather(*self.tasks)
        now = time.monotonic()
        ends = [
            end
            for node in self.nodes.alive()
            for start, end in self.windows(node.node_id)
            if start <= now < end
        ]
        if ends:
            # (how long the faults hold what they hold: their own durations, not a wait for
            # something to happen)
            await asyncio.sleep(max(ends) - now)
        await self.storm.store_up.wait()

    async def holders(self) -> dict[str, list[str]]:
        """The sessions each node holds the lease of, by node id."""
        held: dict[str, list[str]] = defaultdict(list)
        for session_id in self.storm.history.sessions:
            lease = await self.nodes.cluster.backends.leases.current(session_id)
            if lease is not None:
                held[lease.holder].append(session_id)
        return held

    async def busiest(self) -> tuple[NodeProcess, list[str]]:
        """The running node process that holds the most sessions' leases, and those."""
        held = await self.holders()
        running = [n for n in self.nodes.alive() if not n.stopped] or self.nodes.alive()
        node = max(running, key=lambda node: len(held[node.node_id]))
        return node, held[node.node_id]

    async def resume(self, node: NodeProcess, entry: Armed) -> None:
        # (how long the process stays stopped: the fault itself, not a synchronisation)
        await asyncio.sleep(entry.seconds)
        node.sigcont()
        entry.until = self.nodes.clock()

    def witness(self, entry: Armed) -> object:
        """A rule predicate that notes the sessions named by the keys of what it matched."""
        sessions = self.storm.history.sessions

        def match(args: Sequence[bytes]) -> bool:
            keys = b" ".join(args[3 : 3 + int(args[2])]).decode(errors="replace")
            entry.sessions = [s for s in sessions if re.search(rf"\b{s}\b", keys)]
            return True

        return match

    # ------------------------------------------------------------ the report

    def counts(self) -> tuple[Counter[str], Counter[str]]:
        """(armed, fired) by kind."""
        armed = Counter(a.kind for a in self.armed)
        fired = Counter(a.kind for a in self.armed if a.fired)
        return armed, fired

    def timeline(self) -> list[tuple[float, str]]:
        """(stamp, what) of every fault fired or armed and every time a proxy rule took
        effect, stamps on the executions' clock, in order: for a violation's report."""
        offset = time.time() - time.monotonic()
        lines = [
            (a.stamp, f"armed {a.kind} on {a.node} (submit {a.at_submit})") for a in self.armed
        ]
        for node_id, proxy in self.nodes.pool.proxies.items():
            for event in proxy.fired():
                what = f"{event.kind} {event.script or event.command or ''} {event.detail}"
                lines.append(((event.at + offset) * 1e6, f"fired on {node_id}: {what}"))
        return sorted(lines)

    def windows(self, node_id: str) -> list[tuple[float, float]]:
        """(start, end) in time.monotonic() of every fault that took effect on the node's path
        (a stall from when it was armed, a held reply from when it was held, for as long as
        they held; a cut and a reset at one instant)."""
        found: list[tuple[float, float]] = []
        for entry in self.armed:
            if entry.node != node_id or not entry.fired:
                continue
            if entry.kind.startswith(("cut:", "hold:")) and entry.rule is not None:
                found.extend((e.at, e.at + entry.seconds) for e in entry.rule.events)
            elif entry.kind in ("stall", "reset", "command_stall", *CONNECTION_CUTS):
                found.append((entry.at, entry.at + entry.seconds))
        return found

    def excused(self, error: BaseException, what: Call | Control) -> bool:
        """A store call refused (BackendUnavailableError) while a fault hit its node's path:
        what a node cut off from the store answers (`Rules.excused`)."""
        if not isinstance(error, BackendUnavailableError):
            return False
        spans = self.windows(what.node_id)
        return any(start <= what.done and end >= what.sent for start, end in spans)

    def record(self, history: History) -> None:
        """A fired cut of inbox_take: where LOST_COLLECT_BUG (fixed) would show, for the
        session its keys name (the checker lists that session's losses as known-bug hits).
        Every span during which a node could not renew its leases is an `Outage` (call it once
        the storm's kills are recorded and the driver has stopped)."""
        for entry in self.armed:
            if entry.kind == "cut:inbox_take" and entry.fired:
                for session_id in entry.sessions:
                    history.collect_failures[session_id] += 1
        history.outages.extend(self.outages(history))

    def outages(self, history: History) -> list[Outage]:
        """Spans, on the executions' clock, during which a fault kept a node from renewing its
        leases: a stopped process (until SIGCONT, or its crash), a stalled path, a held reply
        of a renewal (`RENEWALS`; a held reply of anything else keeps one connection waiting,
        not the lease). Each ends when what it held went through (at the latest when the
        driver cleared the proxies or the node crashed; a held reply never delivered, at the
        latest when the node's connections were reset)."""
        offset = time.time() - time.monotonic()
        crashes = {kill.node: kill.stamp for kill in history.kills}
        cleared = self.cleared if self.cleared is not None else float("inf")
        resets = [(a.node, a.stamp) for a in self.armed if a.kind == "reset" and a.took_effect]
        found: list[Outage] = []

        def add(node: str, what: str, start: float, end: float) -> None:
            end = min(end, cleared, crashes.get(node, end))
            found.append(Outage(node, what, start, end, (end - start) / 1e6))

        for entry in self.armed:
            if not entry.fired:
                continue
            if entry.kind == "sigstop":
                add(entry.node, entry.kind, entry.stamp, entry.until or cleared)
            elif entry.kind in ("stall", "command_stall"):
                add(entry.node, entry.kind, entry.stamp, entry.stamp + entry.seconds * 1e6)
            elif entry.kind.startswith("hold:") and isinstance(entry.rule, HoldReply):
                delivered = entry.rule.delivered_at
                for index, event in enumerate(entry.rule.events):
                    if event.script not in RENEWALS:
                        continue
                    start = (event.at + offset) * 1e6
                    if index < len(delivered):
                        end = (delivered[index] + offset) * 1e6
                    else:  # (its connection was reset, or the node died, while it was held)
                        reset = [at for node, at in resets if node == entry.node and at >= start]
                        end = min([start + entry.seconds * 1e6, *reset])
                    add(entry.node, f"hold:{event.script}", start, end)
        return found


class FaultNodes(NodeWaves):
    """Node processes behind proxies of a `ProxyPool`, counting submits for the driver."""

    def __init__(
        self, cluster: MpCluster, server: RedisServer, sessions: list[str], pool: ProxyPool
    ) -> None:
        super().__init__(cluster, server, sessions)
        self.pool = pool
        self.submits = 0
        self.node_kills = 0
        self._progress = asyncio.Condition()
        self._restarting = asyncio.Lock()
        #: Node processes whose client is connected (a replacement the driver starts mid-wave
        #: joins once it is up, not while it starts).
        self._ready = {node.node_id for node in cluster.nodes}

    def alive(self) -> list[NodeProcess]:
        return [node for node in self.cluster.alive if node.node_id in self._ready]

    async def add_node(self) -> NodeProcess:
        node = await super().add_node()
        self._ready.add(node.node_id)
        return node

    async def submitted(self, count: int) -> None:
        """Wait until `count` submits went out."""
        async with self._progress:
            await self._progress.wait_for(lambda: self.submits >= count)

    async def submit(self, call: Call) -> None:
        async with self._progress:
            self.submits += 1
            self._progress.notify_all()
        await super().submit(call)

    async def crash(self, victim: NodeProcess, storm: WaveStorm) -> None:
        """A crash outside the storm's kill waves: SIGKILL, record, start a replacement."""
        await storm.crash(victim)
        kill = storm.history.kills[-1]
        kill.mid_turn = bool(await self.unfinished_on(kill.node))
        self.node_kills += 1
        await self.add_node()

    async def restart(self) -> None:
        async with self._restarting:
            await super().restart()
