"""`decode_entries`: every removed inbox entry comes back exactly once, readable or not, and
nothing about one entry can raise out of the batch."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stickless._types import UserInput
from stickless.backends.base import decode_entries
from stickless.wire import Envelope, pack


def _good(turn_id: str, enqueued_at: float = 0.0) -> bytes:
    return Envelope(
        session_id="s1",
        turn_id=turn_id,
        agent_ref="agent-a",
        input=UserInput.text("hi"),
        key=f"key-{turn_id}",
        enqueued_at=enqueued_at,
    ).encode()


_values: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=40),
    st.lists(st.integers(), max_size=3),
    st.builds(object),
    st.just(_good("t-any")),
    st.builds(lambda v: pack({"turn_id": v, "key": v}), st.text(max_size=5)),
)


@given(st.lists(st.tuples(_values, _values), max_size=8))
def test_no_entry_can_raise_and_each_comes_back_once(raw: list[tuple[Any, Any]]) -> None:
    # Given good entries interleaved with arbitrary (data, arrival) pairs
    entries: list[tuple[str, Any, Any]] = []
    for n, (data, arrival) in enumerate(raw):
        entries.append((f"good-{n}", _good(f"g{n}"), 100.0 + n))
        entries.append((f"raw-{n}", data, arrival))
    # When they are decoded
    batch = decode_entries("s1", entries)
    # Then nothing raised, every good one is readable, and every entry came back exactly once
    ids = [m.message_id for m in batch.messages] + [u.message_id for u in batch.unreadable]
    assert sorted(ids) == sorted(message_id for message_id, _, _ in entries)
    assert {f"good-{n}" for n in range(len(raw))} <= {m.message_id for m in batch.messages}
    for message in batch.messages:
        assert math.isfinite(message.envelope.enqueued_at)


@pytest.mark.parametrize(
    ("arrival", "stamped"), [(12.5, 12.5), (b"12.5", 12.5), ("7", 7.0), (3, 3.0)]
)
def test_arrival_of_any_numeric_form_stamps_an_unstamped_envelope(
    arrival: Any, stamped: float
) -> None:
    batch = decode_entries("s1", [("m1", _good("t1"), arrival)])
    assert [m.envelope.enqueued_at for m in batch.messages] == [stamped]


def test_unreadable_reason_never_carries_the_payload(caplog: pytest.LogCaptureFixture) -> None:
    # Given an entry whose envelope is fine but whose arrival is junk, and one of the wrong type
    with caplog.at_level(logging.WARNING):
        batch = decode_entries(
            "s1", [("m1", _good("t-secret"), b"junk"), ("m2", {"SECRET": "do-not-log"}, 1.0)]
        )
    # Then both are unreadable, each logged once, and neither reason nor log shows the payload
    assert [u.message_id for u in batch.unreadable] == ["m1", "m2"]
    assert batch.unreadable[0].turn_id == "t-secret"
    assert all("do-not-log" not in u.reason for u in batch.unreadable)
    assert "do-not-log" not in caplog.text
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
