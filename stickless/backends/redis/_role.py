"""What every Redis storage role shares: its client, scripts and keys, and small codecs."""

from __future__ import annotations

import math
from typing import Any

from redis.asyncio import Redis

from ..base import HOLDER_INDEX_TTL
from ._keys import Keys
from ._scripts import Call, Scripts

#: Candidates one index scan round verifies, and the rounds one scan may take.
_SCAN_BATCH = 256
_SCAN_ROUNDS = 8


def _text(value: Any) -> str:
    """A reply value as text (replies are bytes: the client does not decode)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _num(value: float) -> str:
    """A number as a script argument Lua's tonumber reads back exactly."""
    return repr(float(value))


def _keep_index(index: str) -> list[Call]:
    """Commands keeping a per-holder index alive for `HOLDER_INDEX_TTL` from now: set when it
    has no expiry, pushed later when it has an earlier one, never pulled earlier (NX, then
    GT)."""
    ms = _ms(HOLDER_INDEX_TTL)
    return [Call(None, ["PEXPIRE", index], [ms, "NX"]), Call(None, ["PEXPIRE", index], [ms, "GT"])]


def _ms(seconds: float) -> int:
    """A positive TTL in whole milliseconds (rounded up, at least 1)."""
    return max(1, math.ceil(seconds * 1000))


class _Role:
    """What every store shares: the client, its scripts and the namespace's keys."""

    def __init__(self, client: Redis, scripts: Scripts, keys: Keys) -> None:
        self._client = client
        self._scripts = scripts
        self._keys = keys
