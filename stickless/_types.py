"""Public value types: requests, inputs, outputs and transcript entries."""

from __future__ import annotations

import enum
import hashlib
import re
from typing import Annotated, Any, Literal

import msgpack
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictBytes,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from ._errors import InvalidRequestError

#: A value that may cross a node boundary inside a flat map.
Primitive = StrictStr | StrictInt | StrictFloat | StrictBool | None
#: A flat map of primitives: what `data`, `options` and `submit_options` hold.
PrimitiveMap = dict[StrictStr, Primitive]

_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$")
MAX_ID_LENGTH = 200


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
    text: StrictStr


class MediaPart(BaseModel):
    """Binary or referenced media (image, document, audio) part of a user input."""

    model_config = _frozen()
    type: Literal["media"] = "media"
    mime_type: StrictStr = Field(min_length=1, max_length=200)
    data: StrictBytes | None = None
    url: StrictStr | None = None
    name: StrictStr | None = None


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
    id: StrictStr = Field(min_length=1, max_length=MAX_ID_LENGTH)
    attributes: PrimitiveMap = Field(default_factory=dict)


def invalid_request(exc: ValidationError) -> InvalidRequestError:
    """An InvalidRequestError naming each failing field and the rule it broke."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "request"
        parts.append(f"{where}: {error['msg']}")
    return InvalidRequestError("; ".join(parts))


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
    context_discriminator: StrictStr | None = Field(default=None, min_length=1, max_length=100)
    options: PrimitiveMap = Field(default_factory=dict)
    submit_options: PrimitiveMap = Field(default_factory=dict)
    open_attributes: dict[StrictStr, Any] = Field(default_factory=dict)
    idempotency_key: StrictStr | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    priority: Priority = Priority.NEXT
    initiator: Principal | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _text_input(cls, value: Any) -> Any:
        return _coerce_input(value)

    @field_validator("session_id")
    @classmethod
    def _session_charset(cls, value: str) -> str:
        if not _SESSION_ID.match(value):
            raise ValueError(
                "must start with a letter or digit and contain only letters, digits and ._:@/+=-"
            )
        return value

    @field_validator("agent_ref")
    @classmethod
    def _agent_charset(cls, value: str) -> str:
        if not _NAME.match(value):
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
        if isinstance(value, str):
            try:
                return Priority[value.upper()]
            except KeyError:
                raise ValueError(f"unknown priority {value!r}; use NOW, NEXT or LATER") from None
        return value

    def input_hash(self) -> str:
        """SHA-256 over what makes two submits 'the same request' for idempotency."""
        digest = hashlib.sha256()
        digest.update(self.agent_ref.encode())
        digest.update(b"\x00")
        digest.update((self.context_discriminator or "").encode())
        digest.update(b"\x00")
        digest.update(self.input.canonical_bytes())
        return digest.hexdigest()


class TranscriptEntry(BaseModel):
    """One entry of a session's committed history."""

    model_config = _frozen()
    role: StrictStr = Field(min_length=1, max_length=100)
    content: StrictStr
    data: PrimitiveMap = Field(default_factory=dict)


class CommittedEntry(TranscriptEntry):
    """A transcript entry as stored: with the turn and fencing token that committed it."""

    turn_id: StrictStr
    token: StrictInt


class TurnOutput(BaseModel):
    """What an agent returns from a turn."""

    model_config = _frozen()
    text: StrictStr = ""
    data: PrimitiveMap = Field(default_factory=dict)


class TurnResult(BaseModel):
    """What a caller receives when a turn succeeded."""

    model_config = _frozen()
    session_id: str
    turn_id: str
    executed_by: str
    text: str = ""
    data: PrimitiveMap = Field(default_factory=dict)
