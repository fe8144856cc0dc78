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

from .._events import Event, ReasoningDelta, TextDelta
from ..wire import EVENT_BATCH_ENVELOPE_BYTES, MAX_EVENT_ID_BYTES, encode_event

#: The longest UTF-8 encoding of one character: a piece of text is never shorter than this.
_MAX_CHAR_BYTES = 4
#: The seq a delta's measured envelope is encoded with: the longest msgpack integer (9 bytes).
_LONGEST_SEQ = 2**64 - 1
#: How much longer a msgpack string header can be than the empty string's (str32 vs fixstr).
_STR_HEADER_GROWTH = 4


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


class FrameSizes:
    """Encoded sizes of one relay's stamped frames, for its bounds: exact for most frames; for a
    text or reasoning delta an upper bound within a few bytes, from its text's UTF-8 length and
    the rest of the delta measured once per kind and trace (every other field of a delta is the
    relay's stamp), so the common frame is not encoded twice on its way out."""

    def __init__(self) -> None:
        self._envelopes: dict[tuple[str, str, str], int] = {}

    def of(self, frame: Event) -> int:
        if not isinstance(frame, TextDelta | ReasoningDelta):
            return len(encode_event(frame))
        key = (frame.type, frame.trace_id, frame.span_id)
        envelope = self._envelopes.get(key)
        if envelope is None:
            empty = frame.model_copy(update={"text": "", "seq": _LONGEST_SEQ})
            envelope = self._envelopes[key] = len(encode_event(empty)) + _STR_HEADER_GROWTH
        text = frame.text
        return envelope + (len(text) if text.isascii() else len(text.encode("utf-8")))
