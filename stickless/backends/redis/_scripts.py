"""The backend's Lua scripts: read once from package data, registered per client, and run
singly (redis-py reloads a script the server forgot) or many per pipeline (one round trip)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError
from redis.typing import EncodableT, KeyT

_LUA = files(__package__).joinpath("lua")


@cache
def source(name: str) -> str:
    """The text of `lua/<name>.lua` with the shared prelude in front."""
    prelude = _LUA.joinpath("_prelude.lua").read_text(encoding="utf-8")
    return prelude + "\n" + _LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")


class Script(AsyncScript):
    """A stickless script: every call passes the namespace's prefix of liveness keys as one
    more, last, key (`Keys.live_prefix`): the prelude checks a lease's or reservation's holder
    against its liveness key, whose name the caller cannot pass beforehand (the holder is read
    inside the script), and the script text stays the same in every namespace."""

    def __init__(self, client: Redis, text: str, live_prefix: str) -> None:
        super().__init__(client, text)
        self.live_prefix = live_prefix

    async def __call__(
        self,
        keys: Sequence[KeyT] | None = None,
        args: Iterable[EncodableT] | None = None,
        client: Redis | RedisCluster | None = None,
    ) -> Any:
        return await super().__call__([*(keys or ()), self.live_prefix], args, client)


class Scripts:
    """Every script registered on one client (each keeps its SHA and reloads on NOSCRIPT)."""

    def __init__(self, client: Redis, live_prefix: str) -> None:
        def load(name: str) -> Script:
            return Script(client, source(name), live_prefix)

        self.lease_acquire = load("lease_acquire")
        self.lease_release = load("lease_release")
        self.lease_current = load("lease_current")
        self.lease_revoke = load("lease_revoke")
        self.live_register = load("live_register")
        self.live_renew = load("live_renew")
        self.live_retire = load("live_retire")
        self.live_dead = load("live_dead")
        self.live_forget = load("live_forget")
        self.record_provision = load("record_provision")
        self.inbox_deliver = load("inbox_deliver")
        self.inbox_take = load("inbox_take")
        self.inbox_ack = load("inbox_ack")
        self.inbox_oldest = load("inbox_oldest")
        self.inbox_stats = load("inbox_stats")
        self.index_due = load("index_due")
        self.index_rescore = load("index_rescore")
        self.index_drop = load("index_drop")
        self.idem_put = load("idem_put")
        self.idem_acquire = load("idem_acquire")
        self.idem_release = load("idem_release")
        self.idem_requeue = load("idem_requeue")
        self.idem_park = load("idem_park")
        self.idem_reset = load("idem_reset")
        self.idem_discard = load("idem_discard")
        self.idem_find = load("idem_find")
        self.idem_expire = load("idem_expire")
        self.events_append = load("events_append")
        self.events_relay = load("events_relay")
        self.events_read = load("events_read")
        self.events_delete = load("events_delete")
        self.dead_add = load("dead_add")
        self.turn_finish = load("turn_finish")


Arg = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class Call:
    """One command of a batch: a script with keys and args, or (script None) a plain command."""

    script: Script | None
    keys: Sequence[str]
    args: Sequence[Arg] = ()


def _queue(pipe: Pipeline, call: Call) -> None:
    """Buffer one call on the pipeline (EVALSHA without redis-py's per-execute script check)."""
    if call.script is None:
        pipe.execute_command(*call.keys, *call.args)
    else:
        keys = (*call.keys, call.script.live_prefix)
        pipe.evalsha(call.script.sha, len(keys), *keys, *call.args)


async def _send(client: Redis, calls: Sequence[Call]) -> list[Any]:
    """One pipeline of `calls`; error replies come back as exception values."""
    pipe = client.pipeline(transaction=False)
    for call in calls:
        _queue(pipe, call)
    return await pipe.execute(raise_on_error=False)


async def run_batch(client: Redis, calls: Sequence[Call]) -> list[Any]:
    """Run every call in one pipelined round trip; replies in order.

    Calls refused with NOSCRIPT (a restarted or flushed server) had no effect, so their scripts
    are loaded and only those calls are sent again.

    Raises:
        redis.exceptions.RedisError: the first error reply, or a connection failure.
    """
    if not calls:
        return []
    replies = await _send(client, calls)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        scripts = {id(s): s for i in missing if (s := calls[i].script) is not None}
        for script in scripts.values():
            script.sha = await client.script_load(script.script)
        for i, reply in zip(missing, await _send(client, [calls[i] for i in missing]), strict=True):
            replies[i] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
