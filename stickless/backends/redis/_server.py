"""Checks of the Redis server's configuration that stickless's guarantees rest on."""

from __future__ import annotations

import enum
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError

from ..._errors import StoreMisconfiguredError
from ..._logs import get_logger
from ._keys import Keys

log = get_logger("stickless.redis")

#: The only `maxmemory-policy` under which Redis never drops a key stickless wrote.
SAFE_POLICY = "noeviction"

#: What a refusal tells the operator to do.
EVICTION_FIX = (
    "set `maxmemory-policy noeviction` on the server (redis.conf or CONFIG SET), or accept the "
    "risk explicitly with allow_evicting_redis=True / --redis-allow-eviction"
)


class EvictionVerdict(enum.Enum):
    """What to do with a server's eviction policy."""

    SAFE = "safe"
    #: Evicting, and the operator allowed it: run, and say so at every start.
    ALLOWED = "allowed"
    REFUSED = "refused"


def judge_eviction_policy(policy: str | None, allowed: bool) -> EvictionVerdict:
    """Whether a server whose `maxmemory-policy` is `policy` (None: unreadable) may be used."""
    if policy == SAFE_POLICY:
        return EvictionVerdict.SAFE
    return EvictionVerdict.ALLOWED if allowed else EvictionVerdict.REFUSED


def _policy_seen(policy: str | None) -> str:
    seen = "could not be read (INFO memory)" if policy is None else f"is {policy!r}"
    return f"the Redis server's maxmemory-policy {seen}"


#: What eviction costs, in the operator's words.
EVICTION_RISK = (
    "Redis may delete reservations, leases and transcripts, so a completed turn can run again "
    "and a history can vanish"
)


def eviction_message(policy: str | None) -> str:
    """Why a server whose policy is not `noeviction` is refused, and the fix."""
    risk = f"under any policy but {SAFE_POLICY!r} {EVICTION_RISK}"
    return f"{_policy_seen(policy)}: {risk}; {EVICTION_FIX}"


def eviction_warning(policy: str | None) -> str:
    """What a node allowed to run on such a server reports at every start."""
    allowed = "evicting was allowed (allow_evicting_redis)"
    return f"{_policy_seen(policy)} and {allowed}: {EVICTION_RISK}"


class EvictingRedisError(RedisError):
    """A new connection reached a server that may evict keys, which this bundle may not use."""


def parse_policy(info: dict[str, Any] | bytes | str) -> str | None:
    """The `maxmemory_policy` field of an `INFO memory` reply (parsed or raw), or None."""
    if isinstance(info, dict):
        value = info.get("maxmemory_policy")
        return None if value is None else str(value)
    text = info.decode("utf-8", "replace") if isinstance(info, bytes) else info
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "maxmemory_policy":
            return value.strip()
    return None


async def read_policy(connection: AbstractConnection) -> str | None:
    """Ask the server on `connection` for its eviction policy (None when INFO is renamed).

    Raises:
        NoPermissionError: the user may not run INFO.
    """
    await connection.send_command("INFO", "memory")
    try:
        reply = await connection.read_response()
    except NoPermissionError:  # the user's ACL: an access error, not an unknown policy
        raise
    except ResponseError:  # INFO renamed
        return None
    return parse_policy(reply)


def connect_check(allowed: bool) -> Callable[[AbstractConnection], Awaitable[None]]:
    """A redis-py `redis_connect_func`: the usual handshake, then the eviction policy check,
    so a connection made after a reconnect or a failover to a server that may evict is refused
    (its command fails) unless evicting was allowed."""

    async def on_connect(connection: AbstractConnection) -> None:
        await connection.on_connect()
        if allowed:
            return
        policy = await read_policy(connection)
        if judge_eviction_policy(policy, allowed) is EvictionVerdict.REFUSED:
            message = eviction_message(policy)
            log.error("refusing a Redis connection: %s", message)
            raise EvictingRedisError(message)

    return on_connect


def check_ca_file(url: str, path: str) -> str:
    """`path` as the CA file of a TLS connection to `url`.

    Raises:
        ValueError: `url` is not `rediss://`, or `path` is no readable file.
    """
    if not url.startswith("rediss://"):
        raise ValueError(f"ssl_ca_certs needs a rediss:// URL (TLS), not {url.partition(':')[0]}://")
    if not os.access(path, os.R_OK) or not os.path.isfile(path):
        raise ValueError(f"ssl_ca_certs: {path!r} is not a readable file")
    return path


def acl_rule(keys: Keys) -> str:
    """The ACL rule a Redis user of namespace `keys` needs (the README shows it)."""
    ns = keys.namespace
    return f"~{ns}:* ~{{{ns}:s:* &{ns}:* +@all -@dangerous +info"


async def check_access(client: Redis, keys: Keys) -> None:
    """Probe, with the bundle's own user, every kind of access stickless needs: a key of each
    pattern, a channel, a script (each probe key expires at once; INFO is read next).

    Raises:
        StoreMisconfiguredError: the server refused the user (its password, or a permission).
    """
    probe = uuid.uuid4().hex
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.set(f"{keys.namespace}:probe:{probe}", 1, px=1)
            pipe.set(f"{keys.tag(probe)}:probe", 1, px=1)
            pipe.publish(f"{keys.namespace}:probe", b"")
            pipe.eval("return 1", 0)
            await pipe.execute()
    except (AuthenticationError, NoPermissionError) as exc:
        raise access_error(keys, exc) from exc


def access_error(keys: Keys, exc: RedisError) -> StoreMisconfiguredError:
    """The startup error of a user the server refused, naming the rule it needs."""
    return StoreMisconfiguredError(
        f"the Redis server refused this user ({type(exc).__name__}: {exc}); a user of "
        f"namespace {keys.namespace!r} needs the ACL rule `{acl_rule(keys)}` "
        "(README: TLS and ACL users)"
    )
