"""In-memory backends: the embedded default, and a simulated cluster when routers share one."""

from ._bundle import MemoryBackends
from ._dead_letters import MemoryDeadLetterStore
from ._eventlog import MemoryEventLog
from ._hotpath import MemoryHotPath
from ._idempotency import MemoryIdempotencyStore
from ._inbox import MemoryInbox
from ._liveness import MemoryLiveness
from ._signals import MemorySignalBus, MemorySubscription
from ._stores import (
    MemoryLeaseStore,
    MemoryRecordStore,
)

__all__ = [
    "MemoryBackends",
    "MemoryDeadLetterStore",
    "MemoryEventLog",
    "MemoryHotPath",
    "MemoryIdempotencyStore",
    "MemoryInbox",
    "MemoryLeaseStore",
    "MemoryLiveness",
    "MemoryRecordStore",
    "MemorySignalBus",
    "MemorySubscription",
]
