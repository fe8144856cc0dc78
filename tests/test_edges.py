"""Input and output edges: every value that crosses a node boundary is a msgpack primitive the
wire can carry, refused at the edge with a message naming the field and the rule."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from stickless import (
    FailureCode,
    InvalidRequestError,
    LiveSession,
    Priority,
    RouterConfig,
    SubmitKind,
    SubmitRequest,
    TranscriptEntry,
    TurnContext,
    TurnFailedError,
    TurnOutput,
)
from stickless.actors import TurnWork
from stickless.backends.base import ReservationState
from stickless.testing import LocalCluster
from stickless.wire import (
    Envelope,
    Outcome,
    WireError,
    pack,
    unpack,
)
from tests.liveness import acquire_lease

from .agents import Journal, ScriptedOpener, req, wait_until
from .conftest import FAST

GOOD: dict[str, Any] = {"session_id": "s1", "agent_ref": "bot", "input": "hi"}


def nested(depth: int) -> Any:
    """A value nested `depth` containers deep (depth 0: a plain primitive)."""
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


# --------------------------------------------------------------------------- 1. agent outputs

#: Input text -> what the agent does (returns a bad TurnOutput, or raises).
BAD_OUTPUTS: dict[str, Any] = {
    "int-too-big": lambda: TurnOutput(text="ok", data={"n": 2**70}),
    "int-too-small": lambda: TurnOutput(text="ok", data={"n": -(2**63) - 1}),
    "surrogate-text": lambda: TurnOutput(text="bad \ud800 text"),
    "surrogate-value": lambda: TurnOutput(data={"s": "bad \udfff"}),
    "surrogate-key": lambda: TurnOutput(data={"\ud800": 1}),
    "too-large": lambda: TurnOutput(text="x" * (9 * 1024 * 1024)),
}


class BadOutputSession:
    """Builds its output from the input text (see BAD_OUTPUTS); raises for 'raise:<msg>'."""

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        text = turn.input.as_text()
        if text.startswith("raise:"):
            raise RuntimeError(text.removeprefix("raise:") + " \ud800")
        if text in BAD_OUTPUTS:
            output: TurnOutput = BAD_OUTPUTS[text]()
            return output
        return TurnOutput(text=f"fine:{text}", data={"max": 2**64 - 1, "min": -(2**63)})

    async def interrupt(self, reason: str) -> None:
        pass

    async def aclose(self) -> None:
        pass


class BadOutputOpener:
    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return BadOutputSession()


async def reservation_state(cluster: LocalCluster, key: str) -> ReservationState | None:
    found = await cluster.backends.idempotency.find("s1", "c:" + key)
    return None if found is None else found.state


@pytest.mark.parametrize(
    ("text", "field", "rule"),
    [
        ("int-too-big", "data.n", "msgpack"),
        ("int-too-small", "data.n", "msgpack"),
        ("surrogate-text", "text", "UTF-8"),
        ("surrogate-value", "data.s", "UTF-8"),
        ("surrogate-key", "data", "UTF-8"),
        ("too-large", "TurnOutput", "bytes"),
    ],
)
async def test_agent_output_that_cannot_cross_the_wire_fails_the_turn_clearly(
    text: str, field: str, rule: str
) -> None:
    async with LocalCluster(1, opener=BadOutputOpener(), **FAST) as cluster:
        node = cluster.nodes[0]
        # When the agent builds an output the wire cannot carry
        with pytest.raises(TurnFailedError) as first:
            await (await node.submit(req("s1", text, idempotency_key="k"))).result
        # Then the turn ended FAILED with a message naming the field and the rule
        assert first.value.code is FailureCode.FAILED
        assert first.value.detail.startswith("ValueError: invalid TurnOutput: ")
        assert field in first.value.detail and rule in first.value.detail
        assert "errors.pydantic.dev" not in first.value.detail
        # And its reservation was recorded (nothing wedged IN_FLIGHT)
        assert await reservation_state(cluster, "k") is ReservationState.FAILED
        # And a same-key retry gets the same answer (a recorded failure runs afresh)
        with pytest.raises(TurnFailedError) as again:
            await asyncio.wait_for(
                (await node.submit(req("s1", text, idempotency_key="k"))).result, 5
            )
        assert (again.value.code, again.value.detail) == (first.value.code, first.value.detail)
        # And the session still serves good turns, with ints at both ends of the range
        result = await (await node.submit(req("s1", "good"))).result
        assert result.data == {"max": 2**64 - 1, "min": -(2**63)}


async def test_forwarded_turn_with_a_bad_output_is_answered_on_the_submitting_node() -> None:
    async with LocalCluster(2, opener=BadOutputOpener(), **FAST) as cluster:
        a, b = cluster.nodes
        await (await a.submit(req("s1", "claim"))).result
        # When a turn forwarded from B to A ends with an output the wire cannot carry
        disp = await b.submit(req("s1", "int-too-big", idempotency_key="k"))
        assert disp.kind is SubmitKind.FORWARDED
        # Then B's caller gets the failure at once (not FORWARD_TIMEOUT after forward_ttl)
        with pytest.raises(TurnFailedError) as error:
            await asyncio.wait_for(disp.result, 5)
        assert error.value.code is FailureCode.FAILED
        assert "data.n: int 1180591620717411303424 is outside msgpack's range" in str(error.value)
        assert await reservation_state(cluster, "k") is ReservationState.FAILED


async def test_agent_error_with_a_lone_surrogate_is_recorded_not_retried_forever() -> None:
    async with LocalCluster(1, opener=BadOutputOpener(), **FAST) as cluster:
        node = cluster.nodes[0]
        with pytest.raises(TurnFailedError) as error:
            await (await node.submit(req("s1", "raise:boom", idempotency_key="k"))).result
        assert error.value.code is FailureCode.FAILED
        assert "RuntimeError: boom" in error.value.detail

        async def recorded() -> bool:
            return await reservation_state(cluster, "k") is ReservationState.FAILED

        # The failure's message is made encodable, so its outcome is recorded at once
        await wait_until(recorded, within=3)


def test_outcome_messages_are_always_encodable() -> None:
    outcome = Outcome.failure("t", FailureCode.FAILED, "bad \ud800" + "x" * 100_000)
    decoded = Outcome.decode(outcome.encode())
    assert decoded.message.startswith("bad \ufffd")
    assert len(decoded.message) <= 16 * 1024


def test_transcript_entries_are_checked_when_built() -> None:
    with pytest.raises(ValueError, match=r"invalid TranscriptEntry: data\.n: .*msgpack"):
        TranscriptEntry(role="assistant", content="x", data={"n": 2**64})
    with pytest.raises(ValueError, match=r"content: .*UTF-8"):
        TranscriptEntry(role="assistant", content="\udc80")


@pytest.mark.parametrize(
    "value",
    [
        {"n": 2**70},
        {"s": "\ud800"},
        {"\ud800": 1},
        object(),
        [1, {"deep": {2**64}}],
    ],
)
def test_pack_raises_wire_error_for_anything_it_cannot_encode(value: Any) -> None:
    with pytest.raises(WireError):
        pack(value)


def test_pack_encodes_the_range_ends_and_non_finite_floats() -> None:
    value = {"max": 2**64 - 1, "min": -(2**63), "nan": float("nan"), "inf": float("-inf")}
    decoded = unpack(pack(value))
    assert (decoded["max"], decoded["min"], decoded["inf"]) == (2**64 - 1, -(2**63), float("-inf"))
    assert decoded["nan"] != decoded["nan"]


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        ({"submit_options": {"n": 2**64}}, "submit_options.n", "msgpack's range"),
        ({"options": {"n": -(2**63) - 1}}, "options.n", "msgpack's range"),
        ({"options": {"s": "\ud800"}}, "options.s", "UTF-8"),
        ({"submit_options": {"\udc00": 1}}, "submit_options", "UTF-8"),
        ({"initiator": {"id": "u", "attributes": {"n": 2**70}}}, "initiator.attributes.n", ""),
        ({"initiator": {"id": "\ud800"}}, "initiator.id", "UTF-8"),
        ({"open_attributes": {"x": object()}}, "open_attributes.x", "must be"),
        ({"open_attributes": {"a": [1, {"n": 2**64}]}}, "open_attributes.a.1.n", "range"),
        ({"open_attributes": {"a": {"\ud800": 1}}}, "open_attributes.a", "UTF-8"),
        ({"open_attributes": {"a": {1: 2}}}, "open_attributes.a", "keys must be str"),
        ({"open_attributes": {"deep": nested(9)}}, "open_attributes.deep", "8 levels"),
        ({"open_attributes": {"big": "x" * 70_000}}, "open_attributes", "65536 bytes"),
        ({"submit_options": {"big": "x" * 70_000}}, "submit_options", "65536 bytes"),
        ({"idempotency_key": "k\ud800"}, "idempotency_key", "UTF-8"),
        ({"context_discriminator": "c\ud800"}, "context_discriminator", "UTF-8"),
    ],
)
def test_request_values_must_be_wire_primitives(
    change: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(InvalidRequestError) as error:
        SubmitRequest(**{**GOOD, **change})
    message = str(error.value)
    assert message.startswith(field), message  # the field's path (down to the bad value)
    assert message.count(": ") == 1 and rule in message
    assert "Value error" not in message
    message.encode()  # the message itself can cross the wire


def test_request_accepts_the_wire_range_and_normalizes_containers() -> None:
    request = SubmitRequest(
        **GOOD,
        options={"max": 2**64 - 1, "min": -(2**63), "nan": float("nan"), "f": 1.5},
        open_attributes={"t": (1, (2, 3)), "deep": nested(8), "b": b"\x00", "n": None},
    )
    assert request.options["max"] == 2**64 - 1
    # Tuples become lists: the opener sees the same value whether local or forwarded
    assert request.open_attributes["t"] == [1, [2, 3]]
    assert unpack(pack(dict(request.open_attributes))) == dict(request.open_attributes)


async def test_unencodable_submit_options_are_refused_locally_and_when_forwarded(
    journal: Journal,
) -> None:
    async with LocalCluster(2, opener=ScriptedOpener(journal), **FAST) as cluster:
        a, b = cluster.nodes
        await (await a.submit(req("s1", "claim"))).result
        for node in (a, b):  # A holds s1 (a local turn), B would forward to A
            with pytest.raises(InvalidRequestError, match=r"^submit_options\.n: "):
                await node.submit(req("s1", "x", submit_options={"n": 2**70}, idempotency_key="k"))
        # And nothing was reserved: the key is free for another input
        disp = await b.submit(req("s1", "other", idempotency_key="k"))
        assert disp.kind is SubmitKind.FORWARDED
        assert (await disp.result).text == "echo:other"


# --------------------------------------------------------------------------- 2. the envelope


def test_envelope_carries_options_and_open_attributes() -> None:
    request = SubmitRequest(
        **GOOD, options={"model": "m1"}, open_attributes={"tenant": "t1", "tags": ("a", "b")}
    )
    work = TurnWork.from_request(request, "turn-1", "c:k", "node-a")
    decoded = TurnWork.from_envelope(Envelope.decode(work.to_envelope().encode()))
    assert decoded.options == {"model": "m1"}
    assert decoded.open_attributes == {"tenant": "t1", "tags": ["a", "b"]}


async def test_forwarded_turn_that_opens_the_handle_passes_options_and_attributes(
    journal: Journal,
) -> None:
    async with LocalCluster(2, opener=ScriptedOpener(journal), **FAST) as cluster:
        a, b = cluster.nodes
        # Given the store says A holds s1, but A has no actor and no live handle for it yet
        # (as after a doorbell claim): the first turn to reach A is a forwarded one
        await acquire_lease(cluster.backends, "s1", a.node_id, FAST["lease_ttl"])
        assert journal.opened == []
        # When B submits the session's first turn (forwarded to A, which opens the handle)
        disp = await b.submit(
            req("s1", "hello", options={"model": "m1"}, open_attributes={"tenant": {"id": 7}})
        )
        result = await disp.result
    # Then A's opener saw the same attributes a local first turn would have given it
    assert disp.kind is SubmitKind.FORWARDED
    assert result.executed_by == a.node_id
    assert journal.opened == [("s1", "bot", {"options": {"model": "m1"}, "tenant": {"id": 7}})]


# --------------------------------------------------------------------------- 3. input edges


@pytest.mark.parametrize("field", ["session_id", "agent_ref"])
@pytest.mark.parametrize("value", ["abc\n", "abc\r\n", "\nabc"])
def test_ids_with_line_breaks_are_refused(field: str, value: str) -> None:
    with pytest.raises(InvalidRequestError, match=f"^{field}: must start with"):
        SubmitRequest(**{**GOOD, field: value})


def test_node_id_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ValueError, match="node_id"):
        RouterConfig(node_id="n1\n")


async def test_lone_surrogate_in_the_input_is_an_invalid_request(cluster: LocalCluster) -> None:
    node = cluster.nodes[0]
    for request in (
        {**GOOD, "input": "bad \ud800"},
        {**GOOD, "input": {"parts": [{"type": "text", "text": "\udfff"}]}},
    ):
        with pytest.raises(InvalidRequestError, match=r"^input\.(parts\.0\.text\.)?text: .*UTF-8"):
            await node.submit(request)


@pytest.mark.parametrize("value", [True, False, 1.0, 0.0, "1", "", None, [1]])
def test_priority_refuses_bools_floats_and_other_types(value: Any) -> None:
    with pytest.raises(InvalidRequestError, match=r"^priority: "):
        SubmitRequest(**GOOD, priority=value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Priority.NOW, Priority.NOW),
        ("now", Priority.NOW),
        ("Later", Priority.LATER),
        ("NEXT", Priority.NEXT),
        (0, Priority.NOW),
        (2, Priority.LATER),
    ],
)
def test_priority_accepts_the_enum_its_names_and_its_values(value: Any, expected: Any) -> None:
    assert SubmitRequest(**GOOD, priority=value).priority is expected


async def test_messages_name_the_field_and_rule_once(cluster: LocalCluster) -> None:
    node = cluster.nodes[0]
    # A mapping (as a web adapter passes it) and a model give the same one-line message
    for submit in (
        lambda: node.submit({**GOOD, "session_id": "bad id"}),
        lambda: node.submit(SubmitRequest(**{**GOOD, "session_id": "bad id"})),
    ):
        with pytest.raises(InvalidRequestError) as error:
            await submit()
        assert str(error.value) == (
            "session_id: must start with a letter or digit and contain only letters, "
            "digits and ._:@/+=-"
        )
    with pytest.raises(InvalidRequestError) as error:
        await node.submit({**GOOD, "submit_options": {"x": [1, 2]}})
    assert str(error.value) == (
        "submit_options.x: must be a str, int, float, bool or None, not list"
    )


@pytest.mark.parametrize(
    "after",
    [
        "garbage",
        "",
        "-1",
        "1-",
        "-",
        "1-2-3",
        " 1-0",
        "1-0 ",
        "1_000-0",
        "+1-0",
        "\u0661-0",
        "18446744073709551616-0",
        "0-18446744073709551616",
        "1-0\n",
    ],
)
async def test_events_with_a_malformed_cursor_is_refused_at_call_time(
    cluster: LocalCluster, after: str
) -> None:
    node = cluster.nodes[0]
    control = node._control  # (nothing may be registered)
    with pytest.raises(InvalidRequestError, match=r"^after: "):
        node.events("s1", after=after)
    assert not control._hub.has("s1")
    assert "s1" not in control._event_channels


@pytest.mark.parametrize("after", ["0-0", "0", "1700000000000-5", "18446744073709551615-0"])
async def test_events_accepts_well_formed_cursors(cluster: LocalCluster, after: str) -> None:
    stream = cluster.nodes[0].events("s1", after=after)
    await stream.aclose()


# --------------------------------------------------------------------------- 4. configuration


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"lease_ttl": 30, "lease_extend_interval": 10, "idempotency_secondary_ttl": 10},
            "idempotency_secondary_ttl",
        ),
        (
            {"lease_ttl": 30, "lease_extend_interval": 10, "idempotency_secondary_ttl": 5},
            "idempotency_secondary_ttl",
        ),
        ({"lease_extend_interval": 0.5, "watchdog_timeout": 0.25}, "watchdog_timeout"),
        (
            {"lease_ttl": 30, "lease_extend_interval": 10, "watchdog_timeout": 1.0},
            "watchdog_timeout",
        ),
        ({"max_input_bytes": 32 * 1024 * 1024}, "max_input_bytes"),
    ],
)
def test_config_rejects_combinations_that_break_a_guarantee(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RouterConfig(**overrides)


def test_config_accepts_the_timings_the_tests_and_demos_use() -> None:
    from stickless.bench.failover import SHORT
    from stickless.cli import DEMO_CONFIG
    from stickless.ray._demo import RAY_DEMO_CONFIG

    from .mp_cluster import FAST_CONFIG
    from .test_failures import QUICK
    from .test_invariants import SETTINGS

    for timings in (
        FAST,
        QUICK,
        SETTINGS,
        FAST_CONFIG,
        SHORT,
        DEMO_CONFIG,
        RAY_DEMO_CONFIG,
        {**QUICK, "watchdog_timeout": 0.5},
        {**QUICK, "watchdog_timeout": 2.0},
    ):
        RouterConfig(**timings)
    RouterConfig(lease_ttl=30, lease_extend_interval=10, watchdog_timeout=1.5)
    RouterConfig(max_input_bytes=16 * 1024 * 1024)


async def test_an_interrupt_reason_that_cannot_travel_is_refused() -> None:
    from stickless import InvalidRequestError
    from stickless.testing import LocalCluster

    from .agents import Journal, ScriptedOpener

    async with LocalCluster(1, opener=ScriptedOpener(Journal())) as cluster:
        for reason in ("", "\ud800", "x" * 201):
            with pytest.raises(InvalidRequestError, match="reason"):
                await cluster.nodes[0].interrupt("s1", reason=reason)
