"""Public value types: requests, inputs, outputs and transcript entries."""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

import msgpack
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictBytes,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ._errors import InvalidRequestError
from ._trace import TraceContext, coerce_trace

# --------------------------------------------------------------------------- wire rules
#
# Everything that crosses a node boundary is msgpack, so every value an application hands over
# (request maps, agent outputs, transcript entries) is checked against what msgpack can carry
# when it is built, never when it is encoded:
#
# - ints within msgpack's range, -2**63 .. 2**64 - 1 (int64 and uint64);
# - floats of any value, NaN and +-inf included: msgpack carries every IEEE-754 double exactly,
#   and refusing them now would make values stored by earlier versions unreadable (a JSON
#   adapter has to map NaN / Infinity itself);
# - strings that are valid UTF-8 (no lone surrogates), keys included;
# - bools and None; bytes only inside `open_attributes` (msgpack bin);
# - nesting (only in `open_attributes` and a transcript entry's `data`) at most MAX_NESTING
#   levels of lists / str-keyed maps, at most MAX_NESTED_ITEMS values in all; tuples become
#   lists, so the opener (or the next turn) sees the same value whether the turn was local or
#   forwarded;
# - encoded sizes bounded at the edge: MAX_MAP_BYTES per request map, MAX_OUTPUT_BYTES per
#   agent output (both well below wire.MAX_FRAME_BYTES, so whatever passes here can be decoded).

#: msgpack's integer range (int64 .. uint64).
WIRE_INT_MIN = -(2**63)
WIRE_INT_MAX = 2**64 - 1
#: Levels of lists / maps a value of `open_attributes` may nest (a flat map's values: 0).
MAX_NESTING = 8
#: Values (containers and leaves) all of `open_attributes` may hold.
MAX_NESTED_ITEMS = 10_000
#: Encoded size bound of one transcript entry (role, content and data together).
MAX_ENTRY_BYTES = 1024 * 1024
#: Encoded size bound of each request map (`options`, `submit_options`, `open_attributes`,
#: the initiator).
MAX_MAP_BYTES = 64 * 1024
#: Encoded size bound of one agent output (`TurnOutput` text and data together).
MAX_OUTPUT_BYTES = 8 * 1024 * 1024
#: Longest failure message kept in an outcome (longer ones are cut).
MAX_MESSAGE_CHARS = 16 * 1024


def _wire_error(rule: str, subpath: str = "") -> PydanticCustomError:
    """A validation error whose message is the rule alone (no "Value error, " prefix);
    `subpath` locates it below the field (inside a nested value)."""
    return PydanticCustomError("wire_value", "{rule}", {"rule": rule, "subpath": subpath})


def _utf8_rule(value: str) -> str | None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"must be valid UTF-8 (lone surrogate at position {exc.start})"
    return None


def _utf8(value: Any) -> Any:
    if isinstance(value, str):
        rule = _utf8_rule(value)
        if rule is not None:
            raise _wire_error(rule)
    return value


def _type_name(value: Any) -> str:
    return type(value).__name__


def _leaf(value: Any, *, allow_bytes: bool, subpath: str = "") -> Any:
    """A primitive as its exact built-in type, or raise naming the rule it breaks."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if not WIRE_INT_MIN <= value <= WIRE_INT_MAX:
            raise _wire_error(f"int {value} is outside msgpack's range -2**63 .. 2**64-1", subpath)
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        rule = _utf8_rule(value)
        if rule is not None:
            raise _wire_error(rule, subpath)
        return str(value)
    if allow_bytes and isinstance(value, bytes):
        return bytes(value)
    kinds = (
        "str, int, float, bool, bytes or None" if allow_bytes else "str, int, float, bool or None"
    )
    raise _wire_error(f"must be a {kinds}, not {_type_name(value)}", subpath)


def _primitive(value: Any) -> Any:
    return _leaf(value, allow_bytes=False)


class _Walk:
    """Checks (and copies) one nested value: of `open_attributes` (bytes allowed) or of a
    transcript entry's `data` (JSON values only)."""

    def __init__(self, *, allow_bytes: bool) -> None:
        self.items = 0
        self._bytes = allow_bytes

    def value(self, value: Any, path: str, depth: int) -> Any:
        self.items += 1
        if self.items > MAX_NESTED_ITEMS:
            raise _wire_error(f"must hold at most {MAX_NESTED_ITEMS} values in all", path)
        if isinstance(value, Mapping | list | tuple):
            if depth >= MAX_NESTING:
                raise _wire_error(f"must nest at most {MAX_NESTING} levels deep", path)
            if isinstance(value, Mapping):
                return self.mapping(value, path, depth + 1)
            return [self.value(item, f"{path}.{i}", depth + 1) for i, item in enumerate(value)]
        return _leaf(value, allow_bytes=self._bytes, subpath=path)

    def mapping(self, value: Mapping[Any, Any], path: str, depth: int) -> dict[str, Any]:
        copy: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _wire_error(f"map keys must be str, not {_type_name(key)}", path)
            rule = _utf8_rule(key)
            if rule is not None:
                raise _wire_error(f"map keys {rule}", path)
            where = _printable(key)
            copy[str(key)] = self.value(item, f"{path}.{where}" if path else where, depth)
        return copy


def _attributes(value: Any) -> Any:
    """`open_attributes`: a str-keyed map of primitives and bounded lists / maps of them."""
    if not isinstance(value, Mapping):
        return value  # the dict type reports it
    return _Walk(allow_bytes=True).mapping(value, "", 0)


def _json_data(value: Any) -> Any:
    """A transcript entry's `data`: a str-keyed map of JSON values, nested and bounded."""
    if not isinstance(value, Mapping):
        return value  # the dict type reports it
    return _Walk(allow_bytes=False).mapping(value, "", 0)


_UTF8 = BeforeValidator(_utf8)
#: A string that can be encoded as UTF-8 (msgpack str), i.e. without lone surrogates (a field
#: with length bounds spells it `Annotated[StrictStr, Field(...), _UTF8]`, so that the bounds
#: keep their string wording).
WireStr = Annotated[StrictStr, _UTF8]
#: A value that may cross a node boundary inside a flat map.
Primitive = Annotated[
    StrictStr | StrictInt | StrictFloat | StrictBool | None, BeforeValidator(_primitive)
]
#: A flat map of primitives: what `data`, `options` and `submit_options` hold.
PrimitiveMap = dict[WireStr, Primitive]
#: `open_attributes`: primitives (and bytes) nested in lists and str-keyed maps, bounded.
AttributeMap = Annotated[dict[WireStr, Any], BeforeValidator(_attributes)]
#: A transcript entry's `data`: JSON values (primitives in lists and str-keyed maps), bounded.
JsonMap = Annotated[dict[WireStr, Any], BeforeValidator(_json_data)]

_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]*")
MAX_ID_LENGTH = 200


def is_session_id(value: object) -> bool:
    """Whether `value` is a session id a SubmitRequest accepts (charset and length)."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_ID_LENGTH
        and _SESSION_ID.fullmatch(value) is not None
    )


def encoded_size(value: Any) -> int:
    """Bytes of `value` as msgpack (values are checked wire primitives already)."""
    return len(msgpack.packb(value, use_bin_type=True))


def _printable(text: str) -> str:
    """`text` safe to put in a message that itself crosses the wire."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Priority(enum.IntEnum):
    """Queue tier of a message: NOW before NEXT before LATER, FIFO within a tier."""

    NOW = 0
    NEXT = 1
    LATER = 2


def _frozen() -> ConfigDict:
    return ConfigDict(frozen=True, extra="forbid")


class TextPart(BaseModel):
    """Plain text part of a user input."""

    model_config = _frozen()
    type: Literal["text"] = "text"
    text: WireStr


class MediaPart(BaseModel):
    """Binary or referenced media (image, document, audio) part of a user input."""

    model_config = _frozen()
    type: Literal["media"] = "media"
    mime_type: Annotated[StrictStr, Field(min_length=1, max_length=200), _UTF8]
    data: StrictBytes | None = None
    url: WireStr | None = None
    name: WireStr | None = None


InputPart = Annotated[TextPart | MediaPart, Field(discriminator="type")]


class UserInput(BaseModel):
    """What the user said: one or more text / media parts (a plain `str` becomes one text part)."""

    model_config = _frozen()
    parts: tuple[InputPart, ...] = Field(min_length=1)

    @classmethod
    def text(cls, text: str) -> UserInput:
        """Build a text-only input."""
        return cls(parts=(TextPart(text=text),))

    def as_text(self) -> str:
        """The concatenated text parts (media parts are skipped)."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    def canonical_bytes(self) -> bytes:
        """A deterministic encoding used for input hashing and size checks."""
        packed: bytes = msgpack.packb(self.model_dump(mode="python"), use_bin_type=True)
        return packed


def _coerce_input(value: Any) -> Any:
    if isinstance(value, str):
        return UserInput.text(value)
    return value


class Principal(BaseModel):
    """Who initiated a submit; carried to the agent, never checked by the router."""

    model_config = _frozen()
    id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_LENGTH), _UTF8]
    attributes: PrimitiveMap = Field(default_factory=dict)


def field_errors(exc: ValidationError, whole: str | None = "request") -> str:
    """Each failing field as "<field path>: <rule>", joined by "; " (no pydantic noise); a
    rule about the whole model is prefixed with `whole` (or with nothing when None)."""
    parts: list[str] = []
    for error in exc.errors():
        ctx = error.get("ctx") or {}
        inner = ctx.get("error")
        if isinstance(inner, InvalidRequestError):
            parts.append(inner.message)  # already "<field>: <rule>" (a nested __init__)
            continue
        loc = [_printable(str(p)) for p in error["loc"]]
        subpath = ctx.get("subpath")
        if isinstance(subpath, str) and subpath:
            loc.append(subpath)
        rule = error["msg"]
        if error["type"] == "value_error" and inner is not None:
            rule = str(inner)  # the validator's own words, without "Value error, "
        where = ".".join(loc) or whole
        parts.append(f"{where}: {_printable(rule)}" if where else _printable(rule))
    return "; ".join(parts)


def invalid_request(exc: ValidationError) -> InvalidRequestError:
    """An InvalidRequestError naming each failing field and the rule it broke."""
    return InvalidRequestError(field_errors(exc))


class _CheckedOnBuild(BaseModel):
    """A value the application builds (an agent's output, a transcript entry): building one
    that breaks a rule raises a ValueError saying "invalid <Model>: <field path>: <rule>"."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            errors = field_errors(exc, whole=None)
            raise ValueError(f"invalid {type(self).__name__}: {errors}") from None


class SubmitRequest(BaseModel):
    """One user message for a session; validated at the edge.

    Raises:
        InvalidRequestError: a field breaks its rule (the message names field and rule).
    """

    model_config = _frozen()

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_request(exc) from None

    session_id: StrictStr = Field(min_length=1, max_length=MAX_ID_LENGTH)
    agent_ref: StrictStr = Field(min_length=1, max_length=MAX_ID_LENGTH)
    input: UserInput
    context_discriminator: (
        Annotated[StrictStr, Field(min_length=1, max_length=100), _UTF8] | None
    ) = None
    options: PrimitiveMap = Field(default_factory=dict)
    submit_options: PrimitiveMap = Field(default_factory=dict)
    open_attributes: AttributeMap = Field(default_factory=dict)
    idempotency_key: (
        Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_LENGTH), _UTF8] | None
    ) = None
    #: A Priority, its name (any case) or its value 0 / 1 / 2 (a plain int; never a bool or a
    #: float).
    priority: Priority = Priority.NEXT
    initiator: Principal | None = None
    #: The caller's trace context (a TraceContext, its fields, or a W3C `traceparent` string):
    #: the turn's spans and frames join that trace. Not part of what makes two submits the
    #: same request.
    trace: TraceContext | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _text_input(cls, value: Any) -> Any:
        return _coerce_input(value)

    @field_validator("trace", mode="before")
    @classmethod
    def _traceparent(cls, value: Any) -> Any:
        return coerce_trace(value)

    @field_validator("session_id")
    @classmethod
    def _session_charset(cls, value: str) -> str:
        if not _SESSION_ID.fullmatch(value):
            raise ValueError(
                "must start with a letter or digit and contain only letters, digits and ._:@/+=-"
            )
        return value

    @field_validator("agent_ref")
    @classmethod
    def _agent_charset(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                "must start with a letter or digit and contain only letters, digits and ._:@/+=-"
            )
        return value

    @field_validator("context_discriminator")
    @classmethod
    def _discriminator(cls, value: str | None) -> str | None:
        if value is not None and (":" in value or any(c.isspace() for c in value)):
            raise ValueError("must not contain whitespace or ':'")
        return value

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_name(cls, value: Any) -> Any:
        if isinstance(value, Priority):
            return value
        if isinstance(value, str):
            try:
                return Priority[value.upper()]
            except KeyError:
                shown = _printable(value[:40])
                raise ValueError(f"unknown priority {shown!r}; use NOW, NEXT or LATER") from None
        if type(value) is int and value in {p.value for p in Priority}:
            return Priority(value)
        if type(value) is int:
            raise ValueError(f"unknown priority {value}; use NOW, NEXT or LATER (or 0, 1, 2)")
        raise ValueError(
            f"must be NOW, NEXT or LATER (or 0, 1, 2), not {_type_name(value)} {value!r}"[:200]
        )

    @model_validator(mode="after")
    def _bounded_maps(self) -> Self:
        maps: dict[str, Any] = {
            "options": self.options,
            "submit_options": self.submit_options,
            "open_attributes": self.open_attributes,
        }
        if self.initiator is not None:
            maps["initiator"] = self.initiator.model_dump(mode="python")
        for name, value in maps.items():
            size = encoded_size(value)
            if size > MAX_MAP_BYTES:
                raise InvalidRequestError(
                    f"{name}: encoded size {size} bytes exceeds {MAX_MAP_BYTES} bytes"
                )
        return self

    def input_hash(self) -> str:
        """SHA-256 over what makes two submits 'the same request' for idempotency."""
        digest = hashlib.sha256()
        digest.update(self.agent_ref.encode())
        digest.update(b"\x00")
        digest.update((self.context_discriminator or "").encode())
        digest.update(b"\x00")
        digest.update(self.input.canonical_bytes())
        return digest.hexdigest()


class TranscriptEntry(_CheckedOnBuild):
    """One entry of a session's committed history.

    Raises:
        ValueError: a field breaks its rule ("invalid TranscriptEntry: <field>: <rule>").
    """

    model_config = _frozen()
    role: Annotated[StrictStr, Field(min_length=1, max_length=100), _UTF8]
    content: WireStr
    #: Structured data: a framework's own message (its JSON form), tool arguments, ...
    data: JsonMap = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        size = encoded_size({"role": self.role, "content": self.content, "data": self.data})
        if size > MAX_ENTRY_BYTES:
            raise ValueError(f"encoded size {size} bytes exceeds {MAX_ENTRY_BYTES} bytes")
        return self


class CommittedEntry(TranscriptEntry):
    """A transcript entry as stored: with the turn and fencing token that committed it."""

    turn_id: StrictStr
    token: StrictInt
    #: Committed from a turn the user interrupted (`RouterConfig.commit_partial_on_interrupt`):
    #: what the agent had staged when it stopped, not a finished exchange.
    partial: StrictBool = False


class TurnOutput(_CheckedOnBuild):
    """What an agent returns from a turn.

    Raises:
        ValueError: a field breaks its rule ("invalid TurnOutput: <field>: <rule>"); raised
            inside `run_turn`, it ends the turn FAILED with that message.
    """

    model_config = _frozen()
    text: WireStr = ""
    data: PrimitiveMap = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        size = encoded_size({"text": self.text, "data": self.data})
        if size > MAX_OUTPUT_BYTES:
            raise ValueError(
                f"encoded size {size} bytes exceeds {MAX_OUTPUT_BYTES} bytes (text and data)"
            )
        return self


class TurnResult(BaseModel):
    """What a caller receives when a turn succeeded."""

    model_config = _frozen()
    session_id: str
    turn_id: str
    executed_by: str
    text: str = ""
    data: PrimitiveMap = Field(default_factory=dict)
