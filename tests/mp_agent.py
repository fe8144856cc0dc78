"""The agent of the node processes in the multi-process tests (`tests.mp_agent:make_opener`).

It echoes its input with two TextDelta frames, stages a user and an assistant transcript entry,
honours `turn.interrupted`, and logs the start and the end of every turn into Redis (the server
named by `STICKLESS_TEST_REDIS`), stamped with the Redis server's clock, so a test can check from
outside which turns ran where and whether two turns of a session ever overlapped.

An input is ``"<session>|<tag>|<spec>"`` (a plain input is all spec). The spec says how the turn
works:

- ``""``: a few small awaits;
- ``"long"``: waits up to LONG_TURN seconds unless interrupted;
- ``"gate:<name>"``: waits (polling every 20 ms) until the key ``mp:gate:<name>`` exists, or the
  turn is interrupted; tests hold a turn mid-flight from outside with it;
- ``"wedge:<name>"``: blocks the whole event loop (time.sleep in a poll of that key) until the key
  exists, at most WEDGE_LIMIT seconds: a wedged node that resumes when the test says so;
- ``"block:<seconds>"``: blocks the event loop with time.sleep for that long;
- ``"fail:<n>"``: raises RuntimeError on attempts 1..n (a retry policy runs it again);
- ``"terminal"``: raises TerminalError (never retried).

Log entries are list items of ``mp:log:<session>``: ``"<ev>|<turn>|<node>|<how>|<stamp>|<text>"``
with ev ``start`` or ``end``, how ``-`` at the start and ``ok`` (returned with staged entries),
``interrupted``, ``error`` or ``cancelled`` at the end, and stamp the server's ``sec.usec``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio

from stickless import (
    LiveSession,
    TerminalError,
    TextDelta,
    TranscriptEntry,
    TurnContext,
    TurnOutput,
    UserInput,
)

#: Environment variables the test harness sets for every node process.
ENV_REDIS = "STICKLESS_TEST_REDIS"
ENV_NODE = "STICKLESS_TEST_NODE"
#: How long a "long" turn works unless interrupted.
LONG_TURN = 0.4
#: Upper bound of a wedge (so a forgotten gate cannot hang a node forever).
WEDGE_LIMIT = 60.0
#: How long a log write keeps retrying while Redis is unreachable (a restart).
LOG_RETRY_FOR = 20.0
#: Poll period of gates and wedges.
POLL = 0.02

#: Appends "<prefix>|<stamp>|<text>" to the list once per write id (a write retried after its
#: reply was lost in a server restart is not logged twice); returns the stamp. The stamp is the
#: agent's wall clock when it asked for the write (the server's clock, on this one machine): a
#: process stopped before its write reached the server would otherwise log its start late, as if
#: it began after what ran meanwhile on other nodes.
_LOG_SCRIPT = """
if redis.call('SADD', KEYS[2], ARGV[3]) == 0 then
  return false
end
redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. ARGV[4] .. '|' .. ARGV[2])
return ARGV[4]
"""


def log_key(session_id: str) -> str:
    return f"mp:log:{session_id}"


def _written_key(session_id: str) -> str:
    return f"mp:logged:{session_id}"


def gate_key(name: str) -> str:
    return f"mp:gate:{name}"


def spec_of(text: str) -> str:
    """The spec part of an input (everything after the second '|', or the whole text)."""
    parts = text.split("|", 2)
    return parts[2] if len(parts) == 3 else text


class TurnLog:
    """Writes turn start/end entries (async client; a sync one when the turn is cancelled)."""

    def __init__(self, url: str, node_id: str) -> None:
        self.url = url
        self.node_id = node_id
        self._client: redis.asyncio.Redis | None = None
        self._sync: redis.Redis | None = None

    @property
    def client(self) -> redis.asyncio.Redis:
        if self._client is None:
            self._client = redis.asyncio.Redis.from_url(self.url, socket_timeout=2.0)
        return self._client

    @property
    def sync(self) -> redis.Redis:
        if self._sync is None:
            self._sync = redis.Redis.from_url(self.url, socket_timeout=2.0)
        return self._sync

    def _args(
        self, ev: str, run: str, turn: TurnContext, how: str, text: str
    ) -> tuple[str, list[str], list[str]]:
        prefix = f"{ev}|{turn.turn_id}|{self.node_id}|{how}"
        keys = [log_key(turn.session_id), _written_key(turn.session_id)]
        return _LOG_SCRIPT, keys, [prefix, text, f"{ev}|{run}", f"{time.time():.6f}"]

    async def write(self, ev: str, run: str, turn: TurnContext, how: str, text: str) -> None:
        """Append one entry of the agent run `run`, retrying while Redis is unreachable."""
        script, keys, args = self._args(ev, run, turn, how, text)
        deadline = time.monotonic() + LOG_RETRY_FOR
        while True:
            try:
                await self.client.eval(script, len(keys), *keys, *args)
                return
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(POLL)

    def write_now(self, ev: str, run: str, turn: TurnContext, how: str, text: str) -> None:
        """Append one entry synchronously (used when the turn task is being cancelled)."""
        script, keys, args = self._args(ev, run, turn, how, text)
        with contextlib.suppress(redis.RedisError, OSError):
            self.sync.eval(script, len(keys), *keys, *args)

    def gate_open(self, name: str) -> bool:
        return bool(self.sync.exists(gate_key(name)))


class EchoSession:
    """One live session of the multi-process agent."""

    def __init__(self, log: TurnLog, session_id: str) -> None:
        self.log = log
        self.session_id = session_id

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        text = turn.input.as_text()
        run = uuid.uuid4().hex  # this call of run_turn (a second run of one turn gets another)
        await self.log.write("start", run, turn, "-", text)
        how = "cancelled"
        try:
            turn.emit(TextDelta(text="echo "))
            await self._work(turn, spec_of(text))
            if turn.interrupted.is_set():
                how = "interrupted"
                return TurnOutput(text="interrupted")
            turn.emit(TextDelta(text=text))
            await turn.transcript.append(
                TranscriptEntry(role="user", content=text),
                TranscriptEntry(role="assistant", content=f"echo:{text}"),
            )
            how = "ok"
            return TurnOutput(text=f"echo:{text}", data={"node": self.log.node_id})
        except asyncio.CancelledError:
            self.log.write_now("end", run, turn, "cancelled", text)
            how = ""
            raise
        except Exception:
            how = "error"
            raise
        finally:
            if how:
                await self.log.write("end", run, turn, how, text)

    async def _work(self, turn: TurnContext, spec: str) -> None:
        if spec.startswith("gate:"):
            name = spec.removeprefix("gate:")
            client = self.log.client
            while not turn.interrupted.is_set():
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, OSError):
                    if await client.exists(gate_key(name)):
                        return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(turn.interrupted.wait(), POLL)
        elif spec.startswith("wedge:"):
            name = spec.removeprefix("wedge:")
            until = time.monotonic() + WEDGE_LIMIT
            # Deliberately blocks the node's event loop (a wedged node) until the gate opens.
            while time.monotonic() < until:
                with contextlib.suppress(redis.RedisError, OSError):
                    if self.log.gate_open(name):
                        return
                time.sleep(POLL)  # noqa: ASYNC251
        elif spec.startswith("fail:"):
            if turn.attempt <= int(spec.removeprefix("fail:")):
                raise RuntimeError(f"flaky attempt {turn.attempt}")
        elif spec == "terminal":
            raise TerminalError("no retry can fix this")
        elif spec.startswith("block:"):
            time.sleep(float(spec.removeprefix("block:")))  # noqa: ASYNC251
        elif spec == "long":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(turn.interrupted.wait(), LONG_TURN)
        else:
            for _ in range(1 + len(spec) % 3):
                await asyncio.sleep(0.001)

    async def inject(self, item: UserInput) -> bool:
        """Refuses: a NOW message arriving mid-turn waits in the mailbox for the next turn."""
        return False

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


class EchoOpener:
    """Opens EchoSessions; every session of the process shares one TurnLog."""

    def __init__(self, log: TurnLog) -> None:
        self.log = log

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return EchoSession(self.log, session_id)


def make_opener() -> EchoOpener:
    """The opener factory `stickless node --opener tests.mp_agent:make_opener` calls."""
    url = os.environ[ENV_REDIS]
    node_id = os.environ.get(ENV_NODE, f"pid-{os.getpid()}")
    return EchoOpener(TurnLog(url, node_id))
