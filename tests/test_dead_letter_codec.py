"""Dead-letter values: deterministic bounded ids, the packed layout and its bounded decode."""

from __future__ import annotations

import struct
from dataclasses import replace

import msgpack
import pytest

from stickless._types import MAX_ID_LENGTH, MAX_MESSAGE_CHARS, UserInput
from stickless.backends.base import (
    MAX_RAW_BYTES,
    AttemptRecord,
    DeadLetter,
    check_letter,
    letter_for_envelope,
    letter_id_for,
    letter_session,
    pack_letter,
    stamp_of,
    unpack_letter,
)
from stickless.wire import Envelope, WireError


def _letter(**changes: object) -> DeadLetter:
    envelope = Envelope(
        session_id="s1", turn_id="t1", agent_ref="a", input=UserInput.text("hi"), key="c:k"
    )
    letter = letter_for_envelope(
        envelope, "m-1", "boom", [AttemptRecord(attempt=1, node="n", error="E", at=1.0)]
    )
    return replace(letter, **changes)


def test_letter_ids_are_deterministic_bounded_and_name_their_session() -> None:
    session = "s" * MAX_ID_LENGTH
    first = letter_id_for(session, "t" * MAX_ID_LENGTH, "m-1")
    assert first == letter_id_for(session, "t" * MAX_ID_LENGTH, "m-1")
    assert len(first) <= MAX_ID_LENGTH + 33 and "{" not in first and "}" not in first
    assert letter_session(first) == session
    # Every part of the address matters, and a missing turn differs from an empty one
    ids = {
        letter_id_for("s", "t", "m"),
        letter_id_for("s", "t", ""),
        letter_id_for("s", None, "m"),
        letter_id_for("s", "", "m"),
        letter_id_for("s2", "t", "m"),
    }
    assert len(ids) == 5
    assert letter_session("no separator") is None
    assert letter_session("s~short") is None


def test_a_letter_filed_under_another_session_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="letter_id"):
        check_letter(_letter(session_id="s2"))


def test_pack_round_trip_and_the_fixed_header() -> None:
    letter = _letter(dead_at=1234.5)
    packed = pack_letter(letter)
    assert packed[:3] == b"\x93\x01\xcb"
    assert struct.unpack(">d", packed[3:11])[0] == 1234.5 == stamp_of(packed)
    assert unpack_letter(packed) == letter
    # dead_at 0 packs as eight zero bytes (what the Lua prelude stamps in place)
    assert pack_letter(_letter())[3:11] == bytes(8)


def test_free_text_raw_bytes_and_attempts_are_bounded_at_construction() -> None:
    letter = _letter(
        reason="r" * (MAX_MESSAGE_CHARS + 10),
        raw=b"x" * (MAX_RAW_BYTES + 1),
        attempts=tuple(AttemptRecord(attempt=i, node="n", error="e", at=1.0) for i in range(150)),
    )
    assert len(letter.reason) == MAX_MESSAGE_CHARS
    assert letter.raw is not None and len(letter.raw) == MAX_RAW_BYTES
    assert [a.attempt for a in letter.attempts] == list(range(50, 150))
    assert unpack_letter(pack_letter(letter)) == letter
    with pytest.raises(ValueError, match="dead_at"):
        _letter(dead_at=float("nan"))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xc1", "undecodable"),
        (msgpack.packb([2, 0.0, {}]), "layout"),
        (msgpack.packb([1, "later", {}]), "dead_at"),
        (msgpack.packb([1, 0.0, {"id": "x", "session": "s", "reason": 5}]), "reason"),
        (
            msgpack.packb(
                [
                    1,
                    0.0,
                    {"id": "x", "session": "s", "reason": "r", "raw": b"x" * (MAX_RAW_BYTES + 1)},
                ]
            ),
            "raw",
        ),
        (
            msgpack.packb(
                [1, 0.0, {"id": "x", "session": "s", "reason": "r", "envelope": b"\x01"}]
            ),
            "envelope",
        ),
    ],
)
def test_bytes_that_are_not_a_letter_raise_a_wire_error_saying_why(data: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        unpack_letter(data)
