"""W3C trace context: a submit's `traceparent` reaches the node that runs the turn, every frame
of the turn names the trace and the turn's span, and with the OpenTelemetry SDK one trace holds
the submit, the forward and the turn spans of two nodes."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stickless import (
    Event,
    FailureCode,
    InvalidRequestError,
    SubmitOrigin,
    SubmitRequest,
    TurnFailed,
    TurnStream,
)
from stickless._trace import TraceContext, Tracing
from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener, req
from .conftest import FAST, ClusterFactory

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


async def _drain(stream: TurnStream) -> list[Event]:
    async with stream:
        return [frame async for frame in stream]


def test_a_traceparent_is_parsed_by_the_w3c_rules() -> None:
    context = TraceContext.from_traceparent(TRACEPARENT)
    assert (context.trace_id, context.span_id, context.sampled) == (CALLER_TRACE, CALLER_SPAN, True)
    assert context.traceparent == TRACEPARENT
    assert not TraceContext.from_traceparent(f"00-{CALLER_TRACE}-{CALLER_SPAN}-00").sampled
    # A later version may append fields; version 00 may not, and ff is never valid.
    later = TraceContext.from_traceparent(f"01-{CALLER_TRACE}-{CALLER_SPAN}-01-extra")
    assert later.trace_id == CALLER_TRACE
    for bad in (
        f"00-{CALLER_TRACE}-{CALLER_SPAN}-01-extra",
        f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01",
        f"00-{'0' * 32}-{CALLER_SPAN}-01",
        f"00-{CALLER_TRACE}-{'0' * 16}-01",
        f"00-{CALLER_TRACE.upper()}-{CALLER_SPAN}-01",
        "not a traceparent",
    ):
        assert TraceContext.lenient(bad) is None, bad
        with pytest.raises(ValueError):
            TraceContext.from_traceparent(bad)


def test_a_submit_names_a_bad_trace_and_its_rule() -> None:
    with pytest.raises(InvalidRequestError, match="trace: traceparent must be"):
        SubmitRequest(session_id="s", agent_ref="echo", input="x", trace="00-nope")
    with pytest.raises(InvalidRequestError, match=r"trace\.span_id: must be 16 lowercase hex"):
        SubmitRequest(
            session_id="s",
            agent_ref="echo",
            input="x",
            trace={"trace_id": CALLER_TRACE, "span_id": "xyz"},
        )


async def test_every_frame_of_a_forwarded_turn_names_the_callers_trace(
    backend_cluster: LocalCluster,
) -> None:
    a, b, _ = backend_cluster.nodes
    # Given a session held by A
    await (await a.submit(req("s1", "warm up"))).result
    # When B streams a turn of it with the caller's traceparent (the turn runs on A)
    stream = await b.stream(req("s1", "one two", trace=TRACEPARENT))
    frames = await _drain(stream)
    # Then every frame, read on B, names the caller's trace and one span of the turn: a child
    # of B's submit span, which is the caller's child
    assert stream.origin is SubmitOrigin.NEW
    assert frames[0].type == "turn_started" and frames[-1].type == "turn_completed"
    assert {frame.trace_id for frame in frames} == {CALLER_TRACE}
    spans = {frame.span_id for frame in frames}
    assert len(spans) == 1 and "" not in spans
    submit = stream.disposition.trace
    assert submit is not None and submit.trace_id == CALLER_TRACE
    assert spans.isdisjoint({CALLER_SPAN, submit.span_id})


async def test_a_turn_without_a_caller_trace_starts_one_of_its_own(
    backend_cluster: LocalCluster,
) -> None:
    a, *_ = backend_cluster.nodes
    first = await _drain(await a.stream(req("s1", "one")))
    second = await _drain(await a.stream(req("s1", "two")))
    # Each turn is its own trace, and every frame of it names that trace
    first_traces = {frame.trace_id for frame in first}
    second_traces = {frame.trace_id for frame in second}
    assert len(first_traces) == len(second_traces) == 1
    assert first_traces != second_traces and "" not in first_traces | second_traces


async def test_a_turn_cancelled_before_it_ran_names_its_trace(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    gate = journal.gate("long")
    running = await a.submit(req("s1", "long"))
    await journal.entered["long"].wait()
    # A turn queued behind the running one, then cancelled: it never runs
    queued = await b.stream(req("s1", "never", trace=TRACEPARENT))
    assert await b.interrupt("s1", turn_id=queued.disposition.turn_id) is True
    frames = await _drain(queued)
    gate.set()
    await running.result
    assert [frame.type for frame in frames] == ["interrupted"]
    assert frames[0].trace_id == CALLER_TRACE and frames[0].span_id


async def test_a_retried_submit_answers_with_the_first_submits_trace(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    a, b, _ = backend_cluster.nodes
    journal.gate("slow")
    first = await a.submit(req("s1", "slow", idempotency_key="k1", trace=TRACEPARENT))
    await journal.entered["slow"].wait()
    # A retry with its own trace follows the running turn, then finds it answered
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    attached = await b.submit(req("s1", "slow", idempotency_key="k1", trace=other))
    journal.gates["slow"].set()
    await first.result
    cached = await b.submit(req("s1", "slow", idempotency_key="k1", trace=other))
    assert (attached.attached, cached.origin) == (True, SubmitOrigin.CACHED)
    assert first.trace is not None and first.trace.trace_id == CALLER_TRACE
    assert attached.trace == cached.trace == first.trace


@pytest.mark.parametrize("policy", ["fail", "retry"])
async def test_a_node_that_declares_a_holder_lost_names_the_turns_trace(
    cluster_over: ClusterFactory, journal: Journal, policy: str
) -> None:
    quick = {
        "lease_ttl": 1.0,
        "lease_extend_interval": 0.25,
        "idempotency_secondary_ttl": 0.5,
        "holder_loss_sweep_interval": 0.25,
    }
    async with cluster_over(on_holder_lost=policy, **quick) as cluster:
        a, _, c = cluster.nodes
        await (await a.submit(req("s1", "warm up"))).result
        # Given a turn of the caller's trace running on A, submitted there, watched from C
        watcher = c.events("s1", turn_id=None)
        await watcher.ready()
        journal.gate("long")
        await a.submit(req("s1", "long", trace=TRACEPARENT))
        await journal.entered["long"].wait()
        # When A dies (its caller with it) and a survivor declares the attempt lost
        await cluster.kill(a)
        journal.gates["long"].set()
        lost = None
        async for frame in watcher:
            if isinstance(frame, TurnFailed) and frame.code is FailureCode.HOLDER_LOST:
                lost = frame
                break
        await watcher.aclose()
    # Then the frame the survivor wrote names the turn's trace
    assert lost is not None and lost.executed_by == a.node_id
    assert lost.retrying is (policy == "retry")
    assert lost.trace_id == CALLER_TRACE


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    yield provider, exported
    provider.shutdown()


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_one_trace_holds_the_submit_and_the_turn_spans_of_two_nodes(
    backend: str,
    journal: Journal,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
    request: pytest.FixtureRequest,
) -> None:
    provider, exported = exporter
    opener = ScriptedOpener(journal)
    if backend == "redis":
        make = functools.partial(LocalCluster.over_redis, request.getfixturevalue("redis_url"))
    else:
        make = LocalCluster
    async with make(2, opener=opener, tracer_provider=provider, **FAST) as cluster:
        a, b = cluster.nodes
        await (await a.submit(req("s1", "warm up"))).result
        exported.clear()
        # The caller's own span is the parent of the submit on B
        with provider.get_tracer("browser").start_as_current_span("click") as click:
            stream = await b.stream(req("s1", "one two"))
        frames = await _drain(stream)
        await stream.disposition.result
    spans = exported.get_finished_spans()
    caller = click.get_span_context()
    (submit,) = _by_name(spans, "stickless.submit")
    (forward,) = _by_name(spans, "stickless.forward")
    (turn,) = _by_name(spans, "stickless.turn")
    # One trace: the caller's click -> B's submit -> B's forward and A's turn
    assert {span.context.trace_id for span in (submit, forward, turn)} == {caller.trace_id}
    assert submit.parent is not None and submit.parent.span_id == caller.span_id
    assert forward.parent is not None and forward.parent.span_id == submit.context.span_id
    assert turn.parent is not None and turn.parent.span_id == submit.context.span_id
    assert turn.parent.is_remote
    assert submit.attributes is not None and turn.attributes is not None
    assert submit.attributes["stickless.node_id"] == b.node_id
    assert submit.attributes["stickless.submit_kind"] == "FORWARDED"
    assert turn.attributes["stickless.node_id"] == a.node_id
    assert turn.attributes["stickless.result"] == "completed"
    # And the frames name the turn's span
    assert {frame.trace_id for frame in frames} == {_hex(caller.trace_id, 32)}
    assert {frame.span_id for frame in frames} == {_hex(turn.context.span_id, 16)}


def test_a_broken_tracer_provider_costs_the_spans_never_the_turn() -> None:
    class Broken:
        def get_tracer(self, *args: object, **kwargs: object) -> object:
            raise RuntimeError("exporter down")

    parent = TraceContext.from_traceparent(TRACEPARENT)
    span = Tracing(Broken()).start("stickless.turn", parent, {})
    # Ids are still made (a child of the parent), and ending it is harmless
    assert span.context.trace_id == CALLER_TRACE and span.context.span_id != CALLER_SPAN
    span.end({"stickless.result": "completed"})


def test_a_submit_under_a_span_of_its_own_trace_hangs_under_that_span(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exported = exporter
    tracing = Tracing(provider)
    with provider.get_tracer("server").start_as_current_span("POST /turns") as server:
        ids = server.get_span_context()
        same = TraceContext(trace_id=_hex(ids.trace_id, 32), span_id=CALLER_SPAN)
        # The request's traceparent is of the server span's trace: the server span is closer
        tracing.start("in-same", same, {}, ambient=True).end()
        # A traceparent of another trace wins over the unrelated current span
        tracing.start(
            "in-other", TraceContext.from_traceparent(TRACEPARENT), {}, ambient=True
        ).end()
        # A turn never takes the current span (ambient is off): it is a root without a parent
        tracing.start("turn", None, {}).end()
    spans = exported.get_finished_spans()
    (in_same,) = _by_name(spans, "in-same")
    (in_other,) = _by_name(spans, "in-other")
    (turn,) = _by_name(spans, "turn")
    assert in_same.parent is not None and in_same.parent.span_id == ids.span_id
    assert not in_same.parent.is_remote
    assert in_other.parent is not None and _hex(in_other.parent.span_id, 16) == CALLER_SPAN
    assert _hex(in_other.context.trace_id, 32) == CALLER_TRACE
    assert turn.parent is None and turn.context.trace_id != ids.trace_id
