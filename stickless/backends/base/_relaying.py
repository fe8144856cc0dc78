"""The relay's fused store call: a batch of frames logged and published in one call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..._events import Event

#: Relay batches per session a store remembers by batch id (with their event ids): a call run
#: again comes right after the first (redis-py resends it after a lost reply), with at most a
#: few other batches of the session in between, so a short window is enough and keeps the
#: memory per session bounded whatever the batch rate.
RELAY_BATCH_WINDOW = 16


def check_batch_id(batch_id: str) -> None:
    """Refuse a batch id a store cannot remember as one token (empty, or with whitespace).

    Raises:
        ValueError: the batch id is empty or holds whitespace.
    """
    if not batch_id or any(char.isspace() for char in batch_id):
        raise ValueError(f"batch id must be non-empty and hold no whitespace: {batch_id!r}")


class EventRelayPath(Protocol):
    """One store call per relay batch: append to the session's event log and publish on its
    event channel, so a batch costs one round trip however many frames it carries."""

    async def append_and_publish(
        self, session_id: str, origin: str, batch_id: str, frames: Sequence[Event]
    ) -> list[str]:
        """Append `frames` to the session's event log in order (the `EventLog.append` rules:
        ids, exact trimming, expiry), publish them as one EVENT signal from `origin` on the
        session's event channel, every frame carrying its event id, and return the ids.

        The call is safe to repeat: a batch id seen among the session's last
        `RELAY_BATCH_WINDOW` batches appends and publishes nothing and answers the ids the
        first call gave. An empty batch does nothing. The batch goes out whole, as one signal:
        its size is the caller's to bound (the relay's `max_relay_batch_bytes`).

        Raises:
            ValueError: `batch_id` is empty or holds whitespace (see `check_batch_id`).
        """
        ...
