"""The wave storm: a seeded workload of submits, key reuse, priorities, conflicting inputs,
interrupts, releases, node crashes (and store restarts), in waves, over any cluster.

Each wave submits a batch of requests through random live nodes at once; a crash, when one is
due, is placed at a random point among them, right after a probe turn was caught running on the
victim. Requests name their session and tag (`records.request_text`), keys repeat across
sessions (they are scoped per session), and every answer is awaited with a bound. The cluster
plugs in through a `WaveCluster`.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from stickless import Priority, TurnResult

from .records import Call, Control, History, Kill, request_text


@dataclass(frozen=True)
class WavePlan:
    """Sizes and odds of a wave storm."""

    sessions: int
    waves: int
    #: Requests per wave (a uniform pick between both).
    batch: tuple[int, int]
    #: Waves during which the node running a probe turn is crashed (then replaced).
    kill_waves: tuple[int, ...]
    #: How long a caller waits for its answer before it counts as hung.
    answer_within: float
    #: The wave before which one more node joins.
    grow_wave: int | None = None
    #: The wave during which the store restarts.
    restart_wave: int | None = None
    #: Every this many waves (at its last), a DONE key is reused with a different input.
    conflict_every: int = 5
    #: Share of "long" requests (None: no such draw at all).
    long_share: float | None = None
    #: How many interrupts a wave sends (a uniform pick among these).
    control_counts: tuple[int, ...] = (0, 1, 2, 3)
    #: A targeted interrupt names one of the session's last this many turns.
    interrupt_window: int = 4
    #: Odds that a wave also releases a session.
    release_share: float = 0.6
    #: Pause between waves (a uniform pick between both; pacing, not a synchronisation).
    pacing: tuple[float, float] = (0.02, 0.15)
    #: Attempts at catching a probe turn running before a crash wave gives up.
    probe_tries: int = 3
    #: Tag prefix of probe requests.
    probe_prefix: str = "u"

    def session_ids(self) -> list[str]:
        return [f"s{n:02d}" for n in range(self.sessions)]


class WaveCluster(Protocol):
    """What a wave storm needs of a cluster (nodes are handles with a `node_id`)."""

    #: The spec of a probe request's input: the agent keeps such a turn running.
    def probe_spec(self, tag: str) -> str: ...

    def alive(self) -> list[Any]: ...

    #: Now, on the executions' clock (see `records.Execution.start`).
    def clock(self) -> float: ...

    #: Submit `call` through `call.node`; set its ticket, turn_id and kind, or raise.
    async def submit(self, call: Call) -> None: ...

    #: The answer of an accepted call.
    def answer(self, call: Call) -> Awaitable[TurnResult]: ...

    async def interrupt(self, node: Any, session_id: str, turn_id: str | None) -> None: ...

    async def release(self, node: Any, session_id: str) -> None: ...

    #: The node running the probe's turn, once it runs (None when it will not).
    async def runner_of(self, call: Call) -> Any | None: ...

    #: Crash `victim` (`calls`: every call so far).
    async def kill(self, victim: Any, calls: list[Call]) -> Kill: ...

    #: After the crash wave: finish the kill's record, let the probe go.
    async def after_kill(self, kill: Kill, probes: list[Call]) -> None:
        """After a crash: `probes` are every probe placed so far (the last one the victim's)."""
        ...

    async def add_node(self) -> Any: ...

    async def restart(self) -> None: ...


class WaveStorm:
    """The seeded workload over a `WaveCluster`, and its `history`."""

    def __init__(self, seed: int, plan: WavePlan, cluster: WaveCluster) -> None:
        self.seed = seed
        self.plan = plan
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.history = History(seed, plan.session_ids())
        self.waiters: list[asyncio.Task[None]] = []
        self.background: list[asyncio.Task[None]] = []
        #: Clear while the store restarts; how many restarts began, and how many are going on.
        self.store_up = asyncio.Event()
        self.store_up.set()
        self._restarts_begun = 0
        self._restarting = 0
        #: Known keys per session, with the input they were first used with.
        self.keys: dict[str, dict[str, str]] = defaultdict(dict)
        self._unique: Iterator[int] = itertools.count(1)

    @property
    def calls(self) -> list[Call]:
        return self.history.calls

    def session(self) -> str:
        return f"s{self.rng.randrange(self.plan.sessions):02d}"

    # ------------------------------------------------------------ requests

    def next_request(self, session_id: str) -> tuple[str, str | None, str]:
        """(text, key, tag) of a same-input reuse of a known key, a new key, or a keyless one."""
        rng = self.rng
        share = self.plan.long_share
        spec = "long" if share is not None and rng.random() < share else ""
        roll = rng.random()
        known = self.keys[session_id]
        if roll < 0.3 and known:
            key = rng.choice(sorted(known))
            return known[key], key, key
        if roll < 0.65:
            # Key names repeat across sessions on purpose: keys are scoped per session.
            key = f"k{len(known)}"
            known[key] = request_text(session_id, key, spec)
            return known[key], key, key
        tag = f"u{next(self._unique)}"
        return request_text(session_id, tag, spec), None, tag

    def conflicting_request(self) -> tuple[str, str, str] | None:
        """A key that some caller already saw succeed (so DONE), with a different input."""
        done = sorted(
            {(c.session_id, c.key) for c in self.calls if c.key and c.ok and not c.conflict}
        )
        if not done:
            return None
        session_id, key = self.rng.choice(done)
        return session_id, key, request_text(session_id, key, f"conflict{next(self._unique)}")

    def new_call(
        self,
        session_id: str,
        node: Any,
        text: str,
        key: str | None,
        tag: str,
        priority: Priority | None = None,
        **flags: bool,
    ) -> Call:
        if priority is None:
            priority = self.rng.choice((Priority.NOW, Priority.NEXT, Priority.NEXT, Priority.LATER))
        call = Call(len(self.calls), session_id, node, tag, text, key, priority, **flags)
        self.calls.append(call)
        return call

    async def place(self, call: Call) -> asyncio.Task[None] | None:
        """Submit; on success start (and return) the task that waits (bounded) for the
        answer."""
        call.sent = time.monotonic()
        try:
            await self.cluster.submit(call)
        except Exception as exc:
            call.refused = exc
            call.done = time.monotonic()
            call.answered_at = self.cluster.clock()
            return None
        waiter = asyncio.ensure_future(self.await_answer(call))
        self.waiters.append(waiter)
        return waiter

    async def aimed(self, targets: list[tuple[str, Any]]) -> list[Call]:
        """Submit a keyless NEXT request to each (session, node) at once, outside the waves (a
        fault wave aims them); return once every caller has its answer (or gave up waiting)."""
        calls = []
        for session_id, node in targets:
            tag = f"u{next(self._unique)}"
            text = request_text(session_id, tag)
            calls.append(self.new_call(session_id, node, text, None, tag, Priority.NEXT))
        waiters = await asyncio.gather(*(self.place(call) for call in calls))
        await asyncio.gather(*(waiter for waiter in waiters if waiter is not None))
        return calls

    async def await_answer(self, call: Call) -> None:
        try:
            call.result = await asyncio.wait_for(self.cluster.answer(call), self.plan.answer_within)
        except TimeoutError:
            call.hung = True
        except Exception as exc:
            call.error = exc
        call.done = time.monotonic()
        call.answered_at = self.cluster.clock()

    # ------------------------------------------------------------ controls

    async def control(self, entry: Control, action: Awaitable[None]) -> None:
        entry.sent, entry.sent_at = time.monotonic(), self.cluster.clock()
        try:
            await action
        except Exception as exc:
            entry.error = exc
        entry.done, entry.done_at = time.monotonic(), self.cluster.clock()

    def random_controls(self) -> None:
        rng, plan, cluster = self.rng, self.plan, self.cluster
        alive = cluster.alive()
        for _ in range(rng.choice(plan.control_counts)):
            node = rng.choice(alive)
            session_id = self.session()
            turn_id: str | None = None
            if rng.random() >= 0.5:
                turns = [c.turn_id for c in self.calls if c.session_id == session_id and c.turn_id]
                if not turns:
                    continue
                turn_id = rng.choice(turns[-plan.interrupt_window :])
            entry = Control("interrupt_turn" if turn_id else "interrupt", node, session_id)
            self.start(entry, cluster.interrupt(node, session_id, turn_id))
        if rng.random() < plan.release_share:
            node = rng.choice(alive)
            entry = Control("release", node, self.session())
            self.start(entry, cluster.release(node, entry.session_id))

    def start(self, entry: Control, action: Awaitable[None]) -> None:
        self.history.controls.append(entry)
        self.background.append(asyncio.ensure_future(self.control(entry, action)))

    # ------------------------------------------------------------ crashes and restarts

    async def running_probe(self) -> tuple[Call, Any]:
        """Submit a probe turn and return it with the node running it, once it runs (a probe
        refused while the store restarts does not count as a try: the next one waits for the
        store to be back)."""
        tries = 0
        while tries < self.plan.probe_tries:
            await self.store_up.wait()
            restarts = self._restarts_begun
            session_id = self.session()
            tag = f"{self.plan.probe_prefix}{next(self._unique)}"
            node = self.rng.choice(self.cluster.alive())
            # (NEXT: a NOW probe could be taken into a running turn instead of running itself)
            text = request_text(session_id, tag, self.cluster.probe_spec(tag))
            call = self.new_call(session_id, node, text, None, tag, Priority.NEXT, probe=True)
            await self.place(call)
            restarted = restarts != self._restarts_begun or not self.store_up.is_set()
            if call.refused is not None and restarted:
                continue
            tries += 1
            if call.refused is not None:
                continue
            runner = await self.cluster.runner_of(call)
            if runner is not None:
                return call, runner
        raise AssertionError(f"seed {self.seed}: no turn could be caught running")

    async def crash(self, victim: Any) -> None:
        self.history.kills.append(await self.cluster.kill(victim, self.calls))

    async def restart(self) -> None:
        began = time.monotonic()
        self._restarts_begun += 1
        self._restarting += 1
        self.store_up.clear()
        try:
            await self.cluster.restart()
        finally:
            self._restarting -= 1
            if not self._restarting:
                self.store_up.set()
        self.history.restarts.append((began, time.monotonic()))

    # ------------------------------------------------------------ the run

    async def run(self) -> History:
        rng, plan, cluster = self.rng, self.plan, self.cluster
        for wave in range(plan.waves):
            if wave == plan.grow_wave:
                await cluster.add_node()
            probe: tuple[Call, Any] | None = None
            if wave in plan.kill_waves:
                probe = await self.running_probe()
            alive = cluster.alive()
            batch: list[Call] = []
            for _ in range(rng.randint(*plan.batch)):
                session_id = self.session()
                text, key, tag = self.next_request(session_id)
                batch.append(self.new_call(session_id, rng.choice(alive), text, key, tag))
            conflict_wave = wave % plan.conflict_every == plan.conflict_every - 1
            if conflict_wave and (conflict := self.conflicting_request()) is not None:
                session_id, key, text = conflict
                batch.append(
                    self.new_call(session_id, rng.choice(alive), text, key, key, conflict=True)
                )
            self.random_controls()
            # Submits of one wave contend with each other (and with a crash or a restart, when
            # one is due, placed at a random point among them).
            steps: list[Awaitable[Any]] = [self.place(call) for call in batch]
            if probe is not None:
                steps.insert(rng.randrange(len(steps) + 1), self.crash(probe[1]))
            if wave == plan.restart_wave:
                steps.insert(rng.randrange(len(steps) + 1), self.restart())
            await asyncio.gather(*steps)
            if probe is not None:
                await cluster.after_kill(self.history.kills[-1], [c for c in self.calls if c.probe])
                await cluster.add_node()
            await asyncio.sleep(rng.uniform(*plan.pacing))
        await asyncio.gather(*self.background)
        await asyncio.gather(*self.waiters)
        return self.history
