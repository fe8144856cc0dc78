"""Wire codec: msgpack of flat primitives, validated by pydantic on decode; never pickle.

Everything that crosses a node boundary (inbox envelopes, signals, event frames, idempotency
outcomes) goes through `pack` / `unpack` and one of the models here.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Any, Literal

import msgpack
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from ._errors import FailureCode
from ._events import EVENT_ADAPTER, Event, TurnFailed
from ._types import (
    MAX_MESSAGE_CHARS,
    AttributeMap,
    PrimitiveMap,
    Principal,
    Priority,
    UserInput,
)

#: Upper bound of one encoded value; larger frames are refused on decode.
MAX_FRAME_BYTES = 32 * 1024 * 1024
_SURROGATE = re.compile("[\ud800-\udfff]")


class WireError(ValueError):
    """Bytes that are not a valid stickless wire value."""


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is not allowed on the wire")


def pack(value: Any) -> bytes:
    """Encode primitives (maps, lists, str, bytes, int, float, bool, None) as msgpack.

    Values are checked where they are built (see the wire rules in `_types`, which also keep
    every accepted value well below MAX_FRAME_BYTES); this is the last line: whatever still
    cannot be encoded raises a WireError here instead of msgpack's own errors. (The size bound
    is enforced by `unpack`, the receiving side.)

    Raises:
        WireError: the value is not encodable msgpack (an int out of range, a lone surrogate,
            a non-primitive).
    """
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True)
    except Exception as exc:  # OverflowError, UnicodeEncodeError, TypeError, ValueError
        reason = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")
        raise WireError(
            f"value cannot be encoded as msgpack: {type(exc).__name__}: {reason}"
        ) from None
    return packed


def unpack(data: bytes) -> Any:
    """Decode msgpack with bounded sizes and no extension types.

    Raises:
        WireError: the bytes are not valid bounded msgpack.
    """
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_refuse_ext,
            max_str_len=MAX_FRAME_BYTES,
            max_bin_len=MAX_FRAME_BYTES,
            max_array_len=1_000_000,
            max_map_len=1_000_000,
        )
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"undecodable msgpack: {type(exc).__name__}") from None


def _wire() -> ConfigDict:
    return ConfigDict(frozen=True, extra="ignore")


#: The prefix of a reservation key made from a client's idempotency key (the other form is
#: "t:<turn id>", private to one turn).
CLIENT_KEY_PREFIX = "c:"


def client_key(key: str) -> str | None:
    """The client's idempotency key a reservation key was made from; None for an internal one."""
    return key[len(CLIENT_KEY_PREFIX) :] if key.startswith(CLIENT_KEY_PREFIX) else None


class Envelope(BaseModel):
    """An inbox message: one submit handed from a non-holder to whoever holds the session."""

    model_config = _wire()
    session_id: StrictStr
    turn_id: StrictStr
    agent_ref: StrictStr
    input: UserInput
    priority: Priority = Priority.NEXT
    #: The idempotency reservation key (the client's, or one derived from the turn id).
    key: StrictStr
    context_discriminator: StrictStr | None = None
    submit_options: PrimitiveMap = Field(default_factory=dict)
    initiator: Principal | None = None
    origin: StrictStr = ""
    #: Store clock at first delivery; kept on re-delivery so order survives a hand-over.
    enqueued_at: float = 0.0
    #: The request's handle options and open attributes: the holder opens the session's live
    #: handle with them when this message is the one that opens it.
    options: PrimitiveMap = Field(default_factory=dict)
    open_attributes: AttributeMap = Field(default_factory=dict)
    #: The W3C traceparent of the span that sent the message ('' for none); read leniently, so
    #: a malformed one costs the trace, never the message.
    traceparent: StrictStr = ""

    def encode(self) -> bytes:
        return pack(self.model_dump(mode="python"))

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        """Raises: WireError when the bytes are not an envelope."""
        try:
            return cls.model_validate(unpack(data))
        except ValidationError as exc:
            raise WireError(f"invalid envelope: {exc.error_count()} field error(s)") from None


def salvage_addresses(data: bytes) -> tuple[str | None, str | None]:
    """Best-effort (turn_id, key) from a corrupt envelope, as raw strings, for answering it."""
    try:
        raw = unpack(data)
    except WireError:
        return None, None
    if not isinstance(raw, dict):
        return None, None
    turn = raw.get("turn_id")
    key = raw.get("key")
    return (turn if isinstance(turn, str) else None, key if isinstance(key, str) else None)


class SignalKind(enum.StrEnum):
    """The cross-node signal kinds."""

    INTERRUPT = "INTERRUPT"
    #: A node that acted on an INTERRUPT (interrupted or cancelled a turn) tells the requester.
    INTERRUPT_ACK = "INTERRUPT_ACK"
    EVICT = "EVICT"
    YIELD = "YIELD"
    MESSAGE_ENQUEUED = "MESSAGE_ENQUEUED"
    TURN_RESULT = "TURN_RESULT"
    EVENT = "EVENT"
    STATUS = "STATUS"


#: Kinds that travel on per-session event channels rather than the shared control channel.
EVENT_CHANNEL_KINDS = frozenset({SignalKind.EVENT})


class Signal(BaseModel):
    """One signal; `payload` is a flat map decoded by the payload model of its kind."""

    model_config = _wire()
    kind: StrictStr
    session_id: StrictStr
    origin: StrictStr
    payload: dict[StrictStr, Any] = Field(default_factory=dict)

    def encode(self) -> bytes:
        return pack(self.model_dump(mode="python"))

    @classmethod
    def decode(cls, data: bytes) -> Signal:
        """Raises: WireError when the bytes are not a signal."""
        try:
            return cls.model_validate(unpack(data))
        except ValidationError as exc:
            raise WireError(f"invalid signal: {exc.error_count()} field error(s)") from None

    def known_kind(self) -> SignalKind | None:
        """The kind, or None when a newer node sent one this node does not know."""
        try:
            return SignalKind(self.kind)
        except ValueError:
            return None


class InterruptPayload(BaseModel):
    model_config = _wire()
    reason: StrictStr
    turn_id: StrictStr | None = None
    #: Set when the requester waits for an INTERRUPT_ACK naming it.
    request_id: StrictStr | None = None


class InterruptAckPayload(BaseModel):
    model_config = _wire()
    request_id: StrictStr


class EvictPayload(BaseModel):
    model_config = _wire()
    token: StrictInt


class YieldPayload(BaseModel):
    """Ask the holder to end the session (release it, or delete it) on the requester's behalf."""

    model_config = _wire()
    purpose: Literal["delete", "release"]
    requester: StrictStr


class Outcome(BaseModel):
    """The terminal answer of one turn, as stored for pollers and sent on TURN_RESULT."""

    model_config = _wire()
    turn_id: StrictStr
    ok: StrictBool
    executed_by: StrictStr = ""
    text: StrictStr = ""
    data: PrimitiveMap = Field(default_factory=dict)
    code: StrictStr = ""
    #: Free text (often an agent's exception): made encodable (lone surrogates replaced) and cut
    #: to MAX_MESSAGE_CHARS, so recording a failure can never fail to encode.
    message: StrictStr = ""

    @field_validator("message", mode="before")
    @classmethod
    def _encodable_message(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if len(value) > MAX_MESSAGE_CHARS:
            value = value[: MAX_MESSAGE_CHARS - 1] + "\u2026"
        return _SURROGATE.sub("\ufffd", value)

    @classmethod
    def failure(
        cls, turn_id: str, code: FailureCode, message: str, executed_by: str = ""
    ) -> Outcome:
        """A failed turn's outcome."""
        return cls(
            turn_id=turn_id, ok=False, executed_by=executed_by, code=code.value, message=message
        )

    @classmethod
    def unknown(cls, turn_id: str, forward_ttl: float) -> Outcome:
        """The answer of a turn whose outcome a node could not learn within `forward_ttl`."""
        return cls.failure(
            turn_id,
            FailureCode.FORWARD_TIMEOUT,
            f"no answer within forward_ttl ({forward_ttl}s); unless it was withdrawn in time the "
            "turn may still run: retry with the same idempotency key to learn its outcome",
        )

    @property
    def failure_code(self) -> FailureCode:
        return FailureCode.parse(self.code)

    @property
    def result(self) -> str:
        """What the turn came to, as a label: 'completed' or its failure code's name."""
        return "completed" if self.ok else self.failure_code.name

    @property
    def final(self) -> bool:
        """Whether the key keeps this answer (DONE) or is left free for a fresh run (FAILED)."""
        return self.ok or self.failure_code.final

    def unrun_frame(self, session_id: str) -> TurnFailed:
        """The terminal frame of a turn answered with this failure without running."""
        return TurnFailed(
            session_id=session_id,
            turn_id=self.turn_id,
            seq=1,
            code=self.failure_code,
            message=self.message,
            executed_by=self.executed_by,
        )

    def encode(self) -> bytes:
        return pack(self.model_dump(mode="python"))

    @classmethod
    def decode(cls, data: bytes) -> Outcome:
        """Raises: WireError when the bytes are not an outcome."""
        try:
            return cls.model_validate(unpack(data))
        except ValidationError as exc:
            raise WireError(f"invalid outcome: {exc.error_count()} field error(s)") from None


class TurnResultPayload(BaseModel):
    model_config = _wire()
    key: StrictStr
    outcome: Outcome


class StatusPayload(BaseModel):
    model_config = _wire()
    holder: StrictStr
    token: StrictInt
    state: StrictStr
    active_turn_id: StrictStr | None = None
    queued: StrictInt = 0
    seq: StrictInt
    updated_at: float
    #: The session's pending backlog as of the holder's last status heartbeat (absent from a
    #: node that predates it: read as none).
    pending: StrictInt = 0
    oldest_pending_idle: float | None = None


#: The longest event id (see `MAX_EVENT_ID_BYTES`), bounding a gap's fields.
_MAX_EVENT_ID_CHARS = 41


class GapNotice(BaseModel):
    """A gap a stream reported (`router.StreamGap`), as it crosses a node boundary: frames
    logged after `cursor` (None: not known where the stream stood) that the log no longer held
    (its oldest id then `oldest_id`; None: none, or not readable)."""

    model_config = _wire()
    cursor: StrictStr | None = Field(default=None, max_length=_MAX_EVENT_ID_CHARS)
    oldest_id: StrictStr | None = Field(default=None, max_length=_MAX_EVENT_ID_CHARS)


def encode_event(event: Event) -> bytes:
    """Encode an event frame (without its event id, which the log assigns)."""
    return pack(event.model_dump(mode="json", exclude={"event_id"}))


#: The largest packed event id: "<ms>-<n>", both 64-bit (41 characters and a 2-byte header),
#: what a frame's id takes in its batch's EVENT signal.
MAX_EVENT_ID_BYTES = 43
#: Room an EVENT signal takes besides its frames and their ids (`event_batch_parts` with the
#: largest array headers, for a session id and a node id of up to 200 characters each).
EVENT_BATCH_ENVELOPE_BYTES = 2048


def event_batch_parts(session_id: str, origin: str, count: int) -> tuple[bytes, bytes]:
    """The bytes around a relay batch's frames in its EVENT signal: the head (the signal up to
    an array of `count` frames) and the middle (up to an array of `count` event ids).

    The signal of a batch is `head + encoded frames + middle + packed ids` (see
    `pack_event_batch`): a map {kind, session_id, origin, payload: {frames, ids}}. Built by
    concatenation so a store can publish the frames it logged, ids included, without decoding
    or re-encoding one (the Redis relay script does exactly this).
    """
    packer = msgpack.Packer(use_bin_type=True)
    head = b"".join(
        (
            packer.pack_map_header(4),
            pack("kind"),
            pack(SignalKind.EVENT.value),
            pack("session_id"),
            pack(session_id),
            pack("origin"),
            pack(origin),
            pack("payload"),
            packer.pack_map_header(2),
            pack("frames"),
            packer.pack_array_header(count),
        )
    )
    return head, pack("ids") + packer.pack_array_header(count)


def pack_event_batch(
    session_id: str, origin: str, frames: Sequence[bytes], event_ids: Sequence[str]
) -> bytes:
    """The EVENT signal of one relay batch: encoded frames (`encode_event`) and their ids."""
    head, middle = event_batch_parts(session_id, origin, len(frames))
    return b"".join((head, *frames, middle, *(pack(event_id) for event_id in event_ids)))


def frames_from_payload(payload: dict[str, Any]) -> tuple[list[Event], int]:
    """The frames of an EVENT signal, each with its event id when the payload names them, and
    how many frames were unreadable (skipped one by one)."""
    raw_frames = payload.get("frames")
    if not isinstance(raw_frames, list):
        return [], 1
    event_ids = payload.get("ids")
    if not (isinstance(event_ids, list) and len(event_ids) == len(raw_frames)):
        event_ids = [None] * len(raw_frames)
    frames: list[Event] = []
    unreadable = 0
    for raw, event_id in zip(raw_frames, event_ids, strict=True):
        if isinstance(raw, dict) and isinstance(event_id, str):
            raw["event_id"] = event_id
        try:
            frames.append(event_from_payload(raw))
        except WireError:
            unreadable += 1
    return frames, unreadable


def event_from_payload(payload: Any) -> Event:
    """Raises: WireError when the payload is not a known event frame."""
    try:
        return EVENT_ADAPTER.validate_python(payload)
    except ValidationError as exc:
        raise WireError(f"invalid event frame: {exc.error_count()} field error(s)") from None


def decode_event(data: bytes, event_id: str | None = None) -> Event:
    """Raises: WireError when the bytes are not a known event frame."""
    raw = unpack(data)
    if isinstance(raw, dict) and event_id is not None:
        raw["event_id"] = event_id
    return event_from_payload(raw)
