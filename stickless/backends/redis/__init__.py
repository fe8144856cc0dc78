"""Redis backends: every storage role on Redis (`pip install 'stickless[redis]'`)."""

from importlib.util import find_spec

if find_spec("redis") is None:
    raise ImportError(
        "stickless.backends.redis needs redis-py: pip install 'stickless[redis]'", name="redis"
    )

from ._bundle import RedisBackends, Retention
from ._dead_letters import RedisDeadLetterStore
from ._eventlog import RedisEventLog
from ._hotpath import RedisHotPath
from ._idempotency import RedisIdempotencyStore
from ._inbox import RedisInbox
from ._keys import Keys
from ._liveness import RedisLiveness
from ._signals import RedisSignalBus, RedisSubscription
from ._stores import RedisLeaseStore, RedisRecordStore

__all__ = [
    "Keys",
    "RedisBackends",
    "RedisDeadLetterStore",
    "RedisEventLog",
    "RedisHotPath",
    "RedisIdempotencyStore",
    "RedisInbox",
    "RedisLeaseStore",
    "RedisLiveness",
    "RedisRecordStore",
    "RedisSignalBus",
    "RedisSubscription",
    "Retention",
]
