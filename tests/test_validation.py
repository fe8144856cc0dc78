"""Bad input is refused at the edge with a clear error and leaves nothing behind."""

from __future__ import annotations

import pickle
import re
from typing import Any

import pytest

from stickless import (
    BackendUnavailableError,
    ConflictingAgentError,
    FailureCode,
    IdempotencyConflictError,
    InvalidRequestError,
    RouterClosedError,
    RouterConfig,
    SessionBusyError,
    SubmitRequest,
    TranscriptEntry,
    TurnFailedError,
    TurnOutput,
)
from stickless.testing import LocalCluster

from .agents import Journal

GOOD: dict[str, Any] = {"session_id": "s1", "agent_ref": "bot", "input": "hi"}


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        ({"session_id": ""}, "session_id", "at least 1 character"),
        ({"session_id": "x" * 201}, "session_id", "at most 200 characters"),
        ({"session_id": "bad id"}, "session_id", "only letters"),
        ({"agent_ref": ""}, "agent_ref", "at least 1 character"),
        ({"context_discriminator": "a:b"}, "context_discriminator", "whitespace or ':'"),
        ({"context_discriminator": "a b"}, "context_discriminator", "whitespace or ':'"),
        ({"priority": "URGENT"}, "priority", "unknown priority"),
        ({"priority": 7}, "priority", "priority"),
        ({"submit_options": {"x": object()}}, "submit_options.x", ""),
        ({"submit_options": {"x": [1, 2]}}, "submit_options.x", ""),
        ({"options": {"nested": {"a": 1}}}, "options.nested", ""),
        ({"idempotency_key": ""}, "idempotency_key", "at least 1 character"),
        ({"input": 5}, "input", ""),
    ],
)
def test_request_model_names_the_field_and_rule(
    change: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(InvalidRequestError) as error:
        SubmitRequest(**{**GOOD, **change})
    assert isinstance(error.value, ValueError)
    assert field in str(error.value)
    assert rule in str(error.value)


async def test_invalid_submit_leaves_no_reservation(
    cluster: LocalCluster, journal: Journal
) -> None:
    node = cluster.nodes[0]
    # When a malformed request (as a mapping from a web adapter) carries a key
    with pytest.raises(InvalidRequestError, match="context_discriminator"):
        await node.submit({**GOOD, "idempotency_key": "k", "context_discriminator": "a:b"})
    # Then the key was never reserved: a valid request with a different input may use it
    disp = await node.submit({**GOOD, "input": "other", "idempotency_key": "k"})
    assert (await disp.result).text == "echo:other"


async def test_oversized_input_is_refused_before_reservation(journal: Journal) -> None:
    from .conftest import make_cluster

    async with make_cluster(journal, max_input_bytes=64) as cluster:
        node = cluster.nodes[0]
        with pytest.raises(InvalidRequestError, match="max_input_bytes"):
            await node.submit({**GOOD, "input": "x" * 100, "idempotency_key": "k"})
        disp = await node.submit({**GOOD, "input": "small", "idempotency_key": "k"})
        assert (await disp.result).text == "echo:small"
        assert journal.texts("s1") == ["small"]


def test_data_models_reject_non_primitives() -> None:
    with pytest.raises(ValueError):
        TurnOutput(text="x", data={"when": object()})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        TurnOutput(text="x", data={"nested": {"a": 1}})  # type: ignore[dict-item]


def test_a_transcript_entry_holds_bounded_json_data() -> None:
    # Nested maps and lists of JSON values are kept (tuples as lists, as msgpack gives back)
    message = {"parts": [{"kind": "text", "content": "hi"}, {"args": (1, 2.5, None, True)}]}
    entry = TranscriptEntry(role="assistant", content="hi", data={"message": message})
    assert entry.data == {
        "message": {"parts": [{"kind": "text", "content": "hi"}, {"args": [1, 2.5, None, True]}]}
    }
    # What JSON cannot say, or too deep, or too big, is refused naming where and why
    deep: dict[str, object] = {}
    for _ in range(9):
        deep = {"d": deep}
    for data, rule in (
        ({"blob": b"x"}, "data.blob: must be a str, int, float, bool or None, not bytes"),
        ({"m": {1: "x"}}, "data.m: map keys must be str, not int"),
        ({"when": {"at": object()}}, "data.when.at: must be a str, int, float, bool or None"),
        (deep, "must nest at most 8 levels deep"),
        ({"big": "x" * (1024 * 1024)}, "encoded size 1048"),
    ):
        with pytest.raises(ValueError, match=re.escape(rule)):
            TranscriptEntry(role="user", content="x", data=data)


@pytest.mark.parametrize(
    "error",
    [
        ConflictingAgentError("bound"),
        IdempotencyConflictError("k"),
        SessionBusyError("busy"),
        BackendUnavailableError("down"),
        RouterClosedError("closed"),
        InvalidRequestError("bad"),
        TurnFailedError(FailureCode.HOLDER_LOST, "gone", session_id="s", turn_id="t"),
        TurnFailedError.of(FailureCode.CONFLICTING_AGENT, "other agent"),
    ],
)
def test_errors_pickle_round_trip(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    if isinstance(error, TurnFailedError):
        assert isinstance(copy, TurnFailedError)
        assert (copy.code, copy.session_id, copy.turn_id) == (
            error.code,
            error.session_id,
            error.turn_id,
        )


def test_unknown_failure_codes_decode_as_failed() -> None:
    assert FailureCode.parse("FROM_THE_FUTURE") is FailureCode.FAILED
    assert FailureCode.parse("EVICTED") is FailureCode.EVICTED


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lease_ttl": 5, "lease_extend_interval": 5}, "lease_extend_interval"),
        ({"lease_ttl": -1}, "lease_ttl"),
        ({"forward_ttl": 0}, "forward_ttl"),
        ({"mode": "DISTRIBUTED"}, "node_id is required"),
        ({"node_id": "has space"}, "node_id"),
    ],
)
def test_config_rejects_nonsense(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouterConfig(**overrides)


def test_config_defaults_match_the_design() -> None:
    config = RouterConfig()
    assert (config.idle_ttl, config.max_cached_sessions, config.lease_ttl) == (600, 1000, 3)
    assert (config.lease_extend_interval, config.status_heartbeat_interval) == (1, 10)
    assert (config.holder_loss_sweep_interval, config.idempotency_primary_ttl) == (1, 86400)
    assert (config.idempotency_secondary_ttl, config.forward_ttl) == (30, 300)
    assert (config.release_interrupt_timeout, config.max_input_bytes) == (5, 1_000_000)
    assert config.watchdog_timeout is None and config.effective_watchdog_timeout == 9


def test_distributed_mode_refuses_memory_backends(journal: Journal) -> None:
    from stickless import DeploymentMode, MemoryBackends, SessionRouter

    from .agents import ScriptedOpener

    config = RouterConfig(node_id="n1", mode=DeploymentMode.DISTRIBUTED)
    with pytest.raises(ValueError, match="requires backends"):
        SessionRouter.build(config=config, opener=ScriptedOpener(journal))
    with pytest.raises(ValueError, match="split the brain"):
        SessionRouter.build(
            config=config, opener=ScriptedOpener(journal), backends=MemoryBackends()
        )


def test_event_frames_with_unknown_failure_codes_degrade_to_failed() -> None:
    from stickless.wire import event_from_payload

    frame = event_from_payload(
        {"type": "turn_failed", "session_id": "s", "turn_id": "t", "seq": 3, "code": "NEWER"}
    )
    assert frame.type == "turn_failed"
    assert frame.code is FailureCode.FAILED  # type: ignore[union-attr]
