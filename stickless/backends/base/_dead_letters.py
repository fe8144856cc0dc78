"""The dead-letter store: messages whose last attempt failed, or that could not be read.

A letter is kept until an operator removes, replays or purges it (nothing expires it), so it
can be looked at long after its caller got the terminal failure.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBytes,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from ..._types import MAX_ID_LENGTH, MAX_MESSAGE_CHARS
from ...wire import Envelope, WireError, client_key, pack, unpack
from ._idempotency import AttemptRecord

#: Bytes of an unreadable entry a letter keeps; the rest is dropped (the letter says how many).
MAX_RAW_BYTES = 64 * 1024
#: Attempt records one letter holds at most (the newest are kept).
MAX_ATTEMPTS = 100
#: Separates a letter id's session from its digest; never in a session id (`is_session_id`).
_LETTER_SEPARATOR = "~"
#: Hex digits of a letter id's digest.
_DIGEST_CHARS = 32
#: Longest letter id: a session id, the separator and the digest.
MAX_LETTER_ID_LENGTH = MAX_ID_LENGTH + 1 + _DIGEST_CHARS
#: Version tag of the packed layout (the first element of the packed array).
_LAYOUT = 1
#: The first bytes of every packed letter: a 3-array, the layout tag, a float64 marker.
_HEADER = b"\x93\x01\xcb"


def _cut(text: str) -> str:
    """Free text (an agent's exception, a decode error) bounded to MAX_MESSAGE_CHARS."""
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "\u2026"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that will not run again by itself.

    `source_id` is the inbox message id it came from ("" for a turn submitted on its holder);
    `reservation_key` is its reservation key as the envelope carries it (`c:<client key>` or
    the internal `t:<turn id>`), and `idempotency_key` the client's key (None when the turn
    had none). `envelope` is None for an unreadable inbox entry, whose bytes
    are kept in `raw`: at most the first MAX_RAW_BYTES (64 KiB), the rest is dropped and
    `reason` says how many bytes the entry had. `dead_at` is stamped with the store clock when
    the letter is added with 0. Free text (`reason`, each attempt's `error`) is cut to
    MAX_MESSAGE_CHARS and only the newest MAX_ATTEMPTS attempts are kept, so a letter always
    packs to a bounded size.

    Raises:
        ValueError: `dead_at` is not a finite time >= 0.
    """

    letter_id: str
    session_id: str
    turn_id: str | None
    reservation_key: str | None
    source_id: str
    reason: str
    attempts: tuple[AttemptRecord, ...]
    envelope: Envelope | None
    raw: bytes | None
    dead_at: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.dead_at) and self.dead_at >= 0):
            raise ValueError(f"dead_at: must be a finite time >= 0, not {self.dead_at!r}")
        reason = self.reason
        if self.raw is not None and len(self.raw) > MAX_RAW_BYTES:
            reason = f"{reason} (entry of {len(self.raw)} bytes, first {MAX_RAW_BYTES} kept)"
            object.__setattr__(self, "raw", self.raw[:MAX_RAW_BYTES])
        object.__setattr__(self, "reason", _cut(reason))
        object.__setattr__(
            self,
            "attempts",
            tuple(replace(a, error=_cut(a.error)) for a in tuple(self.attempts)[-MAX_ATTEMPTS:]),
        )

    @property
    def idempotency_key(self) -> str | None:
        """The idempotency key the client sent (None: the turn had none, or it is unknown)."""
        return None if self.reservation_key is None else client_key(self.reservation_key)


def letter_id_for(session_id: str, turn_id: str | None, source_id: str) -> str:
    """The id of one dead-lettering of (session, turn, source): the same on every retry of it.

    `<session id>~<32 hex digits>` (at most MAX_LETTER_ID_LENGTH characters, no braces): the
    session part lets a store find the letter's session from its id alone.
    """
    digest = hashlib.sha256(pack([session_id, turn_id, source_id])).hexdigest()
    return f"{session_id}{_LETTER_SEPARATOR}{digest[:_DIGEST_CHARS]}"


def letter_session(letter_id: str) -> str | None:
    """The session of a letter id, or None when it is not of the `letter_id_for` form."""
    session_id, separator, digest = letter_id.rpartition(_LETTER_SEPARATOR)
    if (
        not separator
        or not session_id
        or len(letter_id) > MAX_LETTER_ID_LENGTH
        or len(digest) != _DIGEST_CHARS
        or any(c not in "0123456789abcdef" for c in digest)
        or "{" in session_id
        or "}" in session_id
    ):
        return None
    return session_id


def check_letter(letter: DeadLetter) -> str:
    """The session a letter is filed under: the one its id names.

    Raises:
        ValueError: the id is not a `letter_id_for` id of the letter's session.
    """
    if letter_session(letter.letter_id) != letter.session_id:
        raise ValueError(
            f"letter_id: {letter.letter_id!r} is not a letter id of session {letter.session_id!r}"
        )
    return letter.session_id


def letter_for_envelope(
    envelope: Envelope, source_id: str, reason: str, attempts: Sequence[AttemptRecord]
) -> DeadLetter:
    """The letter of a readable message whose last attempt failed (`dead_at` left to the store)."""
    return DeadLetter(
        letter_id=letter_id_for(envelope.session_id, envelope.turn_id, source_id),
        session_id=envelope.session_id,
        turn_id=envelope.turn_id,
        reservation_key=envelope.key,
        source_id=source_id,
        reason=reason,
        attempts=tuple(attempts),
        envelope=envelope,
        raw=None,
    )


def letter_for_unreadable(
    session_id: str,
    source_id: str,
    turn_id: str | None,
    reservation_key: str | None,
    reason: str,
    raw: bytes | None,
) -> DeadLetter:
    """The letter of an inbox entry that could not be decoded (its salvaged addresses, if any,
    and at most MAX_RAW_BYTES of its bytes)."""
    return DeadLetter(
        letter_id=letter_id_for(session_id, turn_id, source_id),
        session_id=session_id,
        turn_id=turn_id,
        reservation_key=reservation_key,
        source_id=source_id,
        reason=reason,
        attempts=(),
        envelope=None,
        raw=raw,
    )


def unreadable_letter(letter_id: str, session_id: str, data: bytes, why: str) -> DeadLetter:
    """What a listing reports for stored bytes that are not a letter: the id and session it
    is filed under, why, its time when the header is intact, and its first bytes in `raw`."""
    return DeadLetter(
        letter_id=letter_id,
        session_id=session_id,
        turn_id=None,
        reservation_key=None,
        source_id="",
        reason=f"unreadable stored letter: {why}",
        attempts=(),
        envelope=None,
        raw=data,
        dead_at=stamp_of(data) or 0.0,
    )


# --------------------------------------------------------------------------- packing


class _Attempt(BaseModel):
    """The packed fields of one attempt record."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    n: StrictInt
    node: StrictStr = Field(max_length=MAX_ID_LENGTH * 2)
    error: StrictStr = Field(max_length=MAX_MESSAGE_CHARS)
    at: StrictFloat | StrictInt


class _Body(BaseModel):
    """The packed fields of a letter (short names; bounded so decoding stays bounded)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    id: StrictStr = Field(max_length=MAX_LETTER_ID_LENGTH)
    session: StrictStr = Field(min_length=1, max_length=MAX_ID_LENGTH)
    turn: StrictStr | None = Field(default=None, max_length=MAX_ID_LENGTH)
    #: The reservation key (`DeadLetter.reservation_key`): the client's key is derived from it.
    key: StrictStr | None = Field(default=None, max_length=4 * MAX_ID_LENGTH)
    source: StrictStr = Field(default="", max_length=MAX_ID_LENGTH)
    reason: StrictStr = Field(max_length=MAX_MESSAGE_CHARS)
    attempts: list[_Attempt] = Field(default_factory=list, max_length=MAX_ATTEMPTS)
    envelope: StrictBytes | None = None
    raw: StrictBytes | None = Field(default=None, max_length=MAX_RAW_BYTES)


def pack_letter(letter: DeadLetter) -> bytes:
    """A letter as msgpack primitives: the array `[1, dead_at, body map]`.

    `dead_at` is always a float64 right after the header bytes 0x93 0x01 0xcb, so a Redis
    script can stamp a letter packed with `dead_at` 0 in place (bytes 4-11; `letter_stamp` in
    the Lua prelude) without decoding it. The envelope rides as its own encoded bytes.
    """
    body: dict[str, Any] = {
        "id": letter.letter_id,
        "session": letter.session_id,
        "turn": letter.turn_id,
        "key": letter.reservation_key,
        "source": letter.source_id,
        "reason": letter.reason,
        "attempts": [
            {"n": a.attempt, "node": a.node, "error": a.error, "at": float(a.at)}
            for a in letter.attempts
        ],
        "envelope": None if letter.envelope is None else letter.envelope.encode(),
        "raw": letter.raw,
    }
    return pack([_LAYOUT, float(letter.dead_at), body])


def stamp_of(data: bytes) -> float | None:
    """The `dead_at` in a packed letter's header, or None when the header is not intact."""
    if len(data) < len(_HEADER) + 8 or not data.startswith(_HEADER):
        return None
    (stamp,) = struct.unpack(">d", data[len(_HEADER) : len(_HEADER) + 8])
    return stamp if math.isfinite(stamp) and stamp >= 0 else None


def unpack_letter(data: bytes) -> DeadLetter:
    """Decode a packed letter (bounded: see `wire.unpack` and the field bounds).

    Raises:
        WireError: the bytes are not a letter (the message says what is wrong).
    """
    raw = unpack(data)
    if not (isinstance(raw, list) and len(raw) == 3 and raw[0] == _LAYOUT):
        raise WireError("not a packed dead letter (layout 1)")
    _, dead_at, fields = raw
    if isinstance(dead_at, bool) or not isinstance(dead_at, int | float):
        raise WireError("dead_at: not a number")
    try:
        body = _Body.model_validate(fields)
        envelope = None if body.envelope is None else Envelope.decode(body.envelope)
        return DeadLetter(
            letter_id=body.id,
            session_id=body.session,
            turn_id=body.turn,
            reservation_key=body.key,
            source_id=body.source,
            reason=body.reason,
            attempts=tuple(
                AttemptRecord(attempt=a.n, node=a.node, error=a.error, at=float(a.at))
                for a in body.attempts
            ),
            envelope=envelope,
            raw=body.raw,
            dead_at=float(dead_at),
        )
    except ValidationError as exc:
        where = ".".join(str(part) for part in exc.errors()[0]["loc"])
        raise WireError(f"invalid dead letter: {where}: {exc.errors()[0]['msg']}") from None
    except ValueError as exc:  # DeadLetter's own rules
        raise WireError(f"invalid dead letter: {exc}") from None


# --------------------------------------------------------------------------- the role


class DeadLetterStore(Protocol):
    """Per-namespace dead letters, filed by session; kept until removed or purged."""

    async def add(self, letter: DeadLetter) -> bool:
        """Keep the letter (its `dead_at` stamped with the store clock when 0); False, writing
        nothing, when a letter with its id is already kept (adding is safe to repeat)."""
        ...

    async def list(
        self, limit: int, session_id: str | None = None, before: float | None = None
    ) -> list[DeadLetter]:
        """Up to `limit` letters, newest first, of one session or of all; with `before`, only
        those that died strictly earlier (the `dead_at` of a page's last letter pages on).
        A stored letter that cannot be decoded is listed as `unreadable_letter`."""
        ...

    async def get(self, letter_id: str) -> DeadLetter | None:
        """The letter, or None (also for an id not of the `letter_id_for` form)."""
        ...

    async def remove(self, letter_ids: Sequence[str]) -> int:
        """Drop these letters; how many were kept."""
        ...

    async def purge(self, session_id: str | None = None) -> int:
        """Drop every letter of the session (of the namespace when None); how many."""
        ...

    async def count(self, session_id: str | None = None) -> int:
        """How many letters the session (the namespace when None) has."""
        ...
