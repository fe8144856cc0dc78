"""The agents Ray router actors open in tests (importable by path on every node).

`make_opener` opens `EchoSession`s. `make_logged_opener` opens `LoggedSession`s, which record
every execution (start and end, stamped with Redis `TIME`, plus the Ray actor that ran it) in a
Redis list named by the turn's `submit_options`, so a test can check from outside the cluster
which turn ran where, whether two turns of a session ever overlapped, and how often each
idempotency key was executed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stickless import LiveSession, TextDelta, TranscriptEntry, TurnContext, TurnOutput


class EchoSession:
    """Echoes the input; `gate:forever` never returns on its own (until interrupted)."""

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        text = turn.input.as_text()
        turn.emit(TextDelta(text=text))
        if text == "gate:forever":
            await turn.interrupted.wait()
        await turn.transcript.append(TranscriptEntry(role="user", content=text))
        await asyncio.sleep(0)
        return TurnOutput(text=f"echo:{text}")

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


class EchoOpener:
    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return EchoSession()


def make_opener() -> EchoOpener:
    return EchoOpener()


# ====================================================================== the logging agent

#: Appends ARGV[1] plus the server's clock ("<json>|<seconds>.<micros>") to the list KEYS[1].
_LOG_SCRIPT = """
local t = redis.call('TIME')
local stamp = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. stamp)
return stamp
"""

_clients: dict[str, Any] = {}


def _client(url: str) -> Any:
    """One asyncio Redis client per URL in this worker process (its one event loop)."""
    client = _clients.get(url)
    if client is None:
        import redis.asyncio as aioredis

        client = _clients[url] = aioredis.Redis.from_url(url, decode_responses=True)
    return client


def _actor_id() -> str:
    """The Ray actor (router incarnation) running this code, or "" outside Ray."""
    try:
        import ray

        return str(ray.get_runtime_context().get_actor_id() or "")
    except Exception:
        return ""


@dataclass(frozen=True)
class ExecutionRecord:
    """One line of an execution log, as the test reads it back."""

    phase: str  # "start" | "end" | "interrupted"
    session_id: str
    turn_id: str
    tag: str
    actor: str
    time: float  # Redis TIME


def read_log(client: Any, key: str) -> list[ExecutionRecord]:
    """Parse an execution log with a synchronous redis-py client (decode_responses=True)."""
    records = []
    for line in client.lrange(key, 0, -1):
        body, _, stamp = str(line).rpartition("|")
        fields = json.loads(body)
        records.append(
            ExecutionRecord(
                phase=fields["phase"],
                session_id=fields["session"],
                turn_id=fields["turn"],
                tag=fields["tag"],
                actor=fields["actor"],
                time=float(stamp),
            )
        )
    return records


class LoggedSession:
    """Logs each execution to Redis when the turn's `submit_options` carry `log_url` and
    `log_key`; `hold` makes the turn last that many seconds (-1: until interrupted); `tag`
    names the request (its idempotency key). It stages `<session>|<tag>` as the turn's one
    transcript entry."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id

    async def _log(self, turn: TurnContext, phase: str) -> None:
        options = turn.submit_options
        url, key = options.get("log_url"), options.get("log_key")
        if not isinstance(url, str) or not isinstance(key, str):
            return
        line = json.dumps(
            {
                "phase": phase,
                "session": turn.session_id,
                "turn": turn.turn_id,
                "tag": str(options.get("tag", "")),
                "actor": _actor_id(),
            }
        )
        await _client(url).eval(_LOG_SCRIPT, 1, key, line)

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        options = turn.submit_options
        tag = str(options.get("tag", turn.input.as_text()))
        hold = options.get("hold", 0)
        await self._log(turn, "start")
        turn.emit(TextDelta(text=f"{tag} "))
        if isinstance(hold, int | float) and hold < 0:
            await turn.interrupted.wait()
        elif isinstance(hold, int | float) and hold > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(turn.interrupted.wait(), hold)
        if turn.interrupted.is_set():
            await self._log(turn, "interrupted")
            return TurnOutput(text=f"interrupted:{tag}")
        await turn.transcript.append(
            TranscriptEntry(role="user", content=f"{self._session_id}|{tag}")
        )
        # Logged before returning: the logged interval lies inside the real one.
        await self._log(turn, "end")
        return TurnOutput(text=f"done:{tag}", data={"actor": _actor_id()})

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


class LoggedOpener:
    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return LoggedSession(session_id)


def make_logged_opener() -> LoggedOpener:
    return LoggedOpener()
