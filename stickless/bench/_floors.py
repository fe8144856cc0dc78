"""The fused-path floors of a turn, timed raw with redis-py: no-op scripts of the fused scripts'
shape (one per phase of a turn: submit, take, finish), and the holder side of the forwarded
floor as a child process (``python -m stickless.bench._floors URL PREFIX``).

A no-op script has the KEYS and ARGV of the fused call it stands for and returns a reply of
about its size, doing nothing else; a script whose fused call publishes (the doorbell of a
forwarded submit, the TURN_RESULT of a finish) runs one PUBLISH of a message of that size. The
sizes follow the calls a turn makes today (a MONITOR trace of one local and one forwarded echo
turn: the envelope ~350 B, TURN_RESULT ~250 B, doorbell ~120 B) merged per phase:

- local floor: submit on the holder, then finish (2 round trips);
- forwarded floor: the submitter's submit (inbox delivery, doorbell PUBLISH inside) -> pub/sub
  hop to the holder process, which runs take, then finish (TURN_RESULT PUBLISH inside) ->
  pub/sub hop back to the submitter (3 round trips + 2 pub/sub hops, across processes).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._common import raw_client

if TYPE_CHECKING:
    from ._runner import BenchContext


@dataclass(frozen=True, slots=True)
class Shape:
    """A fused call's shape: KEYS count, ARGV sizes (bytes), reply field sizes (bytes), and
    whether it publishes (then ARGV[1] is the channel and ARGV[2] the message)."""

    name: str
    keys: int
    argv: tuple[int, ...]
    reply: tuple[int, ...]
    publishes: bool = False

    def lua(self) -> str:
        """The no-op script: the PUBLISH if any, then a constant reply."""
        fields = ", ".join(f"'{'x' * size}'" for size in self.reply)
        publish = "redis.call('PUBLISH', ARGV[1], ARGV[2])\n" if self.publishes else ""
        return f"{publish}return {{{fields}}}"


#: Holder's submit: binding, reservation, lease check, orphan collect (record, reservation,
#: lease, 3 inbox tiers, take key, pending ids and entries).
SUBMIT_LOCAL = Shape(
    "submit (holder)", 9, (11, 32, 40, 19, 4, 7, 4, 8, 16), (1, 17, 19, 16, 17, 17, 3)
)
#: Non-holder's submit: the same checks, then the inbox delivery and the doorbell PUBLISH.
SUBMIT_FORWARDED = Shape(
    "submit (non-holder, delivers, rings)",
    10,
    (16, 120, 11, 32, 40, 19, 4, 7, 350, 4, 8, 16, 4),
    (1, 19, 16, 17, 15, 17, 1),
    publishes=True,
)
#: Holder's take: collect plus take-over of what it collected (the envelope comes back).
TAKE = Shape("take (holder)", 8, (1, 4, 16, 16, 8, 19, 4), (17, 3, 15, 350, 17, 1, 17))
#: Finish: fenced commit, outcome, reservation, acknowledgement, events, TURN_RESULT PUBLISH
#: (6 KEYS and 13 ARGV, as the `turn_finish` script being written has).
FINISH = Shape(
    "finish (TURN_RESULT PUBLISH inside)",
    6,
    (16, 250, 19, 32, 4, 100, 5, 1, 0, 0, 16, 18, 16),
    (1,),
    publishes=True,
)
#: The local finish's stand-in does no work at all (no subscriber waits on it).
FINISH_LOCAL = Shape("finish", FINISH.keys, FINISH.argv, FINISH.reply)

FLOOR_LOCAL_STEPS = [SUBMIT_LOCAL.name, FINISH_LOCAL.name]
FLOOR_FORWARDED_STEPS = [
    SUBMIT_FORWARDED.name,
    "pub/sub hop (doorbell)",
    TAKE.name,
    FINISH.name,
    "pub/sub hop (TURN_RESULT)",
]


def _channels(prefix: str) -> tuple[str, str]:
    """The doorbell (submitter -> holder) and result (holder -> submitter) channels."""
    return f"{prefix}:floor-doorbell", f"{prefix}:floor-result"


class _Caller:
    """Runs no-op scripts of given shapes on one client, keys in one slot of `prefix`."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self._prefix = prefix
        self._calls: dict[Shape, tuple[str, list[str | bytes]]] = {}

    async def load(self, *shapes: Shape, channel: str = "") -> None:
        """Register each shape's script and its KEYS and ARGV (`channel` for a PUBLISH)."""
        for shape in shapes:
            sha = str(await self.client.script_load(shape.lua()))
            keys = [f"{{{self._prefix}}}:floor:{i}" for i in range(shape.keys)]
            args: list[str | bytes] = [b"x" * size for size in shape.argv]
            if shape.publishes:
                args[0] = channel
            self._calls[shape] = (sha, [*keys, *args])

    async def call(self, shape: Shape) -> None:
        sha, words = self._calls[shape]
        await self.client.evalsha(sha, shape.keys, *words)


class FusedFloor:
    """The local and forwarded floors of the fused turn path (the holder is a child process)."""

    def __init__(self, ctx: BenchContext, prefix: str) -> None:
        self._ctx = ctx
        self._url = ctx.redis_url
        self._prefix = prefix
        self._caller = _Caller(raw_client(ctx.redis_url), prefix)
        self._doorbell, self._result = _channels(prefix)
        self._sub: Any = None
        self._holder: subprocess.Popen[bytes] | None = None

    async def start(self, holder: bool = True) -> None:
        """Load the scripts; unless `holder` is False (the local floor only), subscribe to the
        result channel and start the holder process."""
        from ._procs import read_line

        await self._caller.load(SUBMIT_LOCAL, FINISH_LOCAL)
        if not holder:
            return
        await self._caller.load(SUBMIT_FORWARDED, channel=self._doorbell)
        self._sub = self._caller.client.pubsub(ignore_subscribe_messages=True)
        await self._sub.subscribe(self._result)
        await self._sub.get_message(timeout=1.0)  # the confirmation
        self._holder = self._ctx.processes.spawn(
            [sys.executable, "-m", "stickless.bench._floors", self._url, self._prefix]
        )
        assert self._holder.stdout is not None
        line = await read_line(self._holder.stdout, 30.0, "floor holder")
        if line != "READY":
            raise RuntimeError(f"floor holder did not start ({line!r})")

    async def aclose(self) -> None:
        if self._holder is not None:
            await asyncio.to_thread(self._ctx.processes.stop, self._holder)
        if self._sub is not None:
            await self._sub.aclose()
        await self._caller.client.aclose()

    async def local(self) -> None:
        """Submit on the holder, then finish: 2 sequential round trips."""
        await self._caller.call(SUBMIT_LOCAL)
        await self._caller.call(FINISH_LOCAL)

    async def forwarded(self) -> None:
        """Submit (doorbell inside), then wait for the holder's TURN_RESULT message."""
        await self._caller.call(SUBMIT_FORWARDED)
        while True:
            message = await self._sub.get_message(timeout=5.0)
            if message is None:
                raise RuntimeError("floor holder did not answer within 5s")
            if message.get("type") == "message":
                return


async def holder_main(url: str, prefix: str) -> int:
    """The floor's holder: on each doorbell, take then finish (which publishes the result)."""
    doorbell, result = _channels(prefix)
    caller = _Caller(raw_client(url), prefix)
    await caller.load(TAKE, FINISH, channel=result)
    sub = caller.client.pubsub(ignore_subscribe_messages=True)
    await sub.subscribe(doorbell)
    await sub.get_message(timeout=1.0)
    print("READY", flush=True)
    try:
        while True:
            message = await sub.get_message(timeout=None)
            if message is not None and message.get("type") == "message":
                await caller.call(TAKE)
                await caller.call(FINISH)
    finally:
        await sub.aclose()
        await caller.client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(holder_main(sys.argv[1], sys.argv[2])))
