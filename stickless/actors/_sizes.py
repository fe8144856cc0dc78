"""Byte bounds of relay batches and of the frames in them: pure decisions the relay executes.

A relay batch goes out as one EVENT signal (one PUBLISH, one event-log script): its frames, an
event id per frame and the envelope around them. Its size is kept at or under
`max_relay_batch_bytes` by cutting a turn's queued frames into runs (`split_runs`), and every
frame an agent emits fits one batch alone: an oversized text or reasoning delta is cut into
several (`split_text`), any other oversized frame is refused (see docs/architecture.md,
"Bounded messages").
"""

from __future__ import annotations

from collections.abc import Sequence

from ..wire import EVENT_BATCH_ENVELOPE_BYTES, MAX_EVENT_ID_BYTES

#: The longest UTF-8 encoding of one character: a piece of text is never shorter than this.
_MAX_CHAR_BYTES = 4


def batch_budget(max_batch_bytes: int) -> int:
    """What a batch's frames and their ids may take: the bound less the signal's envelope."""
    return max_batch_bytes - EVENT_BATCH_ENVELOPE_BYTES


def frame_limit(max_batch_bytes: int) -> int:
    """The largest encoded frame that fits a batch alone (with its event id)."""
    return batch_budget(max_batch_bytes) - MAX_EVENT_ID_BYTES


def frame_cost(size: int) -> int:
    """What an encoded frame of `size` bytes takes in its batch's signal (its id included)."""
    return size + MAX_EVENT_ID_BYTES


def split_runs(costs: Sequence[int], budget: int) -> list[int]:
    """The lengths of consecutive runs of `costs`, in order and covering them all, each run
    summing to at most `budget`; an item over `budget` on its own makes a run of one (a
    terminal frame carrying a large turn output is sent whole: see `frame_limit`).

    Greedy: a run takes items while they fit, so the runs of a prefix are the prefix's runs.
    """
    runs: list[int] = []
    length = total = 0
    for cost in costs:
        if length and total + cost > budget:
            runs.append(length)
            length = total = 0
        length += 1
        total += cost
    if length:
        runs.append(length)
    return runs


def split_text(text: str, max_bytes: int) -> list[str]:
    """`text` cut in order into pieces of at most `max_bytes` UTF-8 bytes each, only between
    characters (never inside one's encoding), so the pieces joined are `text` again.

    Raises:
        ValueError: `max_bytes` is smaller than the longest character encoding (4 bytes).
    """
    if max_bytes < _MAX_CHAR_BYTES:
        raise ValueError(f"max_bytes must be at least {_MAX_CHAR_BYTES}, got {max_bytes}")
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return [text]
    pieces: list[str] = []
    start = 0
    while len(data) - start > max_bytes:
        cut = start + max_bytes
        while data[cut] & 0xC0 == 0x80:  # a continuation byte: its character starts earlier
            cut -= 1
        pieces.append(data[start:cut].decode("utf-8"))
        start = cut
    pieces.append(data[start:].decode("utf-8"))
    return pieces
